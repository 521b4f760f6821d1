"""Notebook 03's decode floor (TPOT_min = bytes per step / bandwidth) and notebook 11's napkin for
other models and devices: the measurements and the tables they print.

- ``decode_b1``: a batch-1 decode's steps, their FLOPs and bytes over their time (MFU, MBU).
- ``kv_point``: a batch decoding at one context: what a step read (weights, KV) and its median time.
- ``floor_pairs``: the TPOT floor of published shapes on datasheet GPUs (computed, not measured).
- ``decode_projection``: batch-1 decode's MFU projected on each datasheet (claim S18).
- ``phase_time_projection``: both phases' times projected on each datasheet (claim S17 on a GPU).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from minieng.config import published_config
from minieng.engine.llm_engine import LLMEngine
from minieng.lab.gpu_utilization import decode_for
from minieng.lab.phase_levers import prefill_batch_sweep
from minieng.measure.flops_bytes import decode_work, prefill_work, step_work
from minieng.measure.peaks import Peak, datasheet_peak
from minieng.measure.projection import phase_projection_reading, project_decode_mfu, project_phase_times
from minieng.measure.roofline import format_percent, phase_utilization, roofline_bound, tpot_floor_s
from minieng.measure.sweep_plan import predict_decode_step_s, predict_ttft_s
from minieng.measure.workloads import text_prompts

# (published shape, bytes per weight, GPU in peaks.DATASHEET): notebook 11's floor table.
FLOOR_PAIRS = [
    ("SmolLM2-1.7B", 2, "T4"),
    ("Llama-3-8B", 0.5, "RTX 3060"),
    ("Llama-3-8B", 2, "L4"),
    ("Llama-3-8B", 2, "RTX 4090"),
    ("Qwen2.5-7B-Instruct", 2, "A100 80GB"),
    ("Llama-3-8B", 2, "H100 SXM"),
    ("Llama-3-70B", 0.5, "H200"),
]


def decode_b1(engine: LLMEngine, prompt_tokens: int, steps: int, peaks: Sequence[Peak]) -> dict:
    """One sequence of ``prompt_tokens`` decoding for at least ``steps`` kept steps (``decode_for``):
    ``phase_utilization`` of those steps (``seconds``, ``num_steps``, ``bytes``, and per peak MFU,
    MBU and what bounds the step)."""
    records = decode_for(engine, text_prompts(engine.tokenizer, prompt_tokens, 1), 0, min_steps=steps)
    return phase_utilization(engine.model_config, engine.dtype.itemsize, records, peaks, engine.matmul_bytes)


def kv_point(engine: LLMEngine, batch_size: int, context_tokens: int, steps: int, measured: Peak) -> dict:
    """``batch_size`` sequences of ``context_tokens`` decoding together: what a step read (weights,
    KV read and written), its median time (a median shrugs off the odd slow step), the floor (bytes
    / the measured bandwidth), MBU and what bounds it (``roofline_bound``)."""
    cfg = engine.model_config
    records = decode_for(engine, text_prompts(engine.tokenizer, context_tokens, batch_size), 0, min_steps=steps)
    work, n = sum(step_work(cfg, s.chunks, engine.dtype.itemsize) for s in records), len(records)
    tpot = statistics.median(s.duration_s for s in records)
    bound = roofline_bound(
        work.total_flops / n, work.total_bytes / n, tpot, measured.peak_tflops * 1e12, measured.bandwidth_gbps * 1e9
    )
    return {
        "context_tokens": context_tokens,
        "weight_bytes": work.weight_bytes / n,
        "kv_bytes": (work.kv_read_bytes + work.kv_write_bytes) / n,
        "tpot_s": tpot,
        "floor_s": bound.memory_floor_s,
        "mbu_percent": 100 * bound.memory_floor_s / tpot,
        "limit": bound.limit,
        "bound": bound.words(),
    }


def kv_point_estimate_s(
    probe: dict, engine: LLMEngine, batch_size: int, context_tokens: int, steps: int, bandwidth_gbps: float
) -> float:
    """Rough seconds of one ``kv_point``: the batch's prefill and ``steps + 2`` decode steps, each the
    probe's step or the bytes at the bandwidth, whichever is longer."""
    cfg = engine.model_config
    weights = step_work(cfg, [(1, 0, True)], engine.dtype.itemsize).weight_bytes
    kv = batch_size * context_tokens * cfg.kv_bytes_per_token(engine.dtype.itemsize)
    step_s = max(predict_decode_step_s(probe, batch_size), (weights + kv) / (bandwidth_gbps * 1e9))
    return predict_ttft_s(probe, context_tokens, cfg, batch_size) + (steps + 2) * step_s


def format_kv_rows(rows: Sequence[dict]) -> list[str]:
    """The context sweep's table: bytes per step, the KV's share, the floor, TPOT, MBU and bound."""
    lines = [
        f"{'context':>8} {'weights MB':>11} {'KV MB':>9} {'KV share':>9} {'floor ms':>9} {'TPOT ms':>8} {'MBU':>7}  bound"
    ]
    for r in rows:
        share = r["kv_bytes"] / (r["kv_bytes"] + r["weight_bytes"])
        lines.append(
            f"{r['context_tokens']:>8,} {r['weight_bytes'] / 1e6:>11.1f} {r['kv_bytes'] / 1e6:>9.1f} {100 * share:>8.0f}% "
            f"{r['floor_s'] * 1e3:>9.2f} {r['tpot_s'] * 1e3:>8.2f} {format_percent(r['mbu_percent']):>7}  {r['limit']}"
        )
    return lines


def kv_growth_words(rows: Sequence[dict], visible_x: float) -> str:
    """What the sweep's first and last contexts say: how much the floor and TPOT grew, and what each
    byte of KV cost against the floor. ``visible_x``: the least floor growth that can be timed."""
    first, last = rows[0], rows[-1]
    grew, floor_grew = last["tpot_s"] / first["tpot_s"], last["floor_s"] / first["floor_s"]
    words = (
        f"from {first['context_tokens']:,} to {last['context_tokens']:,} tokens of context: the floor grew "
        f"{floor_grew:.2f}x, the measured TPOT {grew:.2f}x\n"
    )
    extra_ms, floor_extra_ms = 1e3 * (last["tpot_s"] - first["tpot_s"]), 1e3 * (last["floor_s"] - first["floor_s"])
    if floor_grew < visible_x:
        words += (
            "the sweep's contexts add too little KV to the floor to time it (set KV_CONTEXTS longer, or leave it None)"
        )
    elif extra_ms > 0:
        words += (
            f"the KV cache added {extra_ms:.2f} ms per step, where reading it once at the measured bandwidth takes "
            f"{floor_extra_ms:.2f} ms: {extra_ms / floor_extra_ms:.1f}x the floor on each byte of KV"
        )
    else:
        words += "the measured TPOT did not grow with the context: the KV read is lost in the step's other costs"
    if first["limit"] == "overhead":
        words += f"\nat the shortest context the step is {first['bound']}"
    return words


def floor_pairs(pairs: Sequence[tuple[str, float, str]] = FLOOR_PAIRS) -> list[dict]:
    """Each (published shape, bytes per weight, datasheet GPU): the bytes a batch-1 decode step reads
    at a short context (every layer weight and the LM head, one embedding row, bf16 KV; a 4-bit
    scheme's scales ignored) and the TPOT floor at the datasheet bandwidth. Computed, not measured."""
    rows = []
    for name, per_weight, gpu in pairs:
        sheet = datasheet_peak(gpu)
        step = step_work(published_config(name), [(1, 0, True)], dtype_bytes=per_weight, kv_dtype_bytes=2)
        floor = tpot_floor_s(step.total_bytes, sheet.bandwidth_gbps * 1e9)
        bits = {2: "bf16", 0.5: "4-bit"}.get(per_weight, f"{8 * per_weight:g}-bit")
        rows.append(
            {
                "model": name,
                "weights": bits,
                "bytes": step.total_bytes,
                "gpu": sheet.name,
                "bandwidth_gbps": sheet.bandwidth_gbps,
                "floor_s": floor,
            }
        )
    return rows


def format_floor_pairs(rows: Sequence[dict]) -> list[str]:
    """``floor_pairs``' rows as a table, marked computed."""
    lines = [
        f"{'model':<20} {'weights':>8} {'GB/step':>8}  {'GPU':<14} {'GB/s':>6} {'TPOT floor':>11} {'ceiling':>10}   [computed]"
    ]
    lines += [
        f"{r['model']:<20} {r['weights']:>8} {r['bytes'] / 1e9:>8.2f}  {r['gpu']:<14} {r['bandwidth_gbps']:>6.0f} "
        f"{r['floor_s'] * 1e3:>8.1f} ms {1 / r['floor_s']:>6.0f} tok/s"
        for r in rows
    ]
    return lines


def format_decode_projection(projected: Sequence[dict]) -> list[str]:
    """``projection.project_decode_mfu``'s rows as a table, marked a projection."""
    lines = [f"{'device':<14} {'TFLOP/s':>8} {'GB/s':>6} {'ridge':>7} {'decode TFLOP/s':>15} {'MFU':>7}   [projection]"]
    lines += [
        f"{r['device']:<14} {r['peak_tflops']:>8.0f} {r['bandwidth_gbps']:>6.0f} {r['ridge_flop_per_byte']:>7.0f} "
        f"{r['decode_tflops']:>15.3f} {format_percent(r['mfu_percent']):>7}"
        for r in projected
    ]
    return lines


def format_phase_times(rows: Sequence[dict]) -> list[str]:
    """``projection.project_phase_times``' rows as a table, marked a projection."""
    lines = [f"{'device':<14} {'TFLOP/s':>8} {'GB/s':>6} {'TTFT ms':>9} {'TPOT ms':>9}   [projection]"]
    lines += [
        f"{r['device']:<14} {r['peak_tflops']:>8.0f} {r['bandwidth_gbps']:>6.0f} {r['ttft_s'] * 1e3:>9.2f} "
        f"{r['tpot_s'] * 1e3:>9.3f}"
        for r in rows
    ]
    return lines


def format_thread_knob(rows: Sequence[dict]) -> list[str]:
    """``phase_levers.thread_knob``'s rows, then the all-threads-against-one ratios."""
    lines = [f"{'threads':>7} {'matmul GFLOP/s':>15} {'copy GB/s':>10} {'TTFT ms':>8} {'TPOT ms':>8}"]
    lines += [
        f"{r['threads']:>7} {r['matmul_flop_s'] / 1e9:>15.1f} {r['copy_bytes_s'] / 1e9:>10.1f} "
        f"{r['ttft_s'] * 1e3:>8.1f} {r['tpot_s'] * 1e3:>8.2f}"
        for r in rows
    ]
    many, few = rows[0], rows[-1]
    lines.append(
        f"\n{many['threads']} threads against {few['threads']}: the matmul ceiling "
        f"{many['matmul_flop_s'] / few['matmul_flop_s']:.2f}x, the copy {many['copy_bytes_s'] / few['copy_bytes_s']:.2f}x; "
        f"prefill {few['ttft_s'] / many['ttft_s']:.2f}x faster, decode {few['tpot_s'] / many['tpot_s']:.2f}x"
    )
    return lines


def decode_projection(b1: dict, model_config, context_tokens: int, peaks: Sequence[Peak]) -> dict:
    """Claim S18: batch-1 decode's MFU on every datasheet GPU, were it to read its bf16 bytes at the
    MBU ``b1`` (``decode_b1``) measured here against the last of ``peaks`` (the datasheet where this
    device has one). Returns ``judged`` (that peak's source), ``mbu_percent``, ``intensity`` (bf16
    FLOP/byte), ``projected`` (``project_decode_mfu``'s rows) and ``here`` (this device's label,
    peak TFLOP/s and measured MFU: the plot's star). A computation, not a measurement."""
    peak = peaks[-1]
    mbu = b1[peak.source]["mbu_percent"]
    intensity = decode_work(model_config, 1, context_tokens, 2).arithmetic_intensity_flop_per_byte
    label = f"this {peak.name}" if peak.source == "datasheet" else "this device (measured ceiling)"
    return {
        "judged": peak.source,
        "mbu_percent": mbu,
        "intensity": intensity,
        "projected": project_decode_mfu(min(mbu, 100.0), intensity),
        "here": (label, peak.peak_tflops, b1[peak.source]["mfu_percent"]),
    }


def phase_time_projection(
    engine: LLMEngine, prompt_tokens: int, b1: dict, context_tokens: int, peaks: Sequence[Peak]
) -> dict:
    """Claim S17 on a GPU, where no knob moves the FLOP/s alone: one prefill of ``prompt_tokens``
    is measured (after a warm-up) and, at its MFU and ``b1``'s decode MBU, both phases' times are
    projected on every datasheet (``project_phase_times``). Returns ``rows``, ``reading`` (one
    sentence) and ``lines`` to print."""
    judged = peaks[-1].source
    (row,) = prefill_batch_sweep(engine, prompt_tokens, [1], peaks=peaks, warmup=True)
    prefill_mfu, decode_mbu = row["utilization"][judged]["mfu_percent"], b1[judged]["mbu_percent"]
    cfg, dtype_bytes = engine.model_config, engine.dtype.itemsize
    rows = project_phase_times(
        prefill_work(cfg, prompt_tokens, dtype_bytes).total_flops,
        decode_work(cfg, 1, context_tokens, dtype_bytes).total_bytes,
        prefill_mfu_percent=min(prefill_mfu, 100.0),
        decode_mbu_percent=min(decode_mbu, 100.0),
    )
    reading = phase_projection_reading(rows)
    head = (
        f"at the {judged} prefill MFU ({format_percent(prefill_mfu)}) and decode MBU ({format_percent(decode_mbu)}) "
        "measured here:"
    )
    return {"rows": rows, "reading": reading, "lines": [head, *format_phase_times(rows), reading]}
