"""Notebook 09's closing table: S8 (one weight read amortized over several accepted tokens) and
greedy speculation's lossless output."""

from __future__ import annotations

from minieng.course import verdicts
from minieng.course.kit import claims_table


def closing(k_result, spec_token_ids: list[int], plain_token_ids: list[int], dtype):
    """The claims table of ``lab.k_sweep``'s result (a ``cached`` one: its noise judges S8) at its
    fastest k, and of one greedy request's tokens with and without the draft (``dtype``: the target's)."""
    noise = getattr(k_result, "noise", None)
    best = max(k_result["rows"], key=lambda r: r["measured_speedup_x"])
    same = sum(a == b for a, b in zip(spec_token_ids, plain_token_ids))
    return claims_table(
        [
            (
                "S8: speculative decoding amortizes one weight read over several accepted tokens",
                "tokens per step > 1 at the cost of ~one target step",
                f"k={best['k']}: {best['tokens_per_step']:.2f} tokens/step, v = {best['v']:.2f}, c = {best['c']:.2f}, "
                f"speedup {best['measured_speedup_x']:.2f}x",
                verdicts.s8_speculative(
                    best["measured_speedup_x"], tokens_per_step=best["tokens_per_step"], noise=noise
                ),
            ),
            (
                "greedy speculative output equals the target's",
                "lossless",
                f"{same} of {len(plain_token_ids)} tokens identical",
                verdicts.greedy_lossless(spec_token_ids, plain_token_ids, dtype=str(dtype).removeprefix("torch.")),
            ),
        ],
        noise=noise,
    )
