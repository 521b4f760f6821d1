"""One verdict per claim of the source articles (S1-S21): what a notebook's closing table says.

Each function takes the figures a notebook measured and returns the verdict's wording: "holds ...",
"does not hold here: ...", "not testable here: ..." or, when the machine's timing noise could flip
it, "too noisy to judge here: ..." (``claims.verdict`` tries every figure at either end of its
noise band). Timings, and figures made of one timing (tok/s, MFU, MBU), are the noisy arguments;
counts (tokens, FLOPs, bytes, hit rates) are keyword-only and exact. ``noise`` is a
``ceilings.Noise``, its ``relative`` figure, or None (judged as measured): the noise of the run
that measured the figures (``kit.cached(...).noise``), not today's.

Every verdict can fail: ``tests/course/test_claim_verdicts.py`` feeds each figures under which its
claim does not hold, and figures inside the noise band, and names the claim's id.
Thresholds are stated where they are set; the articles' figures come from ``claims.ARTICLE_CLAIMS``.
"""

from __future__ import annotations

import math

import numpy as np

from minieng.course.claims import TOO_NOISY, verdict

HOLDS = "holds"
FAILS = "does not hold here"

# S1: below this ratio the two phases are not two regimes; below 1/ROOFLINE_SHORTFALL_X of the roofline's
# prediction the measurement is not the physics the roofline describes (overhead, a cold run).
REGIME_X = 2.0
ROOFLINE_SHORTFALL_X = 4.0


def s1_physics(prefill_tok_s: float, decode_tok_s: float, *, predicted_ratio: float, noise) -> str:
    """S1, one request's physics: the best prefill tok/s of one request against batch-1 decode tok/s,
    judged against the ratio the roofline predicts for this device (``predicted_ratio``: the prefill
    floor's tok/s over the decode floor's, ``measure.roofline.phase_ratio_floor``). Holds when the
    measured ratio is at least ``REGIME_X`` and within ``ROOFLINE_SHORTFALL_X`` of the prediction."""

    def judge(prefill_tok_s, decode_tok_s):
        ratio = prefill_tok_s / decode_tok_s
        if ratio < REGIME_X:
            return f"{FAILS}: prefill only {ratio:.1f}x batch-1 decode, one regime"
        if ratio < predicted_ratio / ROOFLINE_SHORTFALL_X:
            return (
                f"{FAILS}: {ratio:.0f}x, under a quarter of the {predicted_ratio:.0f}x the roofline predicts here "
                "(a phase far from its floor: overhead)"
            )
        return f"{HOLDS}: {ratio:.0f}x here, the roofline predicts {predicted_ratio:.0f}x for this device"

    return verdict(judge, noise, prefill_tok_s=prefill_tok_s, decode_tok_s=decode_tok_s)


# S1 as vLLM logs it: a logged ratio that moves by at least this factor with the load is a property of it.
LOAD_MOVES_X = 2.0


def s1_logged_ratio(logged_ratios: list[float], *, noise) -> str:
    """S1 as vLLM's log reads it: ``logged_ratios`` are the logged prompt / generation throughput of
    the same engine under different loads (cache-hit share, running requests). The article's 136x is
    a property of the load when the ratio moves by ``LOAD_MOVES_X`` or more across them."""
    if len(logged_ratios) < 2:
        raise ValueError("s1_logged_ratio: give the logged ratio of at least two loads")

    def judge(logged_ratios):
        low, high = min(logged_ratios), max(logged_ratios)
        if high < LOAD_MOVES_X * low:
            return f"{FAILS}: the logged ratio stayed within {high / low:.1f}x across the loads"
        return f"{HOLDS}: the same engine logged {low:.0f}x to {high:.0f}x: the ratio follows the load"

    return verdict(judge, noise, logged_ratios=list(logged_ratios)[:12])


# S2: the fit must find an n^2 share of TTFT at least this fraction of attention's FLOP share.
QUADRATIC_FOUND = 1 / 3
ATTENTION_SMALL = 0.10  # below this FLOP share, the n^2 term is too small for a fit to be asked for


def s2_quadratic(
    quadratic_share: float | None,
    *,
    attention_share: float,
    prompt_tokens: int,
    noise,
    unphysical_fit: str | None = None,
) -> str:
    """S2: the fitted n² share of TTFT at the longest prompt (``fit_ttft``'s ``quadratic_share``; None
    or 0 when the fit found no significant n² term) against attention's share of that prefill's
    FLOPs (``prefill_work``: 4·heads·head_dim per key per layer, docs/architecture.md section 4). Fails when the
    formula says attention takes a real share (``ATTENTION_SMALL`` or more) and the timings find
    less than ``QUADRATIC_FOUND`` of it. ``unphysical_fit``: ``fit_ttft``'s reason when its fit bent
    up only with a negative cost (``physical`` False): the timings cannot judge the claim."""
    if unphysical_fit:
        return f"{TOO_NOISY}: {unphysical_fit}"

    def judge(quadratic_share):
        share = quadratic_share or 0.0
        if attention_share < ATTENTION_SMALL:
            return (
                f"{HOLDS} (linear regime): attention is {100 * attention_share:.0f}% of the FLOPs at "
                f"{prompt_tokens:,} tokens; the n² share of TTFT is {100 * share:.0f}%: long context not reached"
            )
        if share < QUADRATIC_FOUND * attention_share:
            return (
                f"{FAILS}: the formula puts attention at {100 * attention_share:.0f}% of the FLOPs at "
                f"{prompt_tokens:,} tokens, the timings find an n² share of {100 * share:.0f}%"
            )
        return (
            f"{HOLDS}: n² is {100 * share:.0f}% of TTFT at {prompt_tokens:,} tokens, attention "
            f"{100 * attention_share:.0f}% of the FLOPs"
        )

    return verdict(judge, noise, quadratic_share=quadratic_share or 0.0)


def s3_floor(tpot_s: float, *, floor_s: float, noise, note: str = "") -> str:
    """S3: no decode step beats bytes read / bandwidth (``tpot_floor_s``). Fails when the measured
    TPOT is under the floor: a wrong byte count or a ceiling measured low. ``note`` is appended to
    a verdict that holds (why the step sits above its floor)."""

    def judge(tpot_s):
        if tpot_s < floor_s:
            return f"{FAILS}: TPOT beat the bytes / bandwidth floor (check the bandwidth ceiling)"
        return f"{HOLDS}: no step beat the floor" + (f"; {note}" if note else "")

    return verdict(judge, noise, tpot_s=tpot_s)


# S3 through quantization (notebook 08): a TPOT ratio this far above the bytes ratio is the step's
# per-op overhead showing; this far below it, faster than the bytes allow (suspect).
BYTES_OVERHEAD_X = 1.3
BYTES_SUSPECT_X = 0.9
SUSPECT = "suspect"


def _ratio_noise(noise):
    """The relative noise of a ratio of two timings, each within ``1 + noise``: (1 + noise)^2 - 1."""
    relative = getattr(noise, "relative", noise)
    return None if relative is None else (1 + relative) ** 2 - 1


def s3_bytes_ratio(tpot_ratio: float, *, bytes_ratio: float, scheme: str, noise) -> str:
    """S3 through quantization: if a decode step costs its bytes / bandwidth (TPOT_min, docs/architecture.md
    section 4), a scheme's batch-1 TPOT over the float model's (``tpot_ratio``, measured within
    rounds) follows the ratio of their decode steps' bytes (``bytes_ratio``, counted:
    ``flops_bytes.decode_work`` with the scheme's ``matmul_bytes``; exact).

    Four verdicts: holds (within ``BYTES_OVERHEAD_X`` above the bytes); holds above the bytes
    (per-op overhead: the part of a step that is not reading weights, which no byte saving
    removes); suspect (under ``BYTES_SUSPECT_X`` of the bytes: faster than the bytes allow, so the
    float run was likely slowed by another job); does not hold (no faster than the float model).
    ``tpot_ratio`` is a ratio of two timings: judged within (1 + noise)^2. The two "holds" say the
    same to the noise check: only a flip to another verdict reads "too noisy"."""

    def category(tpot_ratio):
        if tpot_ratio >= 1:
            return FAILS
        return SUSPECT if tpot_ratio < BYTES_SUSPECT_X * bytes_ratio else HOLDS

    def wording(tpot_ratio):
        said = category(tpot_ratio)
        figures = f"{scheme}: TPOT {tpot_ratio:.2f}x the float model's for {bytes_ratio:.2f}x its bytes"
        if said == FAILS:
            return f"{FAILS}: {figures}: fewer bytes, no faster decode"
        if said == SUSPECT:
            return f"{SUSPECT}: {figures}, faster than the bytes allow (was the float run slowed by another job?)"
        if tpot_ratio > BYTES_OVERHEAD_X * bytes_ratio:
            return f"{HOLDS} above the bytes: {figures}; the rest is per-op overhead"
        return f"{HOLDS}: {figures}"

    face = category(tpot_ratio)
    said = verdict(category, _ratio_noise(noise), tpot_ratio=tpot_ratio)
    full = wording(tpot_ratio)
    return full if said == face else said.replace(f"(at face value: {face})", f"(at face value: {full})")


def s4_tensor_parallel(speedup_x: float, *, two_devices: bool, noise) -> str:
    """S4: two ranks' batch-1 step against one rank's (``speedup_x`` = one rank's time / two's).
    Holds when faster, and less than 2x (the link costs). ``two_devices``: two GPUs; else two
    processes on one CPU, which share one memory bus."""

    def judge(speedup_x):
        if speedup_x >= 2:
            return f"{FAILS}: {speedup_x:.2f}x, more than two devices' bandwidth (check the timing)"
        if speedup_x > 1:
            return f"{HOLDS}: {speedup_x:.2f}x, less than 2x"
        why = "the all-reduces cost more than the split saves" if two_devices else "the ranks share one memory bus"
        return f"{FAILS}: {speedup_x:.2f}x, {why}"

    return verdict(judge, noise, speedup_x=speedup_x)


# Beyond the articles (notebook 03): the KV read must add at least this factor to the floor to be timed,
# and the measured TPOT must grow by at least KV_FOLLOWS of the floor's growth.
KV_VISIBLE_X = 1.2
KV_FOLLOWS = 0.5


def kv_joins_weights(
    tpot_first_s: float, tpot_last_s: float, *, floor_first_s: float, floor_last_s: float, limit_first: str, noise
) -> str:
    """Beyond the articles: the KV cache's bytes join the weights' as the context grows, so TPOT
    grows with them. ``tpot_*``: the measured TPOT at the sweep's shortest and longest context;
    ``floor_*``: bytes / bandwidth there (computed); ``limit_first``: what bounds the shortest
    context's step (``roofline_bound``). Not testable when the floor grew less than
    ``KV_VISIBLE_X``; holds when TPOT grew by at least ``KV_FOLLOWS`` of the floor's growth."""
    floor_grew = floor_last_s / floor_first_s
    if floor_grew < KV_VISIBLE_X:
        return f"not testable here: the sweep's KV added only {100 * (floor_grew - 1):.0f}% to the floor"

    def judge(tpot_first_s, tpot_last_s):
        grew = tpot_last_s / tpot_first_s
        if grew - 1 >= KV_FOLLOWS * (floor_grew - 1):
            return f"{HOLDS}: TPOT grew {grew:.2f}x where the floor grew {floor_grew:.2f}x"
        why = "the step is limited by overhead" if limit_first == "overhead" else "TPOT barely moved"
        return f"{FAILS}: TPOT grew {grew:.2f}x where the floor grew {floor_grew:.2f}x: {why}"

    return verdict(judge, noise, tpot_first_s=tpot_first_s, tpot_last_s=tpot_last_s)


# S5: TTFT at the middle hit rate must sit on the line the uncached tokens draw within this factor.
ON_THE_LINE_X = 1.5
CACHE_SAVES_X = 1.2  # the cold TTFT over the best-hit TTFT below which the cache saved nothing worth judging


def s5_hit_rate(
    ttft_near_s: float,
    ttft_high_s: float,
    ttft_cold_s: float,
    *,
    uncached_near: int,
    uncached_high: int,
    uncached_cold: int,
    noise,
) -> str:
    """S5: TTFT follows the tokens the cache leaves to compute. ``ttft_high_s`` at the highest hit
    rate, ``ttft_near_s`` at a lower one (the article's 97% and 85.5%), ``ttft_cold_s`` with nothing
    cached; ``uncached_*`` the prompt tokens computed at each (counts). A TTFT linear in the uncached
    tokens through the cold and the high point predicts the near one; holds when the measurement is
    within ``ON_THE_LINE_X`` of it and the cache saved at least ``CACHE_SAVES_X``."""
    if not uncached_cold > uncached_high:
        raise ValueError("s5_hit_rate: the cold run must compute more tokens than the best-hit one")

    def judge(ttft_near_s, ttft_high_s, ttft_cold_s):
        if ttft_cold_s < CACHE_SAVES_X * ttft_high_s:
            return f"{FAILS}: the cache saved little (cold {ttft_cold_s * 1e3:.0f} ms, best hit {ttft_high_s * 1e3:.0f} ms)"
        per_token = (ttft_cold_s - ttft_high_s) / (uncached_cold - uncached_high)
        predicted = ttft_high_s + per_token * (uncached_near - uncached_high)
        measured_x, predicted_x = ttft_near_s / ttft_high_s, predicted / ttft_high_s
        if not 1 / ON_THE_LINE_X <= ttft_near_s / predicted <= ON_THE_LINE_X:
            return (
                f"{FAILS}: TTFT {measured_x:.1f}x the best hit's, the uncached tokens predict {predicted_x:.1f}x: "
                "TTFT does not follow them"
            )
        return f"{HOLDS}: TTFT {measured_x:.1f}x the best hit's, the uncached tokens predict {predicted_x:.1f}x"

    return verdict(judge, noise, ttft_near_s=ttft_near_s, ttft_high_s=ttft_high_s, ttft_cold_s=ttft_cold_s)


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


def s8_speculative(speedup_x: float, *, tokens_per_step: float, noise) -> str:
    """S8: speculative decoding emits ``tokens_per_step`` > 1 per target step (a count) and, to
    amortize the weight read, a measured speedup over plain decoding above 1."""

    def judge(speedup_x):
        if tokens_per_step <= 1:
            return f"{FAILS}: {tokens_per_step:.2f} tokens per target step, no read amortized"
        if speedup_x <= 1:
            return (
                f"{FAILS}: {tokens_per_step:.2f} tokens per step, but {speedup_x:.2f}x: the draft and verify cost more"
            )
        return f"{HOLDS}: {tokens_per_step:.2f} tokens per step, {speedup_x:.2f}x"

    return verdict(judge, noise, speedup_x=speedup_x)


def s9_disaggregation(split_goodput: float, replicas_goodput: float, *, noise) -> str:
    """S9: goodput per device of separate prefill and decode engines against as many colocated
    replicas, on the same arrivals (a measured model on one machine)."""

    def judge(split_goodput, replicas_goodput):
        if split_goodput > replicas_goodput:
            return f"{HOLDS} in the model: {split_goodput / replicas_goodput:.2f}x the goodput per device"
        return f"{FAILS} at this load: {split_goodput / max(replicas_goodput, 1e-12):.2f}x the goodput per device"

    return verdict(judge, noise, split_goodput=split_goodput, replicas_goodput=replicas_goodput)


def s10_goodput_cap(tok_s: list[float], goodput_req_s: list[float], *, caps: list[int], noise) -> str:
    """S10: over a batch-cap sweep (``caps``: ``max_num_seqs`` values), the cap with the most raw
    output tok/s and the cap with the most goodput under the SLO (requests meeting it per second).
    Holds when they differ: raw throughput picks a different batch than the SLO does. A tie in
    goodput goes to the cap with more tok/s (as ``lab.batch_cap_sweep`` marks it), so caps that
    serve every request within the SLO do not make the claim hold; with no goodput at any cap the
    SLO decides nothing: not testable. At most six caps are judged (12 noisy figures)."""
    if not len(caps) == len(tok_s) == len(goodput_req_s) or len(caps) < 2:
        raise ValueError("s10_goodput_cap: one tok/s and one goodput per cap, two caps at least")
    if len(caps) > 6:
        raise ValueError("s10_goodput_cap: at most six caps (each adds two noisy figures)")
    if not any(g > 0 for g in goodput_req_s):
        return not_testable("no request met the SLO under any cap: the objectives are out of this device's reach")

    def judge(tok_s, goodput_req_s):
        most_tok_s = caps[int(np.argmax(tok_s))]
        most_good = caps[max(range(len(caps)), key=lambda i: (goodput_req_s[i], tok_s[i]))]
        if most_tok_s == most_good:
            return f"{FAILS}: cap {most_tok_s} gives both the most tok/s and the most goodput"
        return f"{HOLDS}: the most tok/s at cap {most_tok_s}, the most goodput at cap {most_good}"

    return verdict(judge, noise, tok_s=list(tok_s), goodput_req_s=list(goodput_req_s))


# S11: the article's ranges, against datasheet peaks.
PREFILL_MFU_RANGE = (40.0, 60.0)
DECODE_MFU_MAX = 5.0


def _against(mfu_datasheet, mfu_measured):
    if mfu_datasheet is not None:
        return mfu_datasheet, "datasheet"
    return mfu_measured, "measured ceiling (no datasheet for this device)"


SUSPECT = (
    "not testable here: MFU above 100% of the peak it is judged on: a wrong count, or a ceiling measured low "
    "(measured while other work shared the machine)"
)


def s11_prefill_mfu(
    mfu_datasheet_percent: float | None,
    mfu_measured_percent: float,
    *,
    noise,
    suspect: bool = False,
    limit: str | None = None,
) -> str:
    """S11, prefill: MFU in the article's 40-60%. Judged against the datasheet peak where the device
    has one (the article's MFU is against datasheet peaks), else against the measured matmul
    ceiling, and said so. Pass MFUs in percent. ``suspect``: the MFU is above 100% of the peak it is
    judged on (``phase_utilization``'s flag for that peak): no verdict. ``limit``: what bounds the step
    (``roofline_bound``'s "compute", "memory" or "overhead"); an overhead-bound prefill below the
    range says so."""
    if suspect:
        return SUSPECT

    def judge(mfu_datasheet_percent, mfu_measured_percent):
        mfu, peak = _against(mfu_datasheet_percent, mfu_measured_percent)
        low, high = PREFILL_MFU_RANGE
        if low <= mfu <= high:
            return f"{HOLDS}: {mfu:.0f}% of the {peak}"
        side = "above" if mfu > high else "below"
        why = (
            "; limited by overhead: this model is too small to fill this device"
            if side == "below" and limit == "overhead"
            else ""
        )
        return f"{FAILS}: {mfu:.0f}% of the {peak}, {side} the article's {low:.0f}-{high:.0f}%{why}"

    return verdict(judge, noise, mfu_datasheet_percent=mfu_datasheet_percent, mfu_measured_percent=mfu_measured_percent)


def s11_decode_mfu(
    mfu_datasheet_percent: float | None, mfu_measured_percent: float, *, noise, suspect: bool = False
) -> str:
    """S11, decode: batch-1 MFU under the article's 5%, against the datasheet where known (see
    ``s11_prefill_mfu``; ``suspect`` likewise)."""
    if suspect:
        return SUSPECT

    def judge(mfu_datasheet_percent, mfu_measured_percent):
        mfu, peak = _against(mfu_datasheet_percent, mfu_measured_percent)
        if mfu < DECODE_MFU_MAX:
            return f"{HOLDS}: {mfu:.1f}% of the {peak}"
        return f"{FAILS}: {mfu:.1f}% of the {peak} (a low ridge point lets decode use more of the peak)"

    return verdict(judge, noise, mfu_datasheet_percent=mfu_datasheet_percent, mfu_measured_percent=mfu_measured_percent)


UTIL_RANGE = (4.0, 6.0)


def s12_utilization(util_gpu_percent: float | None, *, mfu_percent: float | None) -> str:
    """S12: NVML's util.gpu during batch-1 decode reads the article's 4-6%. util.gpu is the share
    of time a kernel ran, a sampled count, not a timing: no noise check. None: no NVML here."""
    if util_gpu_percent is None:
        return "not testable here: no NVIDIA GPU (NVML reads nothing); the low figure here is MFU"
    low, high = UTIL_RANGE
    if low <= util_gpu_percent <= high:
        return f"{HOLDS}: util.gpu {util_gpu_percent:.0f}%"
    mfu = "" if mfu_percent is None else f", MFU {mfu_percent:.1f}%"
    return f"{FAILS}: util.gpu {util_gpu_percent:.0f}% counts busy time{mfu}: the low figure is MFU"


def s13_roofline_split(*, prefill_intensity: float, decode_intensity: float, ridge: float, noise) -> str:
    """S13 on the roofline: prefill's arithmetic intensity (FLOP/byte, counted) right of the ridge
    (the measured peak / bandwidth: noisy), batch-1 decode's left of it."""

    def judge(ridge):
        if prefill_intensity > ridge > decode_intensity:
            return f"{HOLDS}: prefill {prefill_intensity:.0f}, decode {decode_intensity:.2f}, ridge {ridge:.1f} FLOP/B"
        return f"{FAILS}: ridge {ridge:.1f} FLOP/B does not split prefill ({prefill_intensity:.0f}) from decode"

    return verdict(judge, noise, ridge=ridge)


QUANT_ASYMMETRY_X = 1.5


def s13_quantization(ttft_ratio: float, tpot_ratio: float, *, noise) -> str:
    """S13, quantization: a scheme's TTFT and TPOT as ratios to the float model's. Holds when it
    cuts decode time at least ``QUANT_ASYMMETRY_X`` times more than prefill time
    (ttft_ratio / tpot_ratio >= 1.5)."""

    def judge(ttft_ratio, tpot_ratio):
        if ttft_ratio / tpot_ratio >= QUANT_ASYMMETRY_X:
            return f"{HOLDS}: decode {1 / tpot_ratio:.2f}x faster, prefill {1 / ttft_ratio:.2f}x"
        return f"{FAILS}: decode {1 / tpot_ratio:.2f}x faster, prefill {1 / ttft_ratio:.2f}x: no asymmetry"

    return verdict(judge, noise, ttft_ratio=ttft_ratio, tpot_ratio=tpot_ratio)


# -- beyond the articles: the engine's own claims (notebooks 08 and 09) -----------------------------

# W8A8 amplifies float noise when the same nudge moves its logits this many times the float model's:
# three orders of magnitude. On a 2-core AMD EPYC a 1e-6 nudge moved the default model's logits by
# 7e-5 in float32, 0.017 with int8 (activations in two int8 digits: ~240x) and 3.7 with W8A8 (~50,000x).
AMPLIFY_X = 1000.0


def amplifies_float_noise(
    max_dlogit: float,
    float_max_dlogit: float,
    *,
    flips: int,
    positions: int,
    requests_changed: int,
    requests: int,
    scheme: str = "w8a8",
) -> str:
    """Beyond the articles (notebook 08): ``scheme`` amplifies float noise. ``max_dlogit`` and
    ``float_max_dlogit``: the largest logit change the same relative nudge of the input embeddings
    caused in the scheme and in the float model (``quant_quality.noise_sensitivity``); ``flips``
    of ``positions``: the scheme's greedy choices it flipped; ``requests_changed`` of
    ``requests``: the scheme's requests whose greedy tokens differed together and alone
    (``quant_quality.batched_vs_alone``). Deterministic figures, not timings: no noise band.
    Holds when the scheme's shift is at least ``AMPLIFY_X`` times the float model's."""
    if max_dlogit <= 0:
        return f"{FAILS}: the nudge did not move {scheme}'s logits"
    ratio = max_dlogit / float_max_dlogit if float_max_dlogit > 0 else math.inf
    times = "the float model's did not move" if math.isinf(ratio) else f"{ratio:,.0f}x the float model's"
    if ratio < AMPLIFY_X:
        return f"{FAILS}: the same nudge moved {scheme}'s logits {times}, under {AMPLIFY_X:.0f}x"
    tokens = (
        f"{flips} of {positions} greedy choices flipped, {requests_changed} of {requests} requests changed "
        "together vs alone"
    )
    if flips == 0 and requests_changed == 0:
        return f"{HOLDS} in the logits ({times}); no greedy token changed in this sample"
    return f"{HOLDS}: logits moved {times}; {tokens}"


def w8a8_prefill(w8a8_ttft_ratio: float, weight_only_ttft_ratio: float, *, weight_only: str, noise) -> str:
    """Beyond the articles (notebook 08): W8A8 speeds prefill too, since its products run in integer
    arithmetic while a weight-only scheme's keep the float dtype's. Both figures are TTFT ratios
    to the float model's (each judged within the noise; their quotient gets both bands). Holds
    when W8A8's prefill is faster than the float model's and than ``weight_only``'s."""

    def judge(w8a8_ttft_ratio, weight_only_ttft_ratio):
        figures = f"TTFT {w8a8_ttft_ratio:.2f}x the float model's, {weight_only} {weight_only_ttft_ratio:.2f}x"
        if w8a8_ttft_ratio < 1 and w8a8_ttft_ratio < weight_only_ttft_ratio:
            return f"{HOLDS}: {figures}"
        return f"{FAILS}: {figures}: the integer products did not speed prefill"

    return verdict(
        judge, _ratio_noise(noise), w8a8_ttft_ratio=w8a8_ttft_ratio, weight_only_ttft_ratio=weight_only_ttft_ratio
    )


def outliers_price(per_token: dict, per_tensor: dict) -> str:
    """Beyond the articles (notebook 08): activation outliers are W8A8's price, so one activation
    scale per tensor (the outliers set it for every token) costs more accuracy than one per token.
    ``per_token`` and ``per_tensor``: ``quant_quality.quality``'s figures of the two simulated
    variants (``agreement``: fraction of greedy choices kept; ``kl_nats``: mean KL from the float
    model). Counts, not timings: no noise band. Holds when per tensor agrees no better and
    diverges more (higher KL) than per token."""
    figures = (
        f"per token {per_token['agreement']:.1%} agreement, KL {per_token['kl_nats']:.3f} nats; per tensor "
        f"{per_tensor['agreement']:.1%}, KL {per_tensor['kl_nats']:.3f}"
    )
    if per_tensor["agreement"] <= per_token["agreement"] and per_tensor["kl_nats"] > per_token["kl_nats"]:
        return f"{HOLDS}: {figures}"
    return f"{FAILS}: {figures}: one scale per tensor cost no more here"


# The engine's quantization target: at most this batch-1 TPOT (a ratio to float) at this greedy agreement.
TARGET_TPOT_X = 0.5
TARGET_AGREEMENT = 0.9


def quantization_target(tpot_ratio: float | None, *, agreement: float | None, scheme: str | None, noise) -> str:
    """The engine's own target (notebook 08): a scheme at ``TARGET_TPOT_X`` or less of the float
    model's batch-1 TPOT with at least ``TARGET_AGREEMENT`` greedy agreement. ``tpot_ratio`` and
    ``agreement`` are the fastest such scheme's (``scheme``), or None when no scheme reached the
    agreement. ``tpot_ratio`` is a ratio of two timings: judged within (1 + noise)^2."""
    if scheme is None or tpot_ratio is None:
        return f"{FAILS}: no scheme reached {TARGET_AGREEMENT:.0%} greedy agreement"

    def judge(tpot_ratio):
        figures = f"{scheme}: TPOT {tpot_ratio:.2f}x the float model's at {agreement:.1%} agreement"
        if tpot_ratio <= TARGET_TPOT_X:
            return f"{HOLDS}: {figures}"
        return f"{FAILS}: {figures}, above {TARGET_TPOT_X}x"

    return verdict(judge, _ratio_noise(noise), tpot_ratio=tpot_ratio)


def greedy_lossless(spec_token_ids: list[int], plain_token_ids: list[int], *, dtype: str) -> str:
    """Beyond the articles (notebook 09): greedy speculative decoding emits the target's own greedy
    tokens (docs/architecture.md section 7: token for token in float32). ``dtype``: the target's; in a coarser
    one the verification's k + 1 rows round differently from a one-token step, so a near-tie may
    break the other way, and the verdict says so. Tokens, not timings: no noise band."""
    if spec_token_ids == plain_token_ids:
        return f"{HOLDS}: all {len(plain_token_ids)} tokens identical"
    first = next((i for i, (a, b) in enumerate(zip(spec_token_ids, plain_token_ids)) if a != b), None)
    first = min(len(spec_token_ids), len(plain_token_ids)) if first is None else first
    if dtype == "float32":
        why = " (in float32 only a near-tie within rounding could excuse it)"
    else:
        why = f" (in {dtype} a k + 1-token verification rounds unlike a one-token step: a near-tie may flip)"
    return f"{FAILS}: the outputs part at token {first} of {len(plain_token_ids)}{why}"


# S14: a phase's time must grow this much more with its own length than the other phase's does.
OWN_LENGTH_X = 2.0


def s14_slopes(
    ttft_short_s: float,
    ttft_long_prompt_s: float,
    ttft_long_output_s: float,
    decode_short_s: float,
    decode_long_prompt_s: float,
    decode_long_output_s: float,
    *,
    noise,
) -> str:
    """S14: three requests, (short prompt, short answer), (long prompt, short answer), (short
    prompt, long answer), each timed as TTFT and decode time (E2EL - TTFT). Growing the prompt must
    grow TTFT at least ``OWN_LENGTH_X`` times, and ``OWN_LENGTH_X`` times more (as a ratio) than it
    grows the decode time; growing the answer must do the same for the decode time against TTFT."""

    def judge(
        ttft_short_s, ttft_long_prompt_s, ttft_long_output_s, decode_short_s, decode_long_prompt_s, decode_long_output_s
    ):
        prompt_ttft, prompt_decode = ttft_long_prompt_s / ttft_short_s, decode_long_prompt_s / decode_short_s
        output_decode, output_ttft = decode_long_output_s / decode_short_s, ttft_long_output_s / ttft_short_s
        said = (
            f"longer prompt: TTFT x{prompt_ttft:.1f}, decode x{prompt_decode:.1f}; "
            f"longer answer: decode x{output_decode:.1f}, TTFT x{output_ttft:.1f}"
        )
        own = min(prompt_ttft, output_decode) >= OWN_LENGTH_X  # each phase grew with its own length
        if own and prompt_ttft >= OWN_LENGTH_X * prompt_decode and output_decode >= OWN_LENGTH_X * output_ttft:
            return f"{HOLDS}: {said}"
        return f"{FAILS}: {said}"

    return verdict(
        judge,
        noise,
        ttft_short_s=ttft_short_s,
        ttft_long_prompt_s=ttft_long_prompt_s,
        ttft_long_output_s=ttft_long_output_s,
        decode_short_s=decode_short_s,
        decode_long_prompt_s=decode_long_prompt_s,
        decode_long_output_s=decode_long_output_s,
    )


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


# S17: prefill must gain this many times more than decode from the extra FLOP/s.
PHASE_GAIN_X = 1.2


def s17_flops_knob(
    ttft_few_s: float,
    ttft_many_s: float,
    tpot_few_s: float,
    tpot_many_s: float,
    *,
    noise,
    flops_few: float | None = None,
    flops_many: float | None = None,
    bandwidth_few: float | None = None,
    bandwidth_many: float | None = None,
) -> str:
    """S17: the same model with fewer and with more FLOP/s (on a CPU, 1 thread against all: the
    matmul ceiling multiplies, the copy bandwidth barely moves). Holds when the extra FLOP/s made
    prefill faster (TTFT few / many above 1) and prefill's speed-up is at least ``PHASE_GAIN_X``
    times decode's (TPOT few / many).

    ``flops_*`` and ``bandwidth_*`` (optional, measured: FLOP/s and bytes/s of the two settings'
    ceilings) check the knob itself: when it did not raise the FLOP/s ``PHASE_GAIN_X`` times more
    than the bandwidth, the run cannot tell the phases apart and the claim is not testable there
    (a machine so busy that more threads only fight for the cores)."""

    def judge(ttft_few_s, ttft_many_s, tpot_few_s, tpot_many_s, flops_few, flops_many, bandwidth_few, bandwidth_many):
        if None not in (flops_few, flops_many, bandwidth_few, bandwidth_many):
            flops_x, bandwidth_x = flops_many / flops_few, bandwidth_many / bandwidth_few
            if flops_x < PHASE_GAIN_X * bandwidth_x:
                return (
                    f"not testable here: the knob moved the FLOP/s {flops_x:.2f}x and the bandwidth "
                    f"{bandwidth_x:.2f}x, not more compute than bandwidth"
                )
        prefill_x, decode_x = ttft_few_s / ttft_many_s, tpot_few_s / tpot_many_s
        said = f"prefill {prefill_x:.2f}x faster, decode {decode_x:.2f}x"
        if prefill_x <= 1:
            return f"{FAILS}: {said}: more FLOP/s did not speed prefill"
        if prefill_x >= PHASE_GAIN_X * decode_x:
            return f"{HOLDS}: {said}"
        return f"{FAILS}: {said}"

    return verdict(
        judge,
        noise,
        ttft_few_s=ttft_few_s,
        ttft_many_s=ttft_many_s,
        tpot_few_s=tpot_few_s,
        tpot_many_s=tpot_many_s,
        flops_few=flops_few,
        flops_many=flops_many,
        bandwidth_few=bandwidth_few,
        bandwidth_many=bandwidth_many,
    )


def s18_idler(peak_tflops: list[float], decode_mfu_percent: list[float]) -> str:
    """S18: across devices, batch-1 decode MFU against peak FLOP/s (projected from the reader's
    measured MBU onto datasheets: computed, not timed). Holds when the rank correlation is negative:
    the more FLOP/s a device has, the smaller the share batch-1 decode uses."""
    if len(peak_tflops) != len(decode_mfu_percent) or len(peak_tflops) < 3:
        raise ValueError("s18_idler: one decode MFU per device, three devices at least")
    rho = _spearman(peak_tflops, decode_mfu_percent)
    if rho < 0:
        return f"{HOLDS}: rank correlation {rho:.2f} between peak FLOP/s and batch-1 decode MFU"
    return f"{FAILS}: rank correlation {rho:+.2f}: decode MFU does not fall with peak FLOP/s"


def _spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (ties take their mean rank), 0 where a side is constant."""

    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = v.argsort()
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):  # ties: mean rank
            r[v == value] = r[v == value].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


def s19_cheapest(ttft_s: dict[str, tuple[float, float]], *, extra_flops: dict[str, float], noise) -> str:
    """S19: prefix caching is the cheapest lever on TTFT. ``ttft_s``: per lever (key "prefix caching"
    required), ``(TTFT without it, TTFT with it)`` in seconds on the same prompt (``lab.ttft_levers``):
    the two timings, not their difference, so that each gets its noise (a small saving is the
    difference of two large timings). ``extra_flops``: the FLOPs it adds to that request's first
    token (counted; prefix caching's is negative, it skips work). Holds when prefix caching saves the
    most TTFT of them and adds no FLOPs. At most six levers (12 timings)."""
    if "prefix caching" not in ttft_s or len(ttft_s) < 2:
        raise ValueError('s19_cheapest: give "prefix caching" and at least one other lever')
    names = list(ttft_s)

    def judge(without, with_):
        by_lever = {n: w - t for n, w, t in zip(names, without, with_)}
        best = max(by_lever, key=by_lever.get)
        if extra_flops.get("prefix caching", 0) > 0:
            return f"{FAILS}: prefix caching added compute here"
        if best != "prefix caching":
            return f"{FAILS}: {best} saved more TTFT ({by_lever[best] * 1e3:.0f} ms)"
        return f"{HOLDS}: it saved {by_lever[best] * 1e3:.0f} ms of TTFT while computing less"

    return verdict(judge, noise, without=[ttft_s[n][0] for n in names], with_=[ttft_s[n][1] for n in names])


# S20: "about 10x": within a factor of two of it, or beyond.
EFFICIENCY_GAP_X = 5.0


def s20_efficiency_gap(prefill_mfu_percent: float, decode_mfu_percent: float, *, noise) -> str:
    """S20: the same device's share of its peak FLOP/s used in prefill against batch-1 decode (MFU
    against one peak, so tok/s per unit of peak alike). Holds at ``EFFICIENCY_GAP_X`` or more (the
    article's ~10x within a factor of two, or wider)."""

    def judge(prefill_mfu_percent, decode_mfu_percent):
        gap = prefill_mfu_percent / decode_mfu_percent
        if gap >= EFFICIENCY_GAP_X:
            return f"{HOLDS}: prefill uses {gap:.0f}x the share of the peak batch-1 decode does"
        return f"{FAILS}: prefill uses only {gap:.1f}x the share of the peak batch-1 decode does"

    return verdict(judge, noise, prefill_mfu_percent=prefill_mfu_percent, decode_mfu_percent=decode_mfu_percent)


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


def kv_cache_linear(recompute_s: float, cache_s: float, *, work_x: float, answer_tokens: int, noise) -> str:
    """Beyond the articles (notebook 05): the KV cache turns quadratic recomputation into linear
    work. ``work_x``: the token-passes of recomputing over those of the cached run (counted,
    exact: n m + m (m - 1) / 2 against n + m - 1 for an m-token answer to an n-token prompt);
    ``recompute_s``, ``cache_s``: the two generations' measured seconds. Holds when recomputing cost
    more work and more time; fails when the timings find no cost (or the count found no extra work)."""

    def judge(recompute_s, cache_s):
        time_x = recompute_s / cache_s
        if work_x <= 1:
            return f"{FAILS}: recomputing counted {work_x:.2f}x the token-passes, no extra work"
        if time_x <= 1:
            return f"{FAILS}: {work_x:.1f}x the token-passes, but {time_x:.2f}x the time: the cache saved nothing here"
        return f"{HOLDS}: {answer_tokens} tokens, {work_x:.1f}x the token-passes and {time_x:.1f}x the time without it"

    return verdict(judge, noise, recompute_s=recompute_s, cache_s=cache_s)


def kv_pool_caps(peak_running: int, *, cap_at_prompt: int, num_preemptions: int) -> str:
    """Beyond the articles (notebook 05): the KV pool caps how many sequences run at once. Counts
    of one run (``lab.concurrency_run``), exact: holds when no step ran more sequences than the
    pool holds at prompt length and the growing answers ran the pool dry (a preemption); fails when
    more ran than fit (a block count is wrong) or the pool never filled (it capped nothing)."""
    if peak_running > cap_at_prompt:
        return f"{FAILS}: {peak_running} ran at once in a pool that holds {cap_at_prompt} prompts (a wrong block count)"
    if num_preemptions == 0:
        return f"{FAILS}: the pool never ran dry (no preemption): it capped nothing on this run"
    return f"{HOLDS}: at most {peak_running} at once (the pool holds {cap_at_prompt} prompts), {num_preemptions} " + (
        "preemption" if num_preemptions == 1 else "preemptions"
    )


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


def not_testable(why: str) -> str:
    """The wording of a claim this device cannot test, with the reason."""
    return f"not testable here: {why}"


def finite(x) -> bool:
    """Whether a figure is a real number (not None, NaN or infinite): a verdict needs one."""
    return x is not None and math.isfinite(x)
