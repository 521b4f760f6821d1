"""Notebook 06's closing table: S7 (chunked prefill protects the running decodes at a small TTFT
price), decode-first scheduling, and the token budget's trade-off."""

from __future__ import annotations

from functools import partial

from minieng.course import verdicts
from minieng.course.claims import verdict
from minieng.course.kit import claims_table
from minieng.lab.chunked_lesson import LongPromptPlan
from minieng.lab.chunked_prefill import (
    budget_tradeoff_verdict,
    decode_first_verdict,
    read_result,
    steps_without_decodes,
)


def closing(sweep, plan: LongPromptPlan):
    """The claims table of ``plan.sweep()``'s result (a ``cached`` one: its noise judges every
    verdict; the noise of the run that measured it)."""
    noise = getattr(sweep, "noise", None)
    off, taught = sweep["off"], plan.taught(sweep)
    reading = read_result(off, taught, plan.probe["overhead_s"])
    smallest, largest = sweep["on"][0], sweep["on"][-1]
    skipped_off, skipped_on = steps_without_decodes(sweep)
    return claims_table(
        [
            (
                "S7: chunked prefill protects the ITL of running decodes at a small TTFT cost",
                "40,000-token prompt mid-decode: stutters; chunked, TPOT protected, TTFT a little higher",
                f"{plan.long_prompt_tokens}-token prompt, budget {plan.budget}: worst gap {off['worst_itl_ms']:.0f} -> "
                f"{taught['worst_itl_ms']:.0f} ms ({reading['itl_protection_x']:.1f}x shorter); TTFT "
                f"{off['ttft_ms']:.0f} -> {taught['ttft_ms']:.0f} ms ({reading['ttft_price_x']:.2f}x)",
                verdicts.s7_chunked(
                    reading,
                    off["worst_itl_ms"] / 1e3,
                    taught["worst_itl_ms"] / 1e3,
                    off["ttft_ms"] / 1e3,
                    taught["ttft_ms"] / 1e3,
                    noise=noise,
                ),
            ),
            (
                "decode-first: every running decode gets its token in every step",
                "(vLLM V1's scheduler; docs/architecture.md, The scheduler)",
                f"steps with no decode after the arrival: {skipped_off} off, {skipped_on} on",
                decode_first_verdict(skipped_off, skipped_on),
            ),
            (
                "a smaller budget: shorter gaps, longer TTFT",
                "favouring the newcomer helps its TTFT and hurts the running TPOT",
                f"budget {smallest['budget_tokens']}: {smallest['worst_itl_ms']:.0f} ms gap, "
                f"{smallest['ttft_ms']:.0f} ms TTFT; budget {largest['budget_tokens']}: "
                f"{largest['worst_itl_ms']:.0f} ms, {largest['ttft_ms']:.0f} ms",
                verdict(
                    partial(budget_tradeoff_verdict, overhead_bound=reading["overhead_bound"]),
                    noise,
                    gap_small_ms=smallest["worst_itl_ms"],
                    gap_large_ms=largest["worst_itl_ms"],
                    ttft_small_ms=smallest["ttft_ms"],
                    ttft_large_ms=largest["ttft_ms"],
                ),
            ),
        ],
        noise=noise,
    )
