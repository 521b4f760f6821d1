"""The KV cache and batching's figures (notebook 05): recompute against cache, the pool's block tables,
the concurrency the pool allows, batch scaling, batching timelines and compared latency CDFs.

Each function returns a matplotlib ``Figure`` (no pyplot state: headless-safe), its axes in units.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import ScalarFormatter

from minieng.measure.metrics import labeled_percentile
from minieng.units import cdiv
from minieng.viz.style import PHASE_COLORS, legend


def recompute_vs_cache_figure(
    result: dict, knee_tokens: int | None = None, title: str = "Generating with and without the KV cache"
) -> Figure:
    """``lab.kv_cache.recompute_vs_cache``'s result in three panels: the wait for each token
    against the sequence length it is computed at (the prefill knee dotted, when given), the
    cumulative time, and the cumulative work (token-passes through the model) against the
    answer's length."""
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    wait, total, work = fig.subplots(1, 3)
    n = result["prompt_tokens"]
    styles = {"recompute": ("tab:red", "no cache: recompute the prefix"), "cache": ("tab:blue", "KV cache")}
    for side, (color, label) in styles.items():
        r = result[side]
        m = np.arange(1, len(r["token_s"]) + 1)
        wait.plot(n + m - 1, 1e3 * np.asarray(r["token_s"]), ".-", color=color, ms=3, lw=0.8, label=label)
        total.plot(m, np.cumsum(r["token_s"]), "-", color=color, label=label)
        work.plot(np.arange(1, len(r["tokens_run"]) + 1), np.cumsum(r["tokens_run"]), "-", color=color, label=label)
    if knee_tokens:
        wait.axvline(knee_tokens, color="grey", ls=":", label=f"prefill knee ({knee_tokens} tokens)")
    wait.set_xlabel("tokens in the sequence")
    wait.set_ylabel("wait for this token (ms)")
    wait.set_yscale("log")
    total.set_xlabel("answer length (tokens)")
    total.set_ylabel("time to generate it (s)")
    work.set_xlabel("answer length (tokens)")
    work.set_ylabel("token-passes through the model")
    for ax in (wait, total, work):
        legend(ax, fontsize=7)
    for ax in (total, work):
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    fig.suptitle(f"{title} ({n}-token prompt)")
    return fig


def block_tables(
    snapshot: dict, columns: int = 32, title: str = "The KV pool and the block tables of a live batch"
) -> Figure:
    """``lab.kv_cache.block_table_snapshot``: the pool's blocks in id order, coloured by the
    sequence holding them (white: free; hatched: a sequence's last, partly filled block), and
    below, each running sequence's block table: its blocks in token order, by physical id."""
    seqs = snapshot["sequences"]
    bs, num_blocks = snapshot["block_size"], snapshot["num_blocks"]
    columns = max(1, min(columns, num_blocks))
    pool_rows = cdiv(num_blocks, columns)
    width = max([columns] + [len(s["block_table"]) for s in seqs])  # one cell size for both panels
    margin = 6  # cells' worth of room on the left for the tables' labels
    fig = Figure(
        figsize=(0.3 * (width + margin) + 0.5, 1.4 + 0.36 * (pool_rows + max(len(seqs), 1))), layout="constrained"
    )
    pool, tables = fig.subplots(2, 1, height_ratios=[max(pool_rows, 1), max(len(seqs), 1)])
    colors = [f"C{i % 10}" for i in range(len(seqs))]
    owner, last = {}, set()
    for i, s in enumerate(seqs):
        for block in s["block_table"]:
            owner[block] = i
        if s["block_table"] and s["num_tokens"] % bs:
            last.add(s["block_table"][-1])
    for block in range(num_blocks):
        row, col = divmod(block, columns)
        i = owner.get(block)
        pool.add_patch(
            Rectangle(
                (col, -row - 1),
                0.95,
                0.9,
                facecolor="white" if i is None else colors[i],
                edgecolor="grey",
                lw=0.5,
                hatch="//" if block in last else None,
            )
        )
        pool.text(
            col + 0.47,
            -row - 0.55,
            str(block),
            ha="center",
            va="center",
            fontsize=6,
            color="black" if i is None else "white",
        )
    pool.set_xlim(-margin, width)
    pool.set_ylim(-pool_rows - 0.1, 0.1)
    pool.set_axis_off()
    pool.set_title(
        f"KV pool: {num_blocks} blocks of {bs} tokens, {snapshot['num_free_blocks']} free (white)", fontsize=9
    )
    for r, (s, color) in enumerate(zip(seqs, colors)):
        for j, block in enumerate(s["block_table"]):
            tables.add_patch(
                Rectangle(
                    (j, -r - 1),
                    0.95,
                    0.9,
                    facecolor=color,
                    edgecolor="grey",
                    lw=0.5,
                    hatch="//" if block in last else None,
                )
            )
            tables.text(j + 0.47, -r - 0.55, str(block), ha="center", va="center", fontsize=6, color="white")
        tables.text(
            -0.2, -r - 0.55, f"request {s['request_id']}: {s['num_tokens']} tokens", ha="right", va="center", fontsize=7
        )
    tables.set_xlim(-margin, width)
    tables.set_ylim(-max(len(seqs), 1) - 0.1, 0.1)
    tables.set_axis_off()
    tables.set_title("block tables: logical block 0, 1, 2, ... of each sequence -> physical block id", fontsize=9)
    fig.suptitle(title)
    return fig


def kv_concurrency(result: dict, title: str = "The KV pool caps the batch") -> Figure:
    """``lab.kv_cache.concurrency_run``: sequences in each step, with the caps from the pool (at
    prompt length and at full length) and ``max_num_seqs`` (drawn when it is near them, else named
    in the title), blocks in use (right axis) and preemptions (red ticks)."""
    fig = Figure(figsize=(8, 3.6), layout="constrained")
    ax = fig.add_subplot()
    steps = np.arange(1, len(result["running"]) + 1)
    ax.step(steps, result["running"], where="post", color="tab:blue", label="sequences in the step")
    highest = max(max(result["running"], default=0), result["cap_at_prompt"], 1)
    caps = [
        (f"pool / {result['prompt_tokens']}-token prompts", result["cap_at_prompt"], "tab:green", "--"),
        (
            f"pool / {result['prompt_tokens'] + result['output_tokens']}-token sequences",
            result["cap_at_full_length"],
            "tab:red",
            "--",
        ),
    ]
    if result["max_num_seqs"] <= 2 * highest:
        highest = max(highest, result["max_num_seqs"])
        caps.insert(0, ("max_num_seqs", result["max_num_seqs"], "black", "-"))
    else:
        title = f"{title} (max_num_seqs = {result['max_num_seqs']}, off the chart)"
    for label, value, color, style in caps:
        ax.axhline(value, color=color, ls=style, lw=0.8, label=f"{label}: {value}")
    pre = [s for s, n in zip(steps, result["preempted"]) if n]
    if pre:
        ax.plot(pre, [0] * len(pre), "|", color="tab:red", ms=12, label="preemption")
    ax.set_xlabel("step")
    ax.set_ylabel("sequences")
    ax.set_ylim(0, 1.15 * highest)
    twin = ax.twinx()
    twin.plot(steps, 100 * np.asarray(result["used_blocks"]) / result["num_blocks"], color="grey", lw=0.8, alpha=0.6)
    twin.set_ylabel("KV blocks in use (%)", color="grey")
    twin.set_ylim(0, 105)
    legend(ax, fontsize=7, loc="upper right")
    ax.set_title(title)
    return fig


def batch_scaling(
    rows: Sequence[dict],
    knee_batch: int | None = None,
    compute_bound_batch: int | None = None,
    pool_batch: int | None = None,
    title: str = "Decode: one batch, many sequences",
) -> Figure:
    """``batching.decode_point`` rows: aggregate tok/s (left) and TPOT (right) against the
    batch, each beside what proportional scaling from batch 1 would give; dotted lines where
    tok/s stopped growing, where the roofline says the step turns compute-bound, and where the
    KV pool runs out (each when given and within reach of the axes)."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    rows = sorted(rows, key=lambda r: r["batch_size"])
    b = np.array([r["batch_size"] for r in rows], dtype=float)
    tok_s = np.array([r["tok_s"] for r in rows])
    tpot_ms = np.array([1e3 * r["tpot_s"] for r in rows])
    base = rows[0]
    left.plot(b, tok_s, "o-", color=PHASE_COLORS["decode"], label="aggregate tok/s (measured)")
    left.plot(
        b, base["tok_s"] * b / base["batch_size"], ":", color="grey", label=f"x batch, from batch {base['batch_size']}"
    )
    right.plot(b, tpot_ms, "o-", color=PHASE_COLORS["decode"], label="TPOT (measured)")
    right.plot(
        b, tpot_ms[0] * b / base["batch_size"], ":", color="grey", label=f"x batch, from batch {base['batch_size']}"
    )
    top = b.max() * 2
    for value, label, color in (
        (knee_batch, "tok/s stops growing", "black"),
        (compute_bound_batch, "roofline: compute-bound", "tab:orange"),
        (pool_batch, "KV pool full", "tab:red"),
    ):
        if value and value <= top:
            for ax in (left, right):
                ax.axvline(value, color=color, ls="--", lw=0.8, label=f"{label} ({value})")
    left.set_ylabel("aggregate decode tok/s")
    right.set_ylabel("TPOT (ms)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())  # 1, 2, 4, ... rather than 2^0, 2^1, ...
        ax.set_yscale("log")
        ax.set_xlabel("batch size (sequences decoding together)")
        legend(ax, fontsize=7)
    fig.suptitle(title)
    return fig


def batching_timeline(runs: dict[str, dict], title: str = "Sequences in each step") -> Figure:
    """``batching.compare_batching``'s runs: the sequences each step ran against time,
    one panel per policy, on shared time and sequence axes."""
    fig = Figure(figsize=(9, 1.2 + 1.6 * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    for ax, (name, run) in zip(axes, runs.items()):
        steps = np.asarray(run["steps"], dtype=float).reshape(-1, 3)
        ax.bar(steps[:, 0], steps[:, 2], width=steps[:, 1], align="edge", color=PHASE_COLORS["decode"])
        ax.set_ylabel("sequences")
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1].set_xlabel("time since the first arrival (s)")
    fig.suptitle(title)
    return fig


def compared_cdfs(
    runs: dict[str, dict[str, Sequence[float]]],
    metrics: Sequence[str] = ("ttft_ms", "tpot_ms", "e2el_ms"),
    title: str = "Latency distributions, same arrivals",
) -> Figure:
    """Empirical CDFs of per-request latencies (ms), one panel per metric key, one line per run
    (``name -> {metric: values}``), P99 marked on each (the max, named "max of N", below 100 values)."""
    fig = Figure(figsize=(4 * len(metrics), 3.5), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, key in zip(axes, metrics):
        for i, (name, run) in enumerate(runs.items()):
            v = np.sort(np.asarray(run[key], dtype=float))
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", color=f"C{i}", label=name)
                tail, value = labeled_percentile(v, 99)  # "max of N" below the 100 values a P99 needs
                ax.axvline(value, color=f"C{i}", ls=":", lw=0.8, label=f"{tail}: {value:.0f} ms")
        ax.set_xlabel(key.replace("_ms", "").upper() + " (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        legend(ax, fontsize=7)
    fig.suptitle(title)
    return fig
