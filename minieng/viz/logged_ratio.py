"""Notebook 01's figure of vLLM's logged throughputs: what the log's ratio follows, load by load.

Returns a matplotlib ``Figure`` (no pyplot state: headless-safe), its axes in units.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from minieng.viz.style import PHASE_COLORS, legend


def logged_ratio_figure(result: dict, title: str = "The logged ratio follows the load") -> Figure:
    """Two panels from a ``lab.logged_ratio_sweep`` result, one bar group per load.

    Left: the logged prompt / generation ratio (log scale) beside the load's prompt tokens per
    output token, with the article's 136.5x and this machine's physics ratio (prefill tok/s over
    batch-1 decode tok/s) as lines. Right: the logged prompt tok/s beside the prompt tokens the
    steps computed per second (hits excluded), and the logged generation tok/s.
    """
    loads = result["loads"]
    x = np.arange(len(loads))
    names = [load["label"].replace(", ", "\n", 1) for load in loads]
    fig = Figure(figsize=(11, 4.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    ratios = [load["whole"]["prompt_to_generation_ratio"] or np.nan for load in loads]
    left.bar(x - 0.2, ratios, 0.4, color="tab:purple", label="logged prompt / generation tok/s")
    left.bar(x + 0.2, [load["load_ratio"] for load in loads], 0.4, color="lightgray", label="prompt / output tokens")
    left.axhline(result["article"]["ratio"], color="black", ls="--", lw=1, label="the article's panel")
    if result.get("physics"):
        left.axhline(result["physics"]["ratio"], color="tab:red", ls=":", lw=1, label="physics here (b1)")
    left.set_yscale("log")
    left.set_ylabel("ratio (x)")
    left.set_title(title)
    w = [load["whole"] for load in loads]
    right.bar(
        x - 0.27, [s["prompt_throughput_tok_s"] for s in w], 0.27, color=PHASE_COLORS["prefill"], label="logged prompt"
    )
    right.bar(x, [s["computed_prompt_throughput_tok_s"] for s in w], 0.27, color="navajowhite", label="prompt computed")
    right.bar(
        x + 0.27,
        [s["generation_throughput_tok_s"] for s in w],
        0.27,
        color=PHASE_COLORS["decode"],
        label="logged generation",
    )
    right.set_yscale("log")
    right.set_ylabel("tok/s")
    right.set_title("What the log counts, and what was computed")
    for ax in (left, right):
        ax.set_xticks(x, names, fontsize=7)
        legend(ax, fontsize=7)
    return fig
