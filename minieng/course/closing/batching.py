"""Notebook 05's closing claims table: S6 (batching's near-linear decode gain), S21 (batching lifts
decode MFU) and the KV cache's linear work, from the notebook's batch sweep and recompute run."""

from __future__ import annotations

from minieng.course import verdicts
from minieng.course.kit import claims_table
from minieng.lab.batching import limiting_factor, sweep_reading
from minieng.lab.kv_cache import recompute_totals
from minieng.measure.roofline import format_percent


def table(*, sweep, recompute, engine, peaks, noise=None):
    """The claims table of notebook 05. ``sweep``: ``batch_sweep``'s cached result; ``recompute``:
    ``recompute_vs_cache``'s; ``engine`` and ``peaks``: those the sweep ran on (the measured peak
    first). Each verdict is judged with the noise of the run that measured it (``.noise`` of a
    ``course.cached`` result, else ``noise``)."""
    rows, b1 = sweep["rows"], sweep["rows"][0]
    r = sweep_reading(sweep, engine, peaks)
    top = next(x for x in rows if x["batch_size"] == r["linear_to"])
    bends = (
        f"; bends at batch {sweep['knee_batch']} ({limiting_factor(r['knee_row'], peaks[0].ridge_flop_per_byte)}-bound)"
        if sweep["knee_reached"]
        else ""
    )
    sweep_noise = getattr(sweep, "noise", None) or noise
    if len(rows) == 1:
        s6 = s21 = verdicts.not_testable("only batch 1 fit the time budget")
    else:
        s6 = verdicts.s6_near_linear(
            [x["tok_s"] for x in rows], batch_sizes=[x["batch_size"] for x in rows], noise=sweep_noise
        )
        s21 = verdicts.s21_batched_mfu(
            r["mfu_1"], r["mfu_top"], largest_batch=rows[-1]["batch_size"], noise=sweep_noise
        )
    t = recompute_totals(recompute)
    return claims_table(
        [
            (
                "S6: batching raises aggregate decode tok/s almost linearly without raising TPOT proportionally",
                "'almost linear' decode gain; '160 tok/s' honest only beside each user's latency",
                f"batch 1 -> {r['linear_to']}: tok/s x{top['tok_s'] / b1['tok_s']:.1f}, "
                f"TPOT x{top['tpot_s'] / b1['tpot_s']:.2f}{bends}",
                s6,
            ),
            (
                "S21: batching lifts decode MFU out of single digits",
                "< 5% at batch 1",
                f"decode MFU ({r['mfu_source']} peak) {format_percent(r['mfu_1'])} at batch 1, "
                f"{format_percent(r['mfu_top'])} at batch {rows[-1]['batch_size']}",
                s21,
            ),
            (
                "(beyond the articles) the KV cache turns quadratic recomputation into linear work",
                "(not in the articles)",
                f"{recompute['max_tokens']} tokens: {t['work_x']:.1f}x the token-passes and {t['time_x']:.1f}x the time "
                "without it",
                verdicts.kv_cache_linear(
                    t["recompute"]["token_s"],
                    t["cache"]["token_s"],
                    work_x=t["work_x"],
                    answer_tokens=recompute["max_tokens"],
                    noise=getattr(recompute, "noise", None) or noise,
                ),
            ),
        ],
        noise=noise,
    )
