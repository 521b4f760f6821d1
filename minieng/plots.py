"""Figures, each a function returning a matplotlib ``Figure`` (no pyplot state: headless-safe).

Axes carry units. Notebooks display the returned figure; the bench saves it with ``--plot DIR``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from .flops import format_percent
from .hardware import Peak

PHASE_COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}


def _legend(ax, **kwargs) -> None:
    """A legend only where something labelled was drawn: a figure of no data asks for none
    (matplotlib warns "No artists with labels found to put in legend")."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def roofline(peaks: Sequence[Peak], points: Sequence[tuple[str, float, float]],
             title: str = "Roofline") -> Figure:
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
        ax.plot(grid, roof, style, color="black",
                label=f"{pk.source}: {pk.peak_tflops:.3g} TFLOP/s, {pk.bandwidth_gbps:.3g} GB/s, "
                      f"ridge {pk.ridge_flop_per_byte:.3g} FLOP/B")
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
    _legend(ax, fontsize=7, loc="lower right")
    return fig


def latency_cdfs(series: dict[str, Sequence[float]], slos_ms: dict[str, float] | None = None,
                 title: str = "Latency distributions") -> Figure:
    """Empirical CDFs of latencies in ms, one panel per series (e.g. TTFT, TPOT, ITL), SLO lines dashed."""
    slos_ms = slos_ms or {}
    fig = Figure(figsize=(4 * max(1, len(series)), 3.5), layout="constrained")
    axes = fig.subplots(1, max(1, len(series)), squeeze=False)[0]
    for ax, (name, values) in zip(axes, series.items()):
        v = np.sort(np.asarray(values, dtype=float))
        if len(v):
            ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post")
            ax.axvline(np.percentile(v, 99), color="tab:red", lw=0.8, label=f"P99 {np.percentile(v, 99):.0f} ms")
            ax.axvline(np.percentile(v, 50), color="tab:gray", lw=0.8, label=f"P50 {np.percentile(v, 50):.0f} ms")
        if name in slos_ms:
            ax.axvline(slos_ms[name], color="black", ls="--", label=f"SLO {slos_ms[name]:g} ms")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests" if name != "ITL" else "fraction of gaps")
        ax.set_ylim(0, 1.02)
        _legend(ax, fontsize=7)
    fig.suptitle(title)
    return fig


def step_timeline(steps, start_s: float, itl_points: Sequence[tuple[float, float]] = (),
                  title: str = "What each step did") -> Figure:
    """Per step: prefill tokens and decode sequences (top), step duration and ITL (bottom).

    Args:
        steps: ``StepRecord``s (start_s, duration_s, num_prefill_tokens, num_decode_seqs).
        start_s: the run's t = 0 (perf_counter seconds).
        itl_points: ``(time_s, gap_ms)`` of inter-token gaps, time as perf_counter seconds.
    """
    fig = Figure(figsize=(9, 5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    t = np.array([s.start_s - start_s for s in steps])
    width = np.array([s.duration_s for s in steps])
    top.bar(t, [s.num_prefill_tokens for s in steps], width=width, align="edge",
            color=PHASE_COLORS["prefill"], label="prefill tokens")
    top.set_ylabel("prefill tokens / step")
    twin = top.twinx()
    twin.step(t, [s.num_decode_seqs for s in steps], where="post", color=PHASE_COLORS["decode"], label="decode seqs")
    twin.set_ylabel("decode sequences / step", color=PHASE_COLORS["decode"])
    _legend(top, loc="upper left", fontsize=8)
    bottom.plot(t, 1e3 * width, ".-", color="black", lw=0.8, ms=3, label="step time")
    if len(itl_points):
        it = np.array(itl_points, dtype=float)
        bottom.scatter(it[:, 0] - start_s, it[:, 1], s=6, color="tab:red", alpha=0.6, label="ITL")
    bottom.set_ylabel("ms")
    bottom.set_xlabel("time since start (s)")
    _legend(bottom, loc="upper left", fontsize=8)
    fig.suptitle(title)
    return fig


def utilization_trace(series: dict[str, tuple[Sequence[float], Sequence[float | None]]],
                      title: str = "Utilization over time") -> Figure:
    """Percent-valued series against time, each with its own time base: ``name -> (times_s,
    values)`` (NVML samples every 0.1 s, MFU per engine step). None values (N/A) are gaps,
    never drawn as 0."""
    fig = Figure(figsize=(9, 3.5), layout="constrained")
    ax = fig.add_subplot()
    for name, (times_s, values) in series.items():
        y = np.array([np.nan if v is None else v for v in values], dtype=float)
        ax.plot(np.asarray(times_s, dtype=float)[:len(y)], y, label=name, drawstyle="steps-post")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("percent")
    ax.set_ylim(bottom=0)
    _legend(ax, fontsize=8)
    ax.set_title(title)
    return fig


def curve(xs: Sequence[float], ys: dict[str, Sequence[float]], xlabel: str, ylabel: str, title: str,
          logx: bool = False, logy: bool = False) -> Figure:
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
    _legend(ax, fontsize=8)
    return fig


def phase_costs(prompt_tokens: Sequence[int], ttft_ms: Sequence[float], output_tokens: Sequence[int],
                decode_ms: Sequence[float]) -> Figure:
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


def ttft_vs_hit_rate(result: dict, title: str = "Prefix caching: TTFT against hit rate") -> Figure:
    """``prefix_experiment.ttft_vs_hit_rate``'s result: P50/P99 TTFT (ms) per measured hit rate, the
    cold run, the proportional expectation (cold x (1 - hit rate)), and the seed's two points (s,
    right axis: another machine and model, so compare the shape, not the values)."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    pts = sorted(result["points"], key=lambda p: p["hit_rate"])
    hits = [p["hit_rate"] * 100 for p in pts]
    cold = result["cold"]["ttft_ms"]["p50"]
    ax.plot(hits, [p["ttft_ms"]["p50"] for p in pts], "o-", color=PHASE_COLORS["prefill"], label="P50 TTFT")
    ax.plot(hits, [p["ttft_ms"]["p99"] for p in pts], "s--", color=PHASE_COLORS["prefill"], alpha=0.5, label="P99 TTFT")
    ax.axhline(cold, color="black", lw=0.8, label=f"cache off: {cold:.0f} ms")
    grid = np.linspace(0, 100, 50)
    ax.plot(grid, cold * (1 - grid / 100), ":", color="grey", label="cold x (1 - hit rate)")
    ax.set_xlabel("prefix cache hit rate (% of prompt tokens)")
    ax.set_ylabel(f"TTFT (ms), {result['prompt_tokens']}-token prompts")
    ax.set_xlim(-2, 102)
    ax.set_ylim(bottom=0)
    seed = ax.twinx()
    seed.scatter([p["hit_rate"] * 100 for p in result["seed_points"]], [p["ttft_s"] for p in result["seed_points"]],
                 marker="*", s=120, color="tab:purple", label="seed article (s, right axis)")
    seed.set_ylabel("seed article TTFT (s)", color="tab:purple")
    seed.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()
    seed_handles = seed.get_legend_handles_labels()
    ax.legend(handles[0] + seed_handles[0], handles[1] + seed_handles[1], fontsize=8, loc="lower left")
    ax.set_title(title)
    return fig


def speculative_sweep(result: dict, title: str = "Speculative decoding against k") -> Figure:
    """``spec_experiment.k_sweep``'s result: tokens per step (measured and expected from the
    acceptance rate) and speedup (measured and predicted from a, c and v) against k."""
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    rows = result["rows"]
    ks = [r["k"] for r in rows]
    left.plot(ks, [r["tokens_per_step"] for r in rows], "o-", label="measured")
    left.plot(ks, [r.get("expected_tokens_per_step", 1) for r in rows], "s--", label="(1 - a^(k+1)) / (1 - a)")
    left.plot(ks, [k + 1 for k in ks], ":", color="grey", label="k + 1 (every draft accepted)")
    left.set_xlabel("draft tokens per step, k")
    left.set_ylabel("tokens per verification step")
    _legend(left, fontsize=8)
    right.plot(ks, [r["measured_speedup_x"] for r in rows], "o-", label="measured TPOT(0) / TPOT(k)")
    right.plot(ks, [r["predicted_speedup_x"] for r in rows], "s--", label="predicted E / (k c + v)")
    right.axhline(1, color="black", lw=0.8)
    right.set_xlabel("draft tokens per step, k")
    right.set_ylabel("speedup over plain decoding (x)")
    right.set_ylim(bottom=0)
    _legend(right, fontsize=8)
    fig.suptitle(f"{title} ({result.get('drafter', '')})")
    return fig


def top_ops_figure(shares: dict, title: str = "Where a decode step's time goes") -> Figure:
    """A horizontal bar per op (``util_experiment.op_shares``' ``top_ops``): its share of the wall time, matrix
    products in one colour, every other op and the time outside any op in another."""
    rows = shares["top_ops"][::-1]
    fig = Figure(figsize=(8, 0.35 * len(rows) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    ax.barh([name for name, _, _ in rows], [100 * us / shares["wall_us"] for _, us, _ in rows],
            color=["tab:blue" if is_mm else "tab:gray" for _, _, is_mm in rows])
    ax.set_xlabel("share of the steps' wall time (%)")
    ax.set_title(f"{title}: matrix products (blue) {format_percent(100 * shares['matmul_share'])}, "
                 f"the rest {format_percent(100 * (1 - shares['matmul_share']))}", fontsize=9)
    ax.tick_params(axis="y", labelsize=8)
    return fig


def _run_label(run: dict) -> str:
    policy = "chunking off" if run["budget_tokens"] is None else f"chunking on, budget {run['budget_tokens']} tokens"
    return f"{policy}: worst gap {run['worst_itl_ms']:.0f} ms, newcomer TTFT {run['ttft_ms']:.0f} ms"


def chunked_itl_traces(runs: Sequence[dict], title: str = "A long prompt arrives while others decode") -> Figure:
    """``chunked_experiment.long_prompt_run`` results, one panel each on shared axes: every decoder's
    inter-token gaps against time since the newcomer arrived (each gap a step over the interval it
    lasted, a dot at the token that ended it), the newcomer's wait (arrival to first token) shaded,
    and the decoders' gap before the arrival dashed."""
    fig = Figure(figsize=(9, 2.6 * max(1, len(runs)) + 0.6), layout="constrained")
    axes = fig.subplots(max(1, len(runs)), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    for ax, run in zip(axes, runs):
        ax.axvspan(0, run["ttft_ms"] / 1e3, color=PHASE_COLORS["prefill"], alpha=0.15,
                   label=f"newcomer waits for its first token ({run['long_prompt_tokens']}-token prompt)")
        for i, trace in enumerate(run["traces"]):
            # Each gap drawn over the time it lasted: from the token before to the token ending it.
            t = np.array(trace, dtype=float).reshape(-1, 2)
            ax.step(t[:, 0], t[:, 1], where="pre", marker=".", lw=0.8, ms=4, color=PHASE_COLORS["decode"], alpha=0.6,
                    label="each decoder's inter-token gaps" if i == 0 else None)
        ax.axhline(run["baseline_itl_ms"], color="black", ls="--", lw=0.8,
                   label=f"gap before the arrival: {run['baseline_itl_ms']:.0f} ms")
        ax.set_ylabel("ITL (ms)")
        ax.set_ylim(bottom=0)
        ax.set_title(_run_label(run), fontsize=9)
        _legend(ax, fontsize=7, loc="upper right")
    axes[-1].set_xlabel("time since the long prompt arrived (s)")
    fig.suptitle(title)
    return fig


def chunked_prefill_tradeoff(sweep: dict, title: str = "The token budget: the decoders' worst gap, the newcomer's TTFT"
                             ) -> Figure:
    """``chunked_experiment.budget_sweep``'s result: against the token budget, the decoders' worst
    inter-token gap (left) and the newcomer's TTFT (right), medians over the repeats; chunking
    off drawn as a dashed line on both."""
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2, sharex=True)
    on, off = sweep["on"], sweep["off"]
    budgets = [r["budget_tokens"] for r in on]
    left.plot(budgets, [r["worst_itl_ms"] for r in on], "o-", color=PHASE_COLORS["decode"], label="chunking on")
    left.axhline(off["worst_itl_ms"], color="black", ls="--", label=f"chunking off: {off['worst_itl_ms']:.0f} ms")
    left.axhline(off["baseline_itl_ms"], color="grey", ls=":", label=f"no newcomer: {off['baseline_itl_ms']:.0f} ms")
    left.set_ylabel("decoders' worst gap (ms)")
    right.plot(budgets, [r["ttft_ms"] for r in on], "o-", color=PHASE_COLORS["prefill"], label="chunking on")
    right.axhline(off["ttft_ms"], color="black", ls="--", label=f"chunking off: {off['ttft_ms']:.0f} ms")
    right.set_ylabel("newcomer's TTFT (ms)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.minorticks_off()
        ax.set_xlabel("token budget per step, max_num_batched_tokens")
        ax.set_ylim(bottom=0)
        _legend(ax, fontsize=8)
    fig.suptitle(f"{title} ({sweep['long_prompt_tokens']}-token prompt, {sweep['num_decoders']} decoders)")
    return fig
