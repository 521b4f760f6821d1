"""Notebook 07's closing claims table (S5: the hit rate drives TTFT; S19: the cheapest lever on TTFT;
the block-size floor; the multi-turn hit rate) and its sweep's figure, from what the notebook measured
on its backend (``lab.backend``: an engine here, or a server through its API)."""

from __future__ import annotations

from minieng.course import verdicts
from minieng.course.kit import claims_table
from minieng.lab.endpoint_prefix_cache import endpoint_hit_rate_pair
from minieng.lab.prefix_caching import block_floor_verdict, multi_turn_verdict
from minieng.viz import curve
from minieng.viz import ttft_vs_hit_rate_figure

NOT_MEASURED = "not measured through the API"


def figure(result: dict, backend):
    """TTFT against the hit rate (``viz.ttft_vs_hit_rate_figure``); through a server that reports no
    cached tokens, TTFT against the shared share of the prompt instead. Captioned by the backend."""
    if result["cached_tokens_reported"] or result.get("hit_rate_source"):
        return backend.caption(ttft_vs_hit_rate_figure(result))
    pts = sorted(result["points"], key=lambda p: p["shared_tokens"] / p["prompt_tokens"])
    fig = curve(
        [100 * p["shared_tokens"] / p["prompt_tokens"] for p in pts],
        {"P50 TTFT": [p["ttft_ms"]["p50"] for p in pts]},
        "shared share of the prompt (%, the server's counts)",
        "TTFT (ms)",
        "TTFT against the shared share: hit rate not reported",
    )
    return backend.caption(fig)


def _s5(res: dict, noise) -> tuple[str, str]:
    cold = res["cold"]["ttft_ms"]["p50"]
    try:
        near, high = endpoint_hit_rate_pair(res)  # the highest hit rate, and the lower point nearest 85.5%
    except ValueError as why:  # no hit rates reported, or none that differ
        return "no two hit rates to compare", verdicts.not_testable(str(why))
    n, h = near["ttft_ms"]["p50"], high["ttft_ms"]["p50"]
    said = (
        f"{high['hit_rate']:.1%} -> {h:.0f} ms, {near['hit_rate']:.1%} -> {n:.0f} ms ({n / h:.1f}x, computing "
        f"{near['uncached_tokens'] / high['uncached_tokens']:.1f}x the tokens); cold {cold:.0f} ms"
    )
    return said, verdicts.s5_hit_rate(
        n / 1e3,
        h / 1e3,
        cold / 1e3,
        uncached_near=near["uncached_tokens"],
        uncached_high=high["uncached_tokens"],
        uncached_cold=res["cold"]["uncached_tokens"],
        noise=noise,
    )


def _s19(backend, levers: dict | None, prompt_tokens: int) -> tuple[str, str]:
    if levers is None:
        return NOT_MEASURED, verdicts.not_testable(backend.why_not("levers"))
    by_lever = levers["levers"]
    saved = "; ".join(f"{name} {1e3 * lever['ttft_saved_s']:+.0f} ms" for name, lever in by_lever.items())
    cache = by_lever["prefix caching"]
    said = (
        f"{prompt_tokens}-token prompt, TTFT saved: {saved}; prefix caching {cache['extra_flops'] / 1e9:+.1f} GFLOP, "
        f"{cache['extra_memory_bytes'] / 2**20:.1f} MiB of K/V kept; quantization: notebook 08"
    )
    return said, verdicts.s19_cheapest(
        {name: (lever["baseline_ttft_s"], lever["ttft_s"]) for name, lever in by_lever.items()},
        extra_flops={name: lever["extra_flops"] for name, lever in by_lever.items()},
        costs={"memory bytes": {name: lever["extra_memory_bytes"] for name, lever in by_lever.items()}},
        noise=getattr(levers, "noise", None),
    )


def table(*, backend, res, levers: dict | None, turns: list[dict] | None):
    """The claims table of notebook 07. ``res``: ``backend.hit_rate_sweep``'s result (a ``CachedResult``
    on the engine: its ``.noise`` judges); ``levers``: ``prefix_caching.ttft_levers``' (None through an
    API); ``turns``: ``prefix_caching.multi_turn``'s (None through an API)."""
    noise = getattr(res, "noise", None)
    if backend.has_steps:
        floor = block_floor_verdict(res)
    else:
        floor = (NOT_MEASURED, verdicts.not_testable("the server's block size is not in its API"))
    if turns:
        climb = f"turn 1 {turns[0]['hit_rate']:.0%} -> turn {turns[-1]['turn']} {turns[-1]['hit_rate']:.0%}"
        multi = (climb, multi_turn_verdict(turns))
    else:
        multi = (NOT_MEASURED, verdicts.not_testable(backend.why_not("multi_turn")))
    rows = [
        ("S5: the hit rate drives TTFT", "97% -> 0.87 s, 85.5% -> 1.72 s (2.0x)", *_s5(res, noise)),
        (
            "S19: prefix caching is the cheapest lever on TTFT",
            "(qualitative)",
            *_s19(backend, levers, res["prompt_tokens"]),
        ),
        ("block-size floor: a prefix under one block never hits", "(not in the articles)", *floor),
        ("multi-turn: the hit rate climbs with the history", "(the article's chat use case)", *multi),
    ]
    if not backend.has_steps:
        rows = [(claim, article, f"{backend.label}: {said}", v) for claim, article, said, v in rows]
    return claims_table(rows, noise=noise)
