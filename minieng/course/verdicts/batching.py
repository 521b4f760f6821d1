"""Batching and scheduling: S6 (near-linear decode tok/s, continuous against static batching), S7
(chunked prefill), S10 (the goodput-optimal batch cap), S16 (a batch does not speed a compute-bound
prefill) and S21 (batching lifts decode MFU).
"""

from __future__ import annotations

import numpy as np

from minieng.course.claims import verdict
from minieng.course.verdicts.wording import FAILS, HOLDS, not_testable

# S6: "almost linear": aggregate decode tok/s at batch b at least this share of b x batch 1's.
NEAR_LINEAR = 0.7
NEAR_LINEAR_MIN_BATCH = 4


def s6_near_linear(tok_s: list[float], *, batch_sizes: list[int], noise) -> str:
    """S6: the largest batch up to which aggregate decode tok/s stays within ``NEAR_LINEAR`` of
    linear (``batch_sizes[0]`` must be 1, the rest ascending); holds when that is batch
    ``NEAR_LINEAR_MIN_BATCH`` or more. The first 12 points are judged (2^12 corners at most)."""
    if not batch_sizes or batch_sizes[0] != 1 or len(batch_sizes) != len(tok_s):
        raise ValueError("s6_near_linear: batch_sizes starts at 1 and gives one batch per tok/s")
    sizes = batch_sizes[:12]

    def judge(tok_s):
        up_to = 1
        for b, t in zip(sizes, tok_s):
            if t < NEAR_LINEAR * b * tok_s[0]:
                break
            up_to = b
        if up_to >= NEAR_LINEAR_MIN_BATCH:
            return f"{HOLDS} up to batch {up_to}"
        return f"{FAILS}: tok/s fell below {100 * NEAR_LINEAR:.0f}% of linear past batch {up_to}"

    return verdict(judge, noise, tok_s=list(tok_s)[:12])


def s6_continuous(
    cont_tok_s: float, static_tok_s: float, cont_e2el_s: float, static_e2el_s: float, *, noise, e2el_tail: str = "P99"
) -> str:
    """S6, the scheduler's half: on the same arrivals, continuous batching serves more tok/s and a
    lower tail E2EL than batching whole batches. ``e2el_tail`` names the tail figure given
    (``metrics.labeled_percentile``: "P99", or "max of 24" when too few requests support a P99)."""

    def judge(cont_tok_s, static_tok_s, cont_e2el_s, static_e2el_s):
        if cont_tok_s > static_tok_s and cont_e2el_s < static_e2el_s:
            return HOLDS
        return (
            f"{FAILS}: continuous {cont_tok_s / static_tok_s:.2f}x the tok/s, {cont_e2el_s / static_e2el_s:.2f}x "
            f"the E2EL ({e2el_tail})"
        )

    return verdict(
        judge,
        noise,
        cont_tok_s=cont_tok_s,
        static_tok_s=static_tok_s,
        cont_e2el_s=cont_e2el_s,
        static_e2el_s=static_e2el_s,
    )


def s7_chunked(reading: dict, gap_off_s: float, gap_on_s: float, ttft_off_s: float, ttft_on_s: float, *, noise) -> str:
    """S7: chunked prefill shortens the running decodes' worst gap at a small TTFT price
    (``lab.decode_protection_verdict`` on ``lab.read_result``'s reading, with the four timings moved by the noise)."""
    from minieng.lab import decode_protection_verdict  # the lesson's own reading of its run

    def judge(gap_off_s, gap_on_s, ttft_off_s, ttft_on_s):
        return decode_protection_verdict(
            reading | {"itl_protection_x": gap_off_s / gap_on_s, "ttft_price_x": ttft_on_s / ttft_off_s}
        )

    return verdict(judge, noise, gap_off_s=gap_off_s, gap_on_s=gap_on_s, ttft_off_s=ttft_off_s, ttft_on_s=ttft_on_s)


# S10: a P99 means something from this many requests a point (``metrics.percentile_label``).
P99_MIN_REQUESTS = 100


def s10_goodput_cap(
    tok_s: list[float],
    goodput_req_s: list[float],
    *,
    caps: list[int],
    noise,
    p99_s: list[float] | None = None,
    requests: int | list[int] | None = None,
    latency: str = "E2EL",
) -> str:
    """S10: over a batch-cap sweep (``caps``: ``max_num_seqs`` values), the cap with the most raw
    output tok/s and the cap with the most goodput under the SLO (requests meeting it per second).
    The goodput term holds when they differ: raw throughput picks a different batch than the SLO
    does. A tie in goodput goes to the cap with more tok/s (as ``lab.batch_cap_sweep`` marks it), so
    caps that serve every request within the SLO do not make the claim hold; a cap with no goodput
    among others is judged like any; with no goodput at any cap the SLO decides nothing: not testable.

    The P99 term (``p99_s``: each cap's P99 of ``latency`` in seconds; ``requests``: the requests a
    point, one count or one per cap): the most-tok/s cap bought its throughput with the tail, a P99
    worse than the most-goodput cap's; fails when it is not. A P99 needs ``P99_MIN_REQUESTS``
    requests a point: with fewer (or no ``requests``) the P99 term is not judged, and the verdict
    says so. At most six caps are judged (12 noisy figures), four with the P99 term."""
    if not len(caps) == len(tok_s) == len(goodput_req_s) or len(caps) < 2:
        raise ValueError("s10_goodput_cap: one tok/s and one goodput per cap, two caps at least")
    if len(caps) > 6:
        raise ValueError("s10_goodput_cap: at most six caps (each adds two noisy figures)")
    if not any(g > 0 for g in goodput_req_s):
        return not_testable("no request met the SLO under any cap: the objectives are out of this device's reach")
    counts = [requests] * len(caps) if requests is None or isinstance(requests, int) else list(requests)
    fewest = None if None in counts else min(counts)
    judged = p99_s is not None and fewest is not None and fewest >= P99_MIN_REQUESTS
    if judged and (len(p99_s) != len(caps) or len(caps) > 4):
        raise ValueError("s10_goodput_cap: one P99 per cap, and at most four caps with the P99 term")
    unjudged = ""
    if p99_s is not None and not judged:
        few = "the requests a point not given" if fewest is None else f"{fewest} requests a point"
        unjudged = f"; P99 not judged: {few}, a P99 needs {P99_MIN_REQUESTS}"

    def judge(tok_s, goodput_req_s, p99_s):
        i_tok = int(np.argmax(tok_s))
        i_good = max(range(len(caps)), key=lambda i: (goodput_req_s[i], tok_s[i]))
        if i_tok == i_good:
            return f"{FAILS}: cap {caps[i_tok]} gives both the most tok/s and the most goodput{unjudged}"
        said = f"the most tok/s at cap {caps[i_tok]}, the most goodput at cap {caps[i_good]}"
        if p99_s is None:
            return f"{HOLDS}: {said}{unjudged}"
        tail = f"P99 {latency} {p99_s[i_tok]:.2f} s against {p99_s[i_good]:.2f} s"
        if p99_s[i_tok] <= p99_s[i_good]:
            return f"{FAILS}: {said}, but {tail}: the tail did not pay for the throughput"
        return f"{HOLDS}: {said}, {tail}"

    return verdict(
        judge, noise, tok_s=list(tok_s), goodput_req_s=list(goodput_req_s), p99_s=list(p99_s) if judged else None
    )


# S16: past the ridge, more prompts in one step may lift prefill tok/s by at most this factor.
FLAT_X = 1.25


def s16_prefill_batch(tok_s: list[float], *, batch_sizes: list[int], noise) -> str:
    """S16: prefill tok/s of 1, 2, 4, ... prompts of one length (past the knee) run in one step.
    Holds when the largest batch lifts tok/s by less than ``FLAT_X`` over one prompt: a compute-bound
    phase has no idle FLOP/s for a batch to fill."""
    if not batch_sizes or batch_sizes[0] != 1 or len(batch_sizes) != len(tok_s):
        raise ValueError("s16_prefill_batch: batch_sizes starts at 1 and gives one batch per tok/s")

    def judge(tok_s):
        gain = max(tok_s) / tok_s[0]
        if gain < FLAT_X:
            return f"{HOLDS}: {batch_sizes[-1]} prompts at once move {gain:.2f}x the tokens per second of one"
        best = batch_sizes[int(np.argmax(tok_s))]
        return f"{FAILS}: {best} prompts at once moved {gain:.2f}x the tokens per second of one (not compute-bound)"

    return verdict(judge, noise, tok_s=list(tok_s)[:12])


SINGLE_DIGITS = 10.0


def s21_batched_mfu(mfu_batch1_percent: float, mfu_largest_percent: float, *, largest_batch: int, noise) -> str:
    """S21: decode MFU at batch 1 in single digits, at the sweep's largest batch out of them (10% or
    more). Fails either way: still single digits at the largest batch, or batch 1 already above."""

    def judge(mfu_batch1_percent, mfu_largest_percent):
        if mfu_batch1_percent >= SINGLE_DIGITS:
            return f"{FAILS}: batch-1 decode already used {mfu_batch1_percent:.0f}% (a low ridge point)"
        if mfu_largest_percent < SINGLE_DIGITS:
            return f"{FAILS}: {mfu_largest_percent:.1f}% at batch {largest_batch}, still single digits"
        return f"{HOLDS}: {mfu_batch1_percent:.1f}% at batch 1, {mfu_largest_percent:.0f}% at batch {largest_batch}"

    return verdict(judge, noise, mfu_batch1_percent=mfu_batch1_percent, mfu_largest_percent=mfu_largest_percent)
