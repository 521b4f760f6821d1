"""Notebook 00's closing claims table: the decode floor on this machine (S3's bound) and S13's roofline split."""

from __future__ import annotations

from minieng.config import ModelConfig
from minieng.course.kit import claims_table
from minieng.course.verdicts import s13_roofline_split
from minieng.measure.flops_bytes import decode_work, prefill_work
from minieng.measure.roofline import tpot_floor_s

ARTICLE_FLOOR = "RTX 3060: 10.8 GB / 360 GB/s, ~33 tok/s"


def claims(
    model_config: ModelConfig, ceilings, dtype_bytes: float, prompt_tokens: int = 512, context_tokens: int = 256
):
    """The table: the batch-1 decode floor (bytes / measured bandwidth, at ``context_tokens`` of KV) and
    S13 judged on the counted intensities of a ``prompt_tokens`` prefill and a batch-1 decode against
    the measured ridge (``ceilings``: ``machine_ceilings``' result, its noise included)."""
    peak = ceilings.peak
    decode = decode_work(model_config, 1, context_tokens, dtype_bytes)
    prefill = prefill_work(model_config, prompt_tokens, dtype_bytes)
    floor_s = tpot_floor_s(decode.total_bytes, peak.bandwidth_gbps * 1e9)
    ridge = peak.ridge_flop_per_byte
    return claims_table(
        [
            (
                "the decode floor here (S3's bound; notebook 01 measures TPOT against it)",
                ARTICLE_FLOOR,
                f"{decode.total_bytes / 1e6:.0f} MB / {peak.bandwidth_gbps:.1f} GB/s, at most {1 / floor_s:.0f} tok/s",
                "a bound, computed",
            ),
            (
                "S13: prefill is compute-bound, decode memory-bound",
                "prefill limited by FLOP/s, decode by bandwidth",
                f"ridge {ridge:.1f} FLOP/B; prefill ({prompt_tokens} tok) "
                f"{prefill.arithmetic_intensity_flop_per_byte:.0f}, decode b1 "
                f"{decode.arithmetic_intensity_flop_per_byte:.2f} FLOP/B",
                s13_roofline_split(
                    prefill_intensity=prefill.arithmetic_intensity_flop_per_byte,
                    decode_intensity=decode.arithmetic_intensity_flop_per_byte,
                    ridge=ridge,
                    noise=ceilings.noise,
                ),
            ),
        ],
        noise=ceilings.noise,
    )
