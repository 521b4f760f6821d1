"""The two phases' figures (notebooks 00-04 and 08): the roofline, curves against prompt or output length,
the cost of each phase, decode's bytes, the utilization trace, where a step's time goes, quantization.

Each function returns a matplotlib ``Figure`` (no pyplot state: headless-safe), its axes in units.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from minieng.measure.peaks import Peak
from minieng.measure.roofline import format_percent
from minieng.viz.style import PHASE_COLORS, legend


def roofline(peaks: Sequence[Peak], points: Sequence[tuple[str, float, float]], title: str = "Roofline") -> Figure:
    """Attainable FLOP/s = min(peak, intensity x bandwidth) for each ``Peak``, with measured points.

    Args:
        peaks: rooflines to draw (e.g. the measured ceilings and the datasheet).
        points: ``(label, arithmetic intensity FLOP/byte, achieved FLOP/s)``; a label starting
            with "prefill" or "decode" takes that phase's colour.
    """
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    xs = [p[1] for p in points] + [pk.ridge_flop_per_byte for pk in peaks]
    lo, hi = min(xs + [0.1]) / 4, max(xs + [10]) * 4
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    for pk, style in zip(peaks, ["-", "--", ":"]):
        roof = np.minimum(pk.peak_tflops * 1e12, grid * pk.bandwidth_gbps * 1e9)
        ax.plot(
            grid,
            roof,
            style,
            color="black",
            label=f"{pk.source}: {pk.peak_tflops:.3g} TFLOP/s, {pk.bandwidth_gbps:.3g} GB/s, "
            f"ridge {pk.ridge_flop_per_byte:.3g} FLOP/B",
        )
        ax.axvline(pk.ridge_flop_per_byte, color="grey", lw=0.5, ls=style)
    for label, intensity, flops in points:
        phase = label.split()[0]
        ax.scatter([intensity], [flops], color=PHASE_COLORS.get(phase, "tab:green"), zorder=3)
        ax.annotate(label, (intensity, flops), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(title)
    legend(ax, fontsize=7, loc="lower right")
    return fig


def curve(
    xs: Sequence[float],
    ys: dict[str, Sequence[float]],
    xlabel: str,
    ylabel: str,
    title: str,
    logx: bool = False,
    logy: bool = False,
) -> Figure:
    """A plain labelled line plot (sweeps: TTFT vs prompt length, tok/s vs batch size)."""
    fig = Figure(figsize=(6, 3.8), layout="constrained")
    ax = fig.add_subplot()
    for name, y in ys.items():
        ax.plot(xs, y, "o-", label=name)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    legend(ax, fontsize=8)
    return fig


def phase_costs(
    prompt_tokens: Sequence[int], ttft_ms: Sequence[float], output_tokens: Sequence[int], decode_ms: Sequence[float]
) -> Figure:
    """Two panels: TTFT against prompt length, decode time against output length, one point per request."""
    fig = Figure(figsize=(9, 3.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.scatter(prompt_tokens, ttft_ms, color=PHASE_COLORS["prefill"])
    left.set_xlabel("prompt tokens")
    left.set_ylabel("TTFT (ms)")
    left.set_title("prefill cost follows the prompt")
    right.scatter(output_tokens, decode_ms, color=PHASE_COLORS["decode"])
    right.set_xlabel("output tokens")
    right.set_ylabel("decode time, E2EL - TTFT (ms)")
    right.set_title("decode cost follows the answer")
    for ax in (left, right):
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    return fig


def decode_bytes_and_tpot(rows: Sequence[dict], title: str = "Decode: the KV cache joins the weights") -> Figure:
    """Per context length: what a decode step reads (weights and KV cache, stacked, MB) and its
    TPOT (ms): measured, against the floor bytes / bandwidth.

    ``rows``: dicts with ``context_tokens``, ``weight_bytes`` and ``kv_bytes`` (per step),
    ``tpot_s`` (measured) and ``floor_s``; the same batch throughout.
    """
    rows = sorted(rows, key=lambda r: r["context_tokens"])
    ctx = [r["context_tokens"] for r in rows]
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    pos = np.arange(len(rows))
    weights = np.array([r["weight_bytes"] for r in rows]) / 1e6
    kv = np.array([r["kv_bytes"] for r in rows]) / 1e6
    left.bar(pos, weights, color="tab:gray", label="weights")
    left.bar(pos, kv, bottom=weights, color=PHASE_COLORS["decode"], label="KV cache")
    left.set_xticks(pos, [f"{c:,}" for c in ctx], fontsize=8)
    left.set_xlabel("context tokens per sequence")
    left.set_ylabel("MB read per decode step")
    legend(left, fontsize=8, loc="upper left")
    right.plot(ctx, [1e3 * r["tpot_s"] for r in rows], "o-", color=PHASE_COLORS["decode"], label="measured TPOT")
    right.plot(ctx, [1e3 * r["floor_s"] for r in rows], "s--", color="black", label="floor: bytes / bandwidth")
    right.set_xlabel("context tokens per sequence")
    right.set_ylabel("ms per decode step")
    right.set_ylim(bottom=0)
    legend(right, fontsize=8, loc="upper left")
    fig.suptitle(title)
    return fig


def utilization_trace(
    series: dict[str, tuple[Sequence[float], Sequence[float | None]]], title: str = "Utilization over time"
) -> Figure:
    """Percent-valued series against time, each with its own time base: ``name -> (times_s,
    values)`` (NVML samples every 0.1 s, MFU per engine step). None values (N/A) are gaps,
    never drawn as 0."""
    fig = Figure(figsize=(9, 3.5), layout="constrained")
    ax = fig.add_subplot()
    for name, (times_s, values) in series.items():
        y = np.array([np.nan if v is None else v for v in values], dtype=float)
        ax.plot(np.asarray(times_s, dtype=float)[: len(y)], y, label=name, drawstyle="steps-post")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("percent")
    ax.set_ylim(bottom=0)
    legend(ax, fontsize=8)
    ax.set_title(title)
    return fig


def top_ops_figure(shares: dict, title: str = "Where a decode step's time goes") -> Figure:
    """A horizontal bar per op (``gpu_utilization.op_shares``' ``top_ops``): its share of the wall time, matrix
    products in one colour, every other op and the time outside any op in another."""
    rows = shares["top_ops"][::-1]
    fig = Figure(figsize=(8, 0.35 * len(rows) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    ax.barh(
        [name for name, _, _ in rows],
        [100 * us / shares["wall_us"] for _, us, _ in rows],
        color=["tab:blue" if is_mm else "tab:gray" for _, _, is_mm in rows],
    )
    ax.set_xlabel("share of the steps' wall time (%)")
    ax.set_title(
        f"{title}: matrix products (blue) {format_percent(100 * shares['matmul_share'])}, "
        f"the rest {format_percent(100 * (1 - shares['matmul_share']))}",
        fontsize=9,
    )
    ax.tick_params(axis="y", labelsize=8)
    return fig


def quantization_ratios(result: dict, title: str = "Quantization: time against the float model, per phase") -> Figure:
    """``lab.quantization.run_quantization``'s result: per scheme, TTFT and each batch's TPOT as a
    ratio to the float model (bars: measured; black marks: the roofline's prediction, bytes for
    decode and FLOP rate for prefill). Below 1 is faster."""
    rows = result["rows"][1:]
    batches = result["config"]["batch_sizes"]
    series = [("ttft", f"TTFT, {result['config']['prompt_tokens']}-token prefill", PHASE_COLORS["prefill"])]
    series += [(f"tpot_b{b}", f"TPOT, decode batch {b}", PHASE_COLORS["decode"]) for b in batches]
    fig = Figure(figsize=(1.8 + 1.6 * max(1, len(rows)) * len(series) / 2, 4), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (key, label, color) in enumerate(series):
        xs = np.arange(len(rows)) + (i - (len(series) - 1) / 2) * width
        ax.bar(
            xs, [r[f"{key}_ratio"] for r in rows], width * 0.9, color=color, alpha=1.0 - 0.25 * min(i, 2), label=label
        )
        ax.scatter(
            xs,
            [r[f"{key}_ratio_predicted"] for r in rows],
            marker="_",
            s=300,
            color="black",
            zorder=3,
            label="predicted (bytes for decode, FLOP rate for prefill)" if i == 0 else None,
        )
    ax.axhline(1, color="black", lw=0.8)
    ax.set_xticks(np.arange(len(rows)), [r["scheme"] for r in rows])
    ax.set_ylabel("time / float model's time")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    legend(ax, fontsize=7)
    return fig


def decode_mfu_projection(
    rows: Sequence[dict],
    reader: tuple[str, float, float] | None = None,
    title: str = "Projected: batch-1 decode's MFU on each datasheet device",
) -> Figure:
    """Batch-1 decode's MFU against each device's peak FLOP/s, projected from an MBU measured here
    (``projection.project_decode_mfu``'s rows: ``device``, ``peak_tflops``, ``mfu_percent``), each
    point named; the reader's device marked apart with its measured MFU.

    Args:
        rows: the projection, one dict per device.
        reader: ``(label, peak TFLOP/s, measured MFU in percent)`` of the device measured here, or
            None (nothing measured to mark).
    """
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    xs = [r["peak_tflops"] for r in rows]
    ys = [r["mfu_percent"] for r in rows]
    ax.scatter(xs, ys, color=PHASE_COLORS["decode"], label="projected from the MBU measured here (datasheets)")
    for r in rows:
        ax.annotate(
            r["device"], (r["peak_tflops"], r["mfu_percent"]), textcoords="offset points", xytext=(4, 3), fontsize=7
        )
    if reader is not None:
        label, peak, mfu = reader
        ax.scatter([peak], [mfu], marker="*", s=220, color="tab:red", zorder=3, label=f"measured here: {label}")
        ax.annotate(label, (peak, mfu), textcoords="offset points", xytext=(6, -10), fontsize=8, color="tab:red")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("peak FLOP/s of the device (TFLOP/s, dense)")
    ax.set_ylabel("batch-1 decode MFU (%)")
    ax.set_title(title, fontsize=10)
    legend(ax, fontsize=7, loc="lower left")
    return fig
