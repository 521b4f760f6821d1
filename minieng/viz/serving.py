"""Serving's figures (notebook 10 and the bench): latency CDFs against SLOs, the step timeline, where each
request's time went, throughput against goodput.

Each function returns a matplotlib ``Figure`` (no pyplot state: headless-safe), its axes in units.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from minieng.measure.metrics import labeled_percentile
from minieng.viz.style import PHASE_COLORS, legend


def latency_cdfs(
    series: dict[str, Sequence[float]], slos_ms: dict[str, float] | None = None, title: str = "Latency distributions"
) -> Figure:
    """Empirical CDFs of latencies in ms, one panel per series (e.g. TTFT, TPOT, ITL), SLO lines dashed,
    P50 and P99 marked (the max, named "max of N", where fewer than 100 values cannot support a P99)."""
    slos_ms = slos_ms or {}
    fig = Figure(figsize=(4 * max(1, len(series)), 3.5), layout="constrained")
    axes = fig.subplots(1, max(1, len(series)), squeeze=False)[0]
    for ax, (name, values) in zip(axes, series.items()):
        v = np.sort(np.asarray(values, dtype=float))
        if len(v):
            ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post")
            for p, color in ((99, "tab:red"), (50, "tab:gray")):
                label, value = labeled_percentile(v, p)  # "max of 24" where the sample is too small for a P99
                ax.axvline(value, color=color, lw=0.8, label=f"{label}: {value:.0f} ms")
        if name in slos_ms:
            ax.axvline(slos_ms[name], color="black", ls="--", label=f"SLO {slos_ms[name]:g} ms")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests" if name != "ITL" else "fraction of gaps")
        ax.set_ylim(0, 1.02)
        legend(ax, fontsize=7)
    fig.suptitle(title)
    return fig


def step_timeline(
    steps, start_s: float, itl_points: Sequence[tuple[float, float]] = (), title: str = "What each step did"
) -> Figure:
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
    top.bar(
        t,
        [s.num_prefill_tokens for s in steps],
        width=width,
        align="edge",
        color=PHASE_COLORS["prefill"],
        label="prefill tokens",
    )
    top.set_ylabel("prefill tokens / step")
    twin = top.twinx()
    twin.step(t, [s.num_decode_seqs for s in steps], where="post", color=PHASE_COLORS["decode"], label="decode seqs")
    twin.set_ylabel("decode sequences / step", color=PHASE_COLORS["decode"])
    legend(top, loc="upper left", fontsize=8)
    bottom.plot(t, 1e3 * width, ".-", color="black", lw=0.8, ms=3, label="step time")
    if len(itl_points):
        it = np.array(itl_points, dtype=float)
        bottom.scatter(it[:, 0] - start_s, it[:, 1], s=6, color="tab:red", alpha=0.6, label="ITL")
    bottom.set_ylabel("ms")
    bottom.set_xlabel("time since start (s)")
    legend(bottom, loc="upper left", fontsize=8)
    fig.suptitle(title)
    return fig


def request_phases(timeline: Sequence[dict], title: str = "Where each request's time went") -> Figure:
    """One bar per request (arrival order, top down): waiting, prefill to the first token, and for
    a request handed off, the wait for the link, the KV transfer and the wait for the decode
    engine; then decode to the last token. Rows are ``disaggregation.ClusterRun.timeline()``'s
    (seconds; ``None`` transfer fields for a request not handed off)."""
    rows = sorted(timeline, key=lambda r: r["arrival_s"])
    fig = Figure(figsize=(9, max(2.5, 0.18 * len(rows) + 1.2)), layout="constrained")
    ax = fig.subplots()
    segments = [
        ("waiting", "arrival_s", "first_scheduled_s", "lightgray"),
        ("prefill", "first_scheduled_s", "first_token_s", PHASE_COLORS["prefill"]),
        ("link wait", "transfer_ready_s", "transfer_start_s", "silver"),
        ("KV transfer", "transfer_start_s", "transfer_end_s", "tab:green"),
        ("decode wait", "transfer_end_s", "decode_admitted_s", "gainsboro"),
        ("decode", "decode_admitted_s", "last_token_s", PHASE_COLORS["decode"]),
    ]
    for label, start, end, color in segments:
        spans = []
        for y, r in enumerate(rows):
            a = r[start]
            if a is None and label == "decode":  # not handed off: decode follows the first token
                a = r["first_token_s"]
            if a is not None and r[end] is not None and r[end] > a:
                spans.append((y, a, r[end] - a))
        if spans:
            ys, xs, ws = zip(*spans)
            ax.barh(ys, ws, left=xs, height=0.7, color=color, label=label)
    ax.invert_yaxis()
    ax.set_xlabel("time since the first arrival (s)")
    ax.set_ylabel("request (arrival order)")
    legend(ax, loc="lower right", fontsize=8)
    ax.set_title(title)
    return fig


def goodput_sweep(result: dict, title: str = "Raw throughput against goodput, per batch cap") -> Figure:
    """``goodput.batch_cap_sweep``'s points: output tok/s (left) and goodput in req/s
    with the share of requests that met the SLO (right), one bar per cap; the best of each starred."""
    points = result["points"]
    labels = [f"{p['max_num_seqs']} seqs\n{p['max_num_batched_tokens']} tok" for p in points]
    x = np.arange(len(points))
    fig = Figure(figsize=(max(6.0, 1.3 * len(points) + 3), 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.bar(x, [p["output_throughput_tok_s"] or 0 for p in points], color="tab:blue")
    right.bar(x, [p["goodput_req_s"] or 0 for p in points], color="tab:green")
    for ax, best, ylabel in (
        (left, result["best_throughput"], "output tok/s"),
        (right, result["best_goodput"], "goodput (req/s meeting the SLO)"),
    ):
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel(ylabel)
        ax.patches[best].set_edgecolor("black")
        ax.annotate("*", (best, ax.patches[best].get_height()), ha="center", va="bottom", fontsize=14)
    for i, p in enumerate(points):
        right.annotate(
            f"{p['num_good_requests']}/{p['num_requests']}",
            (i, 0),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 2),
            textcoords="offset points",
        )
    left.set_title("raw throughput")
    right.set_title("goodput")
    fig.suptitle(title)
    return fig
