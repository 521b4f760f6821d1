"""One verdict per claim of the source articles (S1-S21): what a notebook's closing table says.

Each function takes the figures a notebook measured and returns the verdict's wording: "holds ...",
"does not hold here: ...", "not testable here: ...", "explained: ..." (S1 as vLLM logs it: the
article's figure is fixed by the load's token counts), "computed: ..." (S18's ranking, S13's split with
no phase timed: counts and datasheets decide it) or, when the machine's timing noise could flip
it, "too noisy to judge here: ..." (``claims.verdict`` tries every figure at either end of its
noise band). Timings, and figures made of one timing (tok/s, MFU, MBU), are the noisy arguments;
counts (tokens, FLOPs, bytes, hit rates) are keyword-only and exact. ``noise`` is a
``ceilings.Noise``, its ``relative`` figure, or None (judged as measured): the noise of the run
that measured the figures (``kit.cached(...).noise``), not today's.

Every verdict can fail: ``tests/course/test_claim_verdicts.py`` feeds each figures under which its
claim does not hold, and figures inside the noise band, and names the claim's id.
Thresholds are stated where they are set; the articles' figures come from ``claims.ARTICLE_CLAIMS``.

The verdicts live by what they judge: ``phases`` (S1, S2, S14), ``roofline`` (S3's floor, the KV
bytes, S4, S13's ridge, S17), ``utilization`` (S11, S12, S18, S20), ``batching`` (S6, S7, S10, S16,
S21), ``caching`` (S5, S19, the KV cache and its pool), ``quantization`` (S3's bytes ratio, S13,
W8A8, the engine's target), ``speculative`` (S8, greedy lossless), ``serving`` (S9, S15, the two
clocks); ``wording`` holds what they share. Every public name is re-exported here, so
``verdicts.s2_quadratic`` and ``from minieng.course.verdicts import KV_VISIBLE_X`` read as before;
patch a threshold in the module that defines it (``verdicts.phases.REGIME_X``), where its verdict
reads it.
"""

from minieng.course.verdicts.batching import (
    FLAT_X,
    NEAR_LINEAR,
    NEAR_LINEAR_MIN_BATCH,
    P99_MIN_REQUESTS,
    SINGLE_DIGITS,
    s6_continuous,
    s6_near_linear,
    s7_chunked,
    s10_goodput_cap,
    s16_prefill_batch,
    s21_batched_mfu,
)
from minieng.course.verdicts.caching import (
    CACHE_SAVES_X,
    ON_THE_LINE_X,
    SAVES_SHARE,
    kv_cache_linear,
    kv_pool_caps,
    s5_hit_rate,
    s19_cheapest,
)
from minieng.course.verdicts.phases import (
    ATTENTION_SMALL,
    LINEAR_SLOPE_X,
    LOGGED_IS_LOAD_X,
    OWN_LENGTH_X,
    QUADRATIC_EXCESS_X,
    QUADRATIC_FOUND,
    REGIME_X,
    ROOFLINE_SHORTFALL_X,
    s1_logged_ratio,
    s1_physics,
    s2_quadratic,
    s14_slopes,
)
from minieng.course.verdicts.quantization import (
    AMPLIFY_X,
    BYTES_OVERHEAD_X,
    BYTES_SUSPECT,
    BYTES_SUSPECT_X,
    QUANT_ASYMMETRY_X,
    TARGET_AGREEMENT,
    TARGET_TPOT_X,
    amplifies_float_noise,
    outliers_price,
    quantization_target,
    s3_bytes_ratio,
    s13_quantization,
    w8a8_prefill,
)
from minieng.course.verdicts.roofline import (
    KV_FOLLOWS,
    KV_VISIBLE_X,
    OWN_FLOOR_SHARE,
    PHASE_GAIN_X,
    kv_joins_weights,
    s3_floor,
    s4_tensor_parallel,
    s13_roofline_split,
    s17_flops_knob,
)
from minieng.course.verdicts.serving import (
    CLOCKS_AGREE_MS,
    CLOCKS_AGREE_SHARE,
    MISREADS_TPOT,
    MISREADS_TTFT_X,
    clocks_agree,
    s9_disaggregation,
    s15_total_latency,
)
from minieng.course.verdicts.speculative import greedy_lossless, s8_speculative
from minieng.course.verdicts.utilization import (
    DECODE_MFU_MAX,
    EFFICIENCY_GAP_X,
    IDLE_MFU_MAX,
    PREFILL_MFU_RANGE,
    SUSPECT,
    UTIL_RANGE,
    s11_decode_mfu,
    s11_prefill_mfu,
    s12_utilization,
    s18_idler,
    s20_efficiency_gap,
)
from minieng.course.verdicts.wording import COMPUTED, EXPLAINED, FAILS, HOLDS, categorized, not_testable

__all__ = [
    "AMPLIFY_X",
    "ATTENTION_SMALL",
    "BYTES_OVERHEAD_X",
    "BYTES_SUSPECT",
    "BYTES_SUSPECT_X",
    "CACHE_SAVES_X",
    "CLOCKS_AGREE_MS",
    "CLOCKS_AGREE_SHARE",
    "COMPUTED",
    "DECODE_MFU_MAX",
    "EFFICIENCY_GAP_X",
    "EXPLAINED",
    "FAILS",
    "FLAT_X",
    "HOLDS",
    "IDLE_MFU_MAX",
    "KV_FOLLOWS",
    "KV_VISIBLE_X",
    "LINEAR_SLOPE_X",
    "LOGGED_IS_LOAD_X",
    "MISREADS_TPOT",
    "MISREADS_TTFT_X",
    "NEAR_LINEAR",
    "NEAR_LINEAR_MIN_BATCH",
    "ON_THE_LINE_X",
    "OWN_FLOOR_SHARE",
    "OWN_LENGTH_X",
    "P99_MIN_REQUESTS",
    "PHASE_GAIN_X",
    "PREFILL_MFU_RANGE",
    "QUADRATIC_EXCESS_X",
    "QUADRATIC_FOUND",
    "QUANT_ASYMMETRY_X",
    "REGIME_X",
    "ROOFLINE_SHORTFALL_X",
    "SAVES_SHARE",
    "SINGLE_DIGITS",
    "SUSPECT",
    "TARGET_AGREEMENT",
    "TARGET_TPOT_X",
    "UTIL_RANGE",
    "amplifies_float_noise",
    "categorized",
    "clocks_agree",
    "greedy_lossless",
    "kv_cache_linear",
    "kv_joins_weights",
    "kv_pool_caps",
    "not_testable",
    "outliers_price",
    "quantization_target",
    "s1_logged_ratio",
    "s1_physics",
    "s2_quadratic",
    "s3_bytes_ratio",
    "s3_floor",
    "s4_tensor_parallel",
    "s5_hit_rate",
    "s6_continuous",
    "s6_near_linear",
    "s7_chunked",
    "s8_speculative",
    "s9_disaggregation",
    "s10_goodput_cap",
    "s11_decode_mfu",
    "s11_prefill_mfu",
    "s12_utilization",
    "s13_quantization",
    "s13_roofline_split",
    "s14_slopes",
    "s15_total_latency",
    "s16_prefill_batch",
    "s17_flops_knob",
    "s18_idler",
    "s19_cheapest",
    "s20_efficiency_gap",
    "s21_batched_mfu",
    "w8a8_prefill",
]
