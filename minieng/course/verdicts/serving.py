"""Serving and its measurement: S9 (disaggregated prefill and decode), S15 (TTFT and TPOT from the
stream, not total latency) and the client's and engine's clocks agreeing (notebook 10).
"""

from __future__ import annotations

from minieng.course.claims import verdict
from minieng.course.verdicts.wording import FAILS, HOLDS


def s9_disaggregation(split_goodput: float, replicas_goodput: float, *, noise) -> str:
    """S9: goodput per device of separate prefill and decode engines against as many colocated
    replicas, on the same arrivals (a measured model on one machine)."""

    def judge(split_goodput, replicas_goodput):
        if split_goodput > replicas_goodput:
            return f"{HOLDS} in the model: {split_goodput / replicas_goodput:.2f}x the goodput per device"
        return f"{FAILS} at this load: {split_goodput / max(replicas_goodput, 1e-12):.2f}x the goodput per device"

    return verdict(judge, noise, split_goodput=split_goodput, replicas_goodput=replicas_goodput)


# S15: a single figure that misreads TPOT by this fraction, or TTFT by this factor, misleads.
MISREADS_TPOT = 0.2
MISREADS_TTFT_X = 2.0


def s15_total_latency(mean_ttft_s: float, mean_tpot_s: float, *, mean_output_tokens: float, noise) -> str:
    """S15: the mean of total latency / output tokens, the one number a stream-less client has,
    against the TPOT and TTFT the stream gives. With E2EL = TTFT + (n - 1) TPOT (docs/architecture.md section
    3), latency per token = (TTFT + (n - 1) TPOT) / n. Holds (the single number misleads) when it
    reads TPOT ``MISREADS_TPOT`` or more off, or TTFT ``MISREADS_TTFT_X`` or more off."""
    n = mean_output_tokens
    if n < 2:
        raise ValueError("s15_total_latency: needs requests of two output tokens or more (TPOT is undefined below)")

    def judge(mean_ttft_s, mean_tpot_s):
        per_token = (mean_ttft_s + (n - 1) * mean_tpot_s) / n
        tpot_off, ttft_off = per_token / mean_tpot_s - 1, mean_ttft_s / per_token
        said = (
            f"latency / tokens {per_token * 1e3:.1f} ms reads TPOT ({mean_tpot_s * 1e3:.1f} ms) {100 * abs(tpot_off):.0f}% "
            f"off and TTFT ({mean_ttft_s * 1e3:.0f} ms) {ttft_off:.1f}x off"
        )
        if abs(tpot_off) >= MISREADS_TPOT or ttft_off >= MISREADS_TTFT_X or ttft_off <= 1 / MISREADS_TTFT_X:
            return f"{HOLDS}: {said}"
        return f"{FAILS}: {said}: on this stream the one number is close to both"

    return verdict(judge, noise, mean_ttft_s=mean_ttft_s, mean_tpot_s=mean_tpot_s)


# Notebook 10's method row: the client's and the engine's TPOT of the same requests agree within
# this many milliseconds or this share of the engine's, whichever is larger.
CLOCKS_AGREE_MS, CLOCKS_AGREE_SHARE = 2.0, 0.1


def clocks_agree(client_tpot_ms: float, engine_tpot_ms: float) -> str:
    """Beyond the articles (notebook 10, method): a load generator's TPOT of a request is a
    difference of two times on the same path, so the HTTP path cancels and it agrees with the
    engine's own (``CLOCKS_AGREE_MS`` or ``CLOCKS_AGREE_SHARE``, whichever is larger). Both are
    measured on the same requests in the same run, so the machine's noise does not move one
    against the other."""
    gap = abs(client_tpot_ms - engine_tpot_ms)
    allowed = max(CLOCKS_AGREE_MS, CLOCKS_AGREE_SHARE * engine_tpot_ms)
    if gap <= allowed:
        return f"{HOLDS}: {gap:.1f} ms apart (within {allowed:.1f} ms)"
    return f"{FAILS}: the client's TPOT is {gap:.1f} ms off the engine's (more than {allowed:.1f} ms)"
