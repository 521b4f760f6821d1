"""Notebook 02's closing claims table: S2 (prefill FLOPs ~ 2·P·n plus attention's n²), the FLOP
counter against the formula, S11 (prefill and batch-1 decode MFU) and S20 (the gap between them)."""

from __future__ import annotations

from minieng.config import published_config
from minieng.course import verdicts
from minieng.course.kit import claims_table
from minieng.lab.roofline_sweep import best_and_b1
from minieng.measure.flops_bytes import attention_crossover_tokens, prefill_params_per_token, prefill_work
from minieng.measure.roofline import format_percent


def _against(mfu: dict) -> str:
    sheet = f"{format_percent(mfu['datasheet'])} of the datasheet peak, " if "datasheet" in mfu else ""
    return sheet + f"{format_percent(mfu['measured'])} of the measured ceiling"


def table(
    *,
    res,
    fit: dict,
    counts: list[dict],
    model_config,
    model_name: str,
    count_tokens: int,
    dtype_bytes: float,
    measured,
):
    """The claims table of notebook 02. ``res``: ``decode_runs.roofline_run``'s sweep (its ``.noise``
    judges every verdict); ``fit``: ``fit_ttft`` of its prefill points; ``counts``: ``counted_steps``
    of a ``count_tokens``-token prompt; ``measured``: the machine's measured ``Peak`` (S2's linear
    slope is judged against 2 x the layers' parameters / its FLOP/s)."""
    noise = res.noise
    best, b1 = best_and_b1(res)
    longest = res["prefill"][-1]["prompt_tokens"]
    w_long, w_count = (
        prefill_work(model_config, longest, dtype_bytes),
        prefill_work(model_config, count_tokens, dtype_bytes),
    )
    attention_share = w_long.attention_flops / w_long.total_flops
    quad = fit["quadratic_share"]
    exact = all(r["counted_linear_flops"] == r["linear_flops"] for r in counts)
    judged = "datasheet" if "datasheet" in best["by_peak"] else "measured"  # the article's MFUs are against datasheets
    mfu_p = {s: u["mfu_percent"] for s, u in best["by_peak"].items()}
    mfu_d = {s: u["mfu_percent"] for s, u in b1["by_peak"].items()}
    here, llama = attention_crossover_tokens(model_config), attention_crossover_tokens(published_config("Llama-3-8B"))
    return claims_table(
        [
            (
                "S2: prefill FLOPs ~ 2·P·n, plus attention's n² at long context",
                "2·P·n + an n² term",
                f"fitted n² share of TTFT at {longest:,} tokens: "
                + (f"{100 * quad:.0f}%" if fit["significant"] else "none significant")
                + f"; attention {100 * attention_share:.0f}% of its FLOPs (counted); n² overtakes at {here:,} tokens for "
                f"{model_name}, {llama:,} for Llama-3-8B (computed)",
                verdicts.s2_quadratic(
                    quad,
                    attention_share=attention_share,
                    prompt_tokens=longest,
                    noise=noise,
                    unphysical_fit=None if fit["physical"] is not False else fit["reason"],
                    linear_s_per_token=fit["b_s_per_token"],
                    params=prefill_params_per_token(model_config),
                    peak_flops=measured.peak_tflops * 1e12,
                ),
            ),
            (
                "(beyond the articles) FlopCounterMode counts 2·N·n exactly",
                "2·N·n, the formula's linear FLOPs",
                f"linear FLOPs {'equal to' if exact else 'NOT equal to'} the formula's on {len(counts)} steps; attention "
                f"{100 * w_count.attention_flops / w_count.total_flops:.0f}% of a {count_tokens}-token prefill",
                "holds" if exact else "does not hold here: the counts differ",
            ),
            (
                "S11: prefill MFU 40-60%",
                "40-60% (of datasheet peaks)",
                f"{_against(mfu_p)}, at {best['prompt_tokens']} tokens",
                verdicts.s11_prefill_mfu(
                    mfu_p.get("datasheet"),
                    mfu_p["measured"],
                    noise=noise,
                    suspect=best["by_peak"][judged]["suspect"],
                    limit=best["by_peak"][judged]["limit"],
                ),
            ),
            (
                "S11: batch-1 decode MFU under 5% (often 2-3%)",
                "< 5%",
                f"{_against(mfu_d)}, MBU {format_percent(b1['by_peak'][judged]['mbu_percent'])} of the {judged} bandwidth; "
                f"{b1['by_peak'][judged]['limit']}-bound",
                verdicts.s11_decode_mfu(
                    mfu_d.get("datasheet"), mfu_d["measured"], noise=noise, suspect=b1["by_peak"][judged]["suspect"]
                ),
            ),
            (
                "S20: the same device about 10x more efficient in one phase than the other",
                "~10x (40-60% vs < 5% MFU)",
                f"prefill {format_percent(mfu_p['measured'])}, batch-1 decode {format_percent(mfu_d['measured'])} of the measured "
                f"ceiling: {mfu_p['measured'] / mfu_d['measured']:.1f}x (the same ratio against any one peak)",
                verdicts.s20_efficiency_gap(mfu_p["measured"], mfu_d["measured"], noise=noise),
            ),
        ],
        noise=noise,
    )
