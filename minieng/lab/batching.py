"""Notebook 05's batching experiments: what a bigger decode batch buys, and static against
continuous batching on the same arrivals.

A decode step reads every weight once whatever the batch, so while the step is bound by those
reads (or by its fixed overhead: launches, Python), b sequences cost little more than one:
aggregate tok/s = b / TPOT grows almost b-fold while TPOT barely moves (continuous batching's promise). It stops
when something that grows with b takes over: the arithmetic (the step's matrix products turn
compute-bound once the step's FLOP per byte passes the ridge point), the K/V that every sequence
reads, or the KV pool, which caps how many sequences fit at all.

Continuous batching keeps the batch full as requests come and go. Static batching
(``EngineConfig(batching="static")``, ``scheduler.py``) waits for a batch to fill, then holds it
until its longest request ends, its slots emptying one by one. ``compare_batching`` replays the
same arrivals, prompts and output lengths against both and keeps what the metrics need.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from minieng.engine.llm_engine import LLMEngine
from minieng.lab.kv_cache import sequences_that_fit
from minieng.lab.probes import minieng_decode, warm_up
from minieng.lab.replay import run_workload
from minieng.measure.flops_bytes import decode_ridge_batch, step_work
from minieng.measure.peaks import Peak
from minieng.measure.metrics import common_tail, request_metrics, serving_metrics
from minieng.measure.roofline import format_percent, phase_utilization
from minieng.measure.sweep_plan import prefill_knee, probe_lengths
from minieng.measure.workloads import RequestSpec, text_prompts


def utilization_row(engine: LLMEngine, steps, peaks: Sequence[Peak], **row) -> dict:
    """``row`` plus the steps' time per step, intensity, FLOP/s and, per peak (by its source),
    ``phase_utilization`` (MFU, MBU, what bounds the step)."""
    u = phase_utilization(engine.model_config, engine.dtype.itemsize, steps, peaks)
    return row | {
        "seconds_per_step": u["seconds"] / u["num_steps"],
        "intensity": u["arithmetic_intensity_flop_per_byte"],
        "flop_s": u["achieved_tflops"] * 1e12,
        "by_peak": {p.source: u[p.source] for p in peaks},
    }


def decode_point(
    engine: LLMEngine, batch_size: int, prompt_tokens: int, *, output_tokens: int, peaks: Sequence[Peak]
) -> dict:
    """``batch_size`` sequences of ``prompt_tokens``-token prompts, each generating ``output_tokens``
    tokens (``output_tokens - 1`` decode steps after the prefill) together (``probes.minieng_decode``).

    Returns ``utilization_row`` of the decode-only steps (``seconds_per_step``, ``intensity``,
    ``flop_s``, ``by_peak``) with: median TPOT (s), aggregate tok/s (batch / TPOT), MFU and MBU
    against ``peaks[0]``, the FLOP per byte and the share of the bytes that is K/V
    (``flops_bytes.step_work``); ``wall_s``, the point's own run time; ``mfu_percent_by_peak``: MFU
    against every peak given, by its source ("measured", "datasheet")."""
    start = time.perf_counter()
    tpot, steps = minieng_decode(engine, text_prompts(engine.tokenizer, prompt_tokens, batch_size), output_tokens)
    wall = time.perf_counter() - start
    row = utilization_row(engine, steps, peaks, batch_size=batch_size)
    work = sum(step_work(engine.model_config, s.chunks, engine.dtype.itemsize) for s in steps)
    first = row["by_peak"][peaks[0].source]
    return row | {
        "tpot_s": tpot,
        "tok_s": batch_size / tpot,
        "wall_s": wall,
        "mfu_percent": first["mfu_percent"],
        "mbu_percent": first["mbu_percent"],
        "suspect": first["suspect"],
        "mfu_percent_by_peak": {source: u["mfu_percent"] for source, u in row["by_peak"].items()},
        "intensity_flop_per_byte": work.arithmetic_intensity_flop_per_byte,
        "kv_bytes_share": (work.kv_read_bytes + work.kv_write_bytes) / work.total_bytes,
    }


def batch_sweep(
    engine: LLMEngine, max_batch: int, prompt_tokens: int, output_tokens: int, peaks, budget_s: float, progress=None
) -> dict:
    """Decode at batch 1, 2, 4, ... (``decode_point``) until aggregate tok/s stops growing, the
    batch reaches ``max_batch``, or the next point would overrun ``budget_s``.

    "Stops growing" is ``sweep_plan.prefill_knee`` read on ``(batch, TPOT)`` points (tok/s = batch /
    TPOT there as prompt tokens / TTFT in a prefill sweep): the smallest batch whose tok/s,
    plus 15%, reaches that of every larger batch. The sweep goes on until two larger batches
    confirm it (one slow point, on a machine shared with other work, must not end the sweep).
    The next point's time is extrapolated linearly in the batch from the last one's (its
    prefill grows so).
    Returns ``rows`` (``decode_point`` dicts), ``knee_batch``, ``knee_reached`` and ``max_batch``.
    Raises ``ValueError`` for ``max_batch`` < 1.
    """
    rows: list[dict] = []
    spent = 0.0
    for b in probe_lengths(max_batch, start=1):
        if rows and spent + rows[-1]["wall_s"] * b / rows[-1]["batch_size"] > budget_s:
            break
        if progress:
            progress(f"decode at batch {b}")
        rows.append(decode_point(engine, b, prompt_tokens, output_tokens=output_tokens, peaks=peaks))
        spent += rows[-1]["wall_s"]
        knee = prefill_knee([(r["batch_size"], r["tpot_s"]) for r in rows])
        if knee["knee_reached"] and sum(r["batch_size"] > knee["knee_tokens"] for r in rows) >= 2:
            break
    knee = prefill_knee([(r["batch_size"], r["tpot_s"]) for r in rows])
    return {
        "rows": rows,
        "knee_batch": knee["knee_tokens"],
        "knee_reached": knee["knee_reached"],
        "max_batch": max_batch,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
    }


NEAR_LINEAR = 0.7  # tok/s at batch b at least 70% of b x batch 1's: "almost linear"
BOUND_SHARE = 0.5  # a step reaching under half of both measured ceilings is bound by neither


def near_linear_batch(rows: list[dict], efficiency: float = NEAR_LINEAR) -> int:
    """The largest batch up to which aggregate tok/s kept within ``efficiency`` of linear scaling
    from the smallest batch measured (every batch up to it, not only it). ``rows``: ``decode_point``
    dicts. Raises ``ValueError`` for no rows."""
    if not rows:
        raise ValueError("need at least one decode_point row")
    rows = sorted(rows, key=lambda r: r["batch_size"])
    base, best = rows[0], rows[0]["batch_size"]
    for r in rows[1:]:
        if r["tok_s"] < efficiency * base["tok_s"] * r["batch_size"] / base["batch_size"]:
            break
        best = r["batch_size"]
    return best


def limiting_factor(row: dict, ridge_flop_per_byte: float, share: float = BOUND_SHARE) -> str:
    """What bounds a decode step, by the roofline and the measured ceilings: ``"compute"`` when
    its FLOP per byte is at or past the ridge point, else ``"bandwidth"`` when it moved at least
    ``share`` of the measured bandwidth (MBU, of the bytes ``flops_bytes.step_work`` counts), else
    ``"overhead"``: neither the counted arithmetic nor the counted bytes take its time, work they
    leave out does (kernel launches, Python, small ops, the copies of each sequence's K/V that
    ``attention.py`` gathers before attending)."""
    if row["intensity_flop_per_byte"] >= ridge_flop_per_byte:
        return "compute"
    return "bandwidth" if row["mbu_percent"] >= 100 * share else "overhead"


def format_batch_sweep(rows: list[dict], ridge_flop_per_byte: float) -> list[str]:
    """``batch_sweep``'s rows as a table: TPOT, tok/s and both against batch 1, MFU, MBU, FLOP per
    byte, the K/V's share of the bytes, and ``limiting_factor``."""
    b1 = rows[0]
    lines = [
        f"{'batch':>5} {'TPOT ms':>8} {'tok/s':>8} {'tok/s x':>8} {'TPOT x':>7} {'MFU':>7} {'MBU':>7} "
        f"{'FLOP/B':>7} {'KV bytes':>9}  bound"
    ]
    for r in rows:
        lines.append(
            f"{r['batch_size']:>5} {r['tpot_s'] * 1e3:>8.1f} {r['tok_s']:>8.0f} {r['tok_s'] / b1['tok_s']:>8.1f} "
            f"{r['tpot_s'] / b1['tpot_s']:>7.2f} {format_percent(r['mfu_percent']):>7} "
            f"{format_percent(r['mbu_percent']):>7} {r['intensity_flop_per_byte']:>7.1f} "
            f"{format_percent(100 * r['kv_bytes_share']):>9}  {limiting_factor(r, ridge_flop_per_byte)}"
        )
    return lines


def sweep_reading(sweep: dict, engine: LLMEngine, peaks) -> dict:
    """What ``batch_sweep``'s rows say, beside the roofline and the pool: ``linear_to``
    (``near_linear_batch``), ``knee_row`` (where tok/s stopped growing, else the largest batch),
    ``roofline_batch`` (the batch whose step reaches the ridge of ``peaks[0]``, or None),
    ``pool_batch`` (the sequences the engine's pool and ``max_num_seqs`` hold), ``mfu_source`` (the
    last peak's: the datasheet's where known, as the articles read MFU) with ``mfu_1`` and
    ``mfu_top`` (batch 1's and the largest batch's MFU against it), and ``lines`` saying so."""
    rows, ridge = sweep["rows"], peaks[0].ridge_flop_per_byte
    full = sweep["prompt_tokens"] + sweep["output_tokens"]
    context = sweep["prompt_tokens"] + sweep["output_tokens"] // 2  # the mean context during the decode
    roofline_batch = decode_ridge_batch(engine.model_config, context, engine.dtype.itemsize, ridge)
    pool = sequences_that_fit(engine.memory_plan.num_kv_blocks, engine.config.block_size, full)
    r = {
        "linear_to": near_linear_batch(rows),
        "knee_row": next(x for x in rows if x["batch_size"] == sweep["knee_batch"])
        if sweep["knee_reached"]
        else rows[-1],
        "roofline_batch": roofline_batch,
        "pool_batch": min(engine.config.max_num_seqs, pool),
        "mfu_source": peaks[-1].source,
    }
    r["mfu_1"], r["mfu_top"] = (x["mfu_percent_by_peak"][r["mfu_source"]] for x in (rows[0], rows[-1]))
    grows = (
        f"it stops growing at batch {sweep['knee_batch']}"
        if sweep["knee_reached"]
        else f"still growing at batch {rows[-1]['batch_size']}, the largest timed"
    )
    ridge_at = (
        f"{roofline_batch}" if roofline_batch else "(never: each sequence's K/V keeps the FLOP per byte below it)"
    )
    r["lines"] = [
        f"tok/s within {NEAR_LINEAR:.0%} of linear up to batch {r['linear_to']}; {grows}",
        f"roofline: the step turns compute-bound at batch {ridge_at}; the pool holds {r['pool_batch']} sequences of "
        f"{full} tokens (max_num_seqs included)",
        f"decode MFU against the {r['mfu_source']} peak: {format_percent(r['mfu_1'])} at batch 1, "
        f"{format_percent(r['mfu_top'])} at batch {rows[-1]['batch_size']}",
    ]
    return r


def bound_lines(rows: list[dict], knee_row: dict, ridge_flop_per_byte: float) -> list[str]:
    """Why batch 1's step and the knee's step took their time (``limiting_factor``), in words."""
    b1, k = rows[0], knee_row
    why = {
        "compute": f"the step's FLOP per byte ({k['intensity_flop_per_byte']:.0f}) passed the ridge point "
        f"({ridge_flop_per_byte:.0f}): the matrix products turned compute-bound",
        "bandwidth": f"the step moved {format_percent(k['mbu_percent'])} of the measured bandwidth, "
        f"{format_percent(100 * k['kv_bytes_share'])} of it K/V that grows with every sequence",
        "overhead": f"the step reached {format_percent(k['mfu_percent'])} of the FLOP/s and "
        f"{format_percent(k['mbu_percent'])} of the bandwidth its counted work needs: its time went to work those "
        "counts leave out (launches, Python, small ops, the copies of each sequence's K/V attention gathers)",
    }
    lines = []
    if limiting_factor(b1, ridge_flop_per_byte) == "overhead":
        lines.append(
            f"At batch 1 the step moved {format_percent(b1['mbu_percent'])} of the measured bandwidth: overhead, not "
            "the weight reads, set its time, and extra sequences filled that idle time almost for free."
        )
    if k is not b1:
        lines.append(f"At batch {k['batch_size']} " + why[limiting_factor(k, ridge_flop_per_byte)] + ".")
    return lines


def batch_why(napkin_1, napkin_b, row_b: dict, row_1: dict) -> str:
    """Why a batch's measured tok/s gain differs from the napkin's (``NapkinEstimate`` of batch 1
    and of the batch): the two step-time ratios, and what the floor leaves out."""
    return (
        f"the napkin's batch-{row_b['batch_size']} step takes {napkin_b.tpot_floor_s / napkin_1.tpot_floor_s:.2f}x "
        f"batch 1's ({napkin_b.tpot_bound}-bound at its floor), the measured one "
        f"{row_b['tpot_s'] / row_1['tpot_s']:.2f}x: a batch-1 step far above its floor leaves time extra sequences "
        "fill for free, and work the floor does not count (launches, the K/V copies attention gathers) grows "
        "with the batch"
    )


def sustainable_rate(
    tpot_s: float, batch_size: int, mean_output_tokens: float, prompt_tokens: int, prefill_tok_s: float
) -> float:
    """Requests per second a continuously full batch can serve: each request holds one of
    ``batch_size`` slots for ``mean_output_tokens`` steps of ``tpot_s`` s, and its prompt takes
    ``prompt_tokens / prefill_tok_s`` s of the engine alone. An estimate, for choosing an arrival
    rate below it. Raises ``ValueError`` for non-positive inputs."""
    if min(tpot_s, batch_size, mean_output_tokens, prefill_tok_s) <= 0 or prompt_tokens < 0:
        raise ValueError(
            "tpot_s, batch_size, mean_output_tokens and prefill_tok_s must be > 0, prompt_tokens >= 0; "
            f"got {tpot_s}, {batch_size}, {mean_output_tokens}, {prefill_tok_s}, {prompt_tokens}"
        )
    return 1.0 / (mean_output_tokens * tpot_s / batch_size + prompt_tokens / prefill_tok_s)


def compare_batching(
    engines: dict[str, LLMEngine], specs: list[RequestSpec], prompts: list[list[int]], progress: bool = False
) -> dict:
    """Replay the same workload in real time (``replay.run_workload``) against each engine.

    Each engine is warmed up first with one full batch (``max_num_seqs`` short requests, so a
    static batch starts at once). Returns per engine name: ``metrics``
    (``metrics.serving_metrics``, as a dict), ``mean_sequences_per_step`` (weighted by the
    steps' durations), per-request ``ttft_ms``, ``tpot_ms`` and ``e2el_ms``,
    ``steps`` (``[start s since the run began, duration s, sequences in the step]``) and
    ``token_ids``; and ``same_tokens``: whether every engine produced the same tokens for every
    request (greedy requests, so batching must not change them).
    """
    runs = {}
    for name, engine in engines.items():
        warm_up(engine, text_prompts(engine.tokenizer, 16, engine.config.max_num_seqs))
        result = run_workload(engine, specs, prompts, progress=progress)
        ms = [request_metrics(o) for o in result.outputs]
        busy = sum(s.duration_s for s in result.steps)
        runs[name] = {
            # sequences per step, weighted by the steps' durations: how full the batch was
            "mean_sequences_per_step": sum(
                s.duration_s * (s.num_prefill_seqs + s.num_decode_seqs) for s in result.steps
            )
            / busy
            if busy
            else 0.0,
            "metrics": serving_metrics(result.outputs, result.duration_s).to_dict(),
            "ttft_ms": [1e3 * m.ttft_s for m in ms if m.ttft_s is not None],
            "tpot_ms": [1e3 * m.tpot_s for m in ms if m.tpot_s is not None],
            "e2el_ms": [1e3 * m.e2el_s for m in ms if m.e2el_s is not None],
            "steps": [
                [s.start_s - result.start_s, s.duration_s, s.num_prefill_seqs + s.num_decode_seqs] for s in result.steps
            ],
            "token_ids": [list(o.token_ids) for o in result.outputs],
        }
    tokens = [r["token_ids"] for r in runs.values()]
    return {"runs": runs, "same_tokens": all(t == tokens[0] for t in tokens)}


def format_batching(result: dict) -> list[str]:
    """``compare_batching``'s result as a table, one column per engine: output tok/s, requests/s,
    run time, sequences per step, then TTFT, TPOT, E2EL and queueing time (ms) at P50 and at the
    tail: the P99 where every run has the 100 samples it needs, else the max, named so in the row
    ("TTFT max of 24 ms", ``metrics.common_tail``). N/A where a run has no such figure."""
    runs = result["runs"].values()
    lines = [f"{'':<26} " + " ".join(f"{name:>12}" for name in result["runs"])]

    def row(label: str, cells) -> None:
        lines.append(f"{label:<26} " + " ".join(f"{'N/A' if c is None else c:>12}" for c in cells))

    row("output tok/s", [f"{r['metrics']['output_throughput_tok_s']:.1f}" for r in runs])
    row("requests/s", [f"{r['metrics']['request_throughput_req_s']:.2f}" for r in runs])
    row("run time s", [f"{r['metrics']['duration_s']:.1f}" for r in runs])
    row("sequences per step", [f"{r['mean_sequences_per_step']:.1f}" for r in runs])
    for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("E2EL", "e2el_ms"), ("queue", "queue_ms")):
        summaries = [r["metrics"][key] for r in runs]
        if not any(m["count"] for m in summaries):
            row(f"{name} ms", [None for _ in summaries])
            continue
        for p in (50, 99):
            label, stat = common_tail(summaries, p)
            row(f"{name} {label} ms", [None if m[stat] is None else f"{m[stat]:.0f}" for m in summaries])
    return lines
