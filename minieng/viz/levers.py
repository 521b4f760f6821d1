"""The scheduling levers' figures (notebooks 06, 07 and 09): chunked prefill, prefix caching,
speculative decoding.

Each function returns a matplotlib ``Figure`` (no pyplot state: headless-safe), its axes in units.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from minieng.measure.metrics import common_tail
from minieng.viz.style import PHASE_COLORS, legend


def _run_label(run: dict) -> str:
    policy = "chunking off" if run["budget_tokens"] is None else f"chunking on, budget {run['budget_tokens']} tokens"
    return f"{policy}: worst gap {run['worst_itl_ms']:.0f} ms, newcomer TTFT {run['ttft_ms']:.0f} ms"


def chunked_itl_traces(runs: Sequence[dict], title: str = "A long prompt arrives while others decode") -> Figure:
    """``chunked_prefill.long_prompt_run`` results, one panel each on shared axes: every decoder's
    inter-token gaps against time since the newcomer arrived (each gap a step over the interval it
    lasted, a dot at the token that ended it), the newcomer's wait (arrival to first token) shaded,
    and the decoders' gap before the arrival dashed."""
    fig = Figure(figsize=(9, 2.6 * max(1, len(runs)) + 0.6), layout="constrained")
    axes = fig.subplots(max(1, len(runs)), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    for ax, run in zip(axes, runs):
        ax.axvspan(
            0,
            run["ttft_ms"] / 1e3,
            color=PHASE_COLORS["prefill"],
            alpha=0.15,
            label=f"newcomer waits for its first token ({run['long_prompt_tokens']}-token prompt)",
        )
        for i, trace in enumerate(run["traces"]):
            # Each gap drawn over the time it lasted: from the token before to the token ending it.
            t = np.array(trace, dtype=float).reshape(-1, 2)
            ax.step(
                t[:, 0],
                t[:, 1],
                where="pre",
                marker=".",
                lw=0.8,
                ms=4,
                color=PHASE_COLORS["decode"],
                alpha=0.6,
                label="each decoder's inter-token gaps" if i == 0 else None,
            )
        ax.axhline(
            run["baseline_itl_ms"],
            color="black",
            ls="--",
            lw=0.8,
            label=f"gap before the arrival: {run['baseline_itl_ms']:.0f} ms",
        )
        ax.set_ylabel("ITL (ms)")
        ax.set_ylim(bottom=0)
        ax.set_title(_run_label(run), fontsize=9)
        legend(ax, fontsize=7, loc="upper right")
    axes[-1].set_xlabel("time since the long prompt arrived (s)")
    fig.suptitle(title)
    return fig


def chunked_prefill_tradeoff(
    sweep: dict, title: str = "The token budget: the decoders' worst gap, the newcomer's TTFT"
) -> Figure:
    """``chunked_prefill.budget_sweep``'s result: against the token budget, the decoders' worst
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
        legend(ax, fontsize=8)
    fig.suptitle(f"{title} ({sweep['long_prompt_tokens']}-token prompt, {sweep['num_decoders']} decoders)")
    return fig


def ttft_vs_hit_rate_figure(result: dict, title: str = "Prefix caching: TTFT against hit rate") -> Figure:
    """``prefix_caching.ttft_vs_hit_rate``'s result: P50/P99 TTFT (ms; the max where a point has under 100
    requests) per measured hit rate, the
    cold run (the engine's with its cache off; an endpoint's, prompts that share nothing), the proportional expectation (cold x (1 - hit rate)), and the article's two points (s,
    right axis: another machine and model, so compare the shape, not the values)."""
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    pts = sorted(result["points"], key=lambda p: p["hit_rate"])
    hits = [p["hit_rate"] * 100 for p in pts]
    cold = result["cold"]["ttft_ms"]["p50"]
    ax.plot(hits, [p["ttft_ms"]["p50"] for p in pts], "o-", color=PHASE_COLORS["prefill"], label="P50 TTFT")
    tail, key = common_tail([p["ttft_ms"] for p in pts])  # the max, "max of N", below the 100 a P99 needs
    ax.plot(
        hits, [p["ttft_ms"][key] for p in pts], "s--", color=PHASE_COLORS["prefill"], alpha=0.5, label=f"{tail} TTFT"
    )
    # the engine's cold run switches its cache off; through an API the cold prompts share nothing
    cold_label = "nothing shared" if result["cold"].get("cache") else "cache off"
    ax.axhline(cold, color="black", lw=0.8, label=f"{cold_label}: {cold:.0f} ms")
    grid = np.linspace(0, 100, 50)
    ax.plot(grid, cold * (1 - grid / 100), ":", color="grey", label="cold x (1 - hit rate)")
    ax.set_xlabel("prefix cache hit rate (% of prompt tokens)")
    ax.set_ylabel(f"TTFT (ms), {result['prompt_tokens']}-token prompts")
    ax.set_xlim(-2, 102)
    ax.set_ylim(bottom=0)
    article = ax.twinx()
    article.scatter(
        [p["hit_rate"] * 100 for p in result["article_points"]],
        [p["ttft_s"] for p in result["article_points"]],
        marker="*",
        s=120,
        color="tab:purple",
        label="Nascimento's article (s, right axis)",
    )
    article.set_ylabel("article's TTFT (s)", color="tab:purple")
    article.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()
    article_handles = article.get_legend_handles_labels()
    ax.legend(handles[0] + article_handles[0], handles[1] + article_handles[1], fontsize=8, loc="lower left")
    ax.set_title(title)
    return fig


def speculative_sweep(result: dict, title: str = "Speculative decoding against k") -> Figure:
    """``speculative.k_sweep``'s result: tokens per step (measured and expected from the
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
    legend(left, fontsize=8)
    right.plot(ks, [r["measured_speedup_x"] for r in rows], "o-", label="measured TPOT(0) / TPOT(k)")
    right.plot(ks, [r["predicted_speedup_x"] for r in rows], "s--", label="predicted E / (k c + v)")
    right.axhline(1, color="black", lw=0.8)
    right.set_xlabel("draft tokens per step, k")
    right.set_ylabel("speedup over plain decoding (x)")
    right.set_ylim(bottom=0)
    legend(right, fontsize=8)
    fig.suptitle(f"{title} ({result.get('drafter', '')})")
    return fig
