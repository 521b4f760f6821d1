"""Quantization (notebook 08): S3 through the bytes ratio, S13 (decode gains more than prefill), W8A8's
amplified float noise, its faster prefill, the outliers' price, and the engine's own target.
"""

from __future__ import annotations

import math

from minieng.course.claims import verdict

from minieng.course.verdicts.wording import FAILS, HOLDS, _ratio_noise, categorized

# S3 through quantization (notebook 08): a TPOT ratio more than this far above the bytes ratio is not
# a step bound by its bytes; this far below it, faster than the bytes allow (suspect).
BYTES_OVERHEAD_X = 1.3
BYTES_SUSPECT_X = 0.9
BYTES_SUSPECT = "suspect"  # s3_bytes_ratio's verdict when a scheme beats its bytes


def s3_bytes_ratio(tpot_ratio: float, *, bytes_ratio: float, scheme: str, noise) -> str:
    """S3 through quantization: if a decode step costs its bytes / bandwidth (TPOT_min), a scheme's
    batch-1 TPOT over the float model's (``tpot_ratio``, measured within rounds) follows the ratio
    of their decode steps' bytes (``bytes_ratio``, counted: ``flops_bytes.decode_work`` with the
    scheme's ``matmul_bytes``; exact).

    Three verdicts: holds (from ``BYTES_SUSPECT_X`` to ``BYTES_OVERHEAD_X`` times the bytes ratio);
    does not hold (above ``BYTES_OVERHEAD_X`` times it, or no faster than the float model: int4 at
    0.30x the bytes and 0.97x the TPOT is not a step bound by its bytes, whatever per-op overhead
    explains it); suspect (under ``BYTES_SUSPECT_X`` of the bytes: faster than the bytes allow, so
    the float run was likely slowed by another job). ``tpot_ratio`` is a ratio of two timings:
    judged within (1 + noise)^2."""

    def category(tpot_ratio):
        if tpot_ratio >= 1 or tpot_ratio > BYTES_OVERHEAD_X * bytes_ratio:
            return FAILS
        return BYTES_SUSPECT if tpot_ratio < BYTES_SUSPECT_X * bytes_ratio else HOLDS

    def wording(tpot_ratio):
        said = category(tpot_ratio)
        figures = f"{scheme}: TPOT {tpot_ratio:.2f}x the float model's for {bytes_ratio:.2f}x its bytes"
        if said == FAILS and tpot_ratio >= 1:
            return f"{FAILS}: {figures}: fewer bytes, no faster decode"
        if said == FAILS:
            return (
                f"{FAILS}: {figures}, over {BYTES_OVERHEAD_X}x the bytes ratio: the step is not bound by its bytes "
                "(per-op overhead, or dequantization)"
            )
        if said == BYTES_SUSPECT:
            return f"{BYTES_SUSPECT}: {figures}, faster than the bytes allow (was the float run slowed by another job?)"
        return f"{HOLDS}: {figures}"

    return categorized(category, wording, _ratio_noise(noise), tpot_ratio=tpot_ratio)


QUANT_ASYMMETRY_X = 1.5


def s13_quantization(ttft_ratio: float, tpot_ratio: float, *, noise) -> str:
    """S13, quantization: a scheme's TTFT and TPOT as ratios to the float model's. Holds when it
    cuts decode time at least ``QUANT_ASYMMETRY_X`` times more than prefill time
    (ttft_ratio / tpot_ratio >= 1.5). Each ratio is of two timings: judged within (1 + noise)^2."""

    def judge(ttft_ratio, tpot_ratio):
        if ttft_ratio / tpot_ratio >= QUANT_ASYMMETRY_X:
            return f"{HOLDS}: decode {1 / tpot_ratio:.2f}x faster, prefill {1 / ttft_ratio:.2f}x"
        return f"{FAILS}: decode {1 / tpot_ratio:.2f}x faster, prefill {1 / ttft_ratio:.2f}x: no asymmetry"

    return verdict(judge, _ratio_noise(noise), ttft_ratio=ttft_ratio, tpot_ratio=tpot_ratio)


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
