"""Notebook 07's closing claims table (S5: the hit rate drives TTFT; S19: the cheapest lever on TTFT;
the block-size floor; the multi-turn hit rate) and its sweep's figure, from what the notebook measured
on its backend (``lab.backend``: an engine here, or a server through its API). S19 weighs the levers
notebook 07 measures against those notebooks 08 (quantization) and 11 (threads) stored in the results
folder on this machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from minieng.course import verdicts
from minieng.course.kit import CachedResult, _stored_noise, claims_table, results_dir
from minieng.device import host_memory_bytes, usable_cores
from minieng.lab.endpoint_prefix_cache import endpoint_hit_rate_pair
from minieng.lab.prefix_caching import block_floor_verdict, multi_turn_verdict
from minieng.measure import harness
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


def stored_result(name: str, match: dict, directory: Path | None = None) -> CachedResult | None:
    """The newest result ``kit.cached`` stored under ``name`` in the results folder (``directory``, else
    the course's) that ``cached`` would read back here (the same environment: machine, torch, minieng,
    smoke switch), among those whose parameters include ``match``: another notebook's measurement on
    this machine. None when that notebook has not run here."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # as ``cached`` picks it
    where = json.loads(json.dumps(harness.environment(device) | {"smoke": harness.smoke_mode()}, default=str))
    found = []
    for path in results_dir(directory).glob(f"{name}-*.json"):
        if not re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{16}}\.json", path.name):
            continue  # another name that starts with this one
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        params = kept.get("params") or {}
        if kept.get("environment") == where and all(params.get(k) == v for k, v in match.items()):
            found.append(kept)
    if not found:
        return None
    newest = max(found, key=lambda kept: kept.get("measured_at") or "")
    return CachedResult(newest["result"], _stored_noise(newest.get("noise")), newest.get("measured_at"), True)


def other_levers(engine, model_name: str, cold_s: float, directory: Path | None = None) -> dict:
    """The levers on TTFT that notebooks 08 and 11 measured on this machine, for this model, device and
    dtype, carried onto notebook 07's prompt by their measured TTFT ratio (a rate lever speeds every
    prompt past the knee alike): ``cold_s`` is that prompt's TTFT with the cache off, all threads, float.

    - quantization (notebook 08's ``quantization``): its scheme with the lowest TTFT ratio to float,
      ``(cold_s, cold_s x ratio)``; it frees the weight bytes it saves and changes ``1 - agreement``
      of the greedy tokens;
    - threads (notebook 11's ``thread_knob``, on a CPU only): all threads against one,
      ``(cold_s / ratio, cold_s)``; it holds the extra cores.

    Returns ``ttft_s`` (name -> (without, with)), ``costs`` (resource -> {name: amount}), ``said``
    (one line each), ``noises`` (the stored results' ``Noise``) and ``missing`` (the notebooks to run
    for a lever not stored here)."""
    out = {"ttft_s": {}, "costs": {}, "said": [], "noises": [], "missing": []}
    match = {"model": model_name, "dtype": str(engine.dtype)}
    quant = stored_result("quantization", match | {"device": str(engine.device)}, directory)
    if quant is None:
        out["missing"].append("08")
    else:
        rows = {row["scheme"]: row for row in quant["rows"]}
        schemes = [row for name, row in rows.items() if name != "none"]
        if schemes and "none" in rows:
            best = min(schemes, key=lambda row: row["ttft_ratio"])
            freed = best["weight_bytes"] - rows["none"]["weight_bytes"]
            out["ttft_s"]["quantization"] = (cold_s, cold_s * best["ttft_ratio"])
            out["costs"].setdefault("memory bytes", {})["quantization"] = freed
            out["costs"].setdefault("tokens changed", {})["quantization"] = 1 - best["agreement"]
            out["said"].append(
                f"quantization ({best['scheme']}): {best['ttft_ratio']:.2f}x TTFT, {freed / 2**20:+.0f} MiB of weights, "
                f"{best['agreement']:.0%} of tokens agree (notebook 08)"
            )
            out["noises"].append(quant.noise)
    if engine.device.type == "cpu":  # a GPU's FLOP/s do not move with the host's threads
        knob = stored_result("thread_knob", match, directory)
        if knob is None:
            out["missing"].append("11")
        else:
            most, one = max(knob["rows"], key=lambda r: r["threads"]), min(knob["rows"], key=lambda r: r["threads"])
            if most["threads"] > one["threads"]:
                ratio = most["ttft_s"] / one["ttft_s"]
                out["ttft_s"]["threads"] = (cold_s / ratio, cold_s)
                out["costs"].setdefault("cores", {})["threads"] = most["threads"] - one["threads"]
                out["said"].append(f"threads ({one['threads']} -> {most['threads']}): {ratio:.2f}x TTFT (notebook 11)")
                out["noises"].append(knob.noise)
    return out


def _capacity(engine) -> dict[str, float]:
    """What the machine has of the resources the levers hold: the engine device's memory and the cores."""
    if engine.device.type == "cuda":
        memory = torch.cuda.get_device_properties(engine.device).total_memory
    else:
        memory = host_memory_bytes()[0]
    return ({"memory bytes": memory} if memory else {}) | {"cores": usable_cores()}


def _largest_noise(noises):
    """The largest relative timing noise among results (None when none was recorded)."""
    relative = [r for r in (getattr(n, "relative", n) for n in noises) if r is not None]
    return max(relative) if relative else None


def _s19(backend, levers: dict | None, prompt_tokens: int) -> tuple[str, str]:
    if levers is None:
        return NOT_MEASURED, verdicts.not_testable(backend.why_not("levers"))
    by_lever = levers["levers"]
    cache = by_lever["prefix caching"]
    ttft_s = {name: (lever["baseline_ttft_s"], lever["ttft_s"]) for name, lever in by_lever.items()}
    costs = {"memory bytes": {name: lever["extra_memory_bytes"] for name, lever in by_lever.items()}}
    more = other_levers(backend.engine, backend.model.name, cache["baseline_ttft_s"])
    ttft_s |= more["ttft_s"]
    for resource, amounts in more["costs"].items():
        costs.setdefault(resource, {}).update(amounts)
    saved = "; ".join(f"{name} {1e3 * (without - with_):+.0f} ms" for name, (without, with_) in ttft_s.items())
    said = (
        f"{prompt_tokens}-token prompt, TTFT saved: {saved}; prefix caching {cache['extra_flops'] / 1e9:+.1f} GFLOP, "
        f"{cache['extra_memory_bytes'] / 2**20:.1f} MiB of K/V kept"
    )
    said += "".join(f"; {line}" for line in more["said"])
    missing = more["missing"]
    unmeasured = f"run notebook{'s' if len(missing) > 1 else ''} {' and '.join(missing)} first" if missing else None
    return said, verdicts.s19_cheapest(
        ttft_s,
        extra_flops={name: lever["extra_flops"] for name, lever in by_lever.items()},
        costs=costs,
        capacity=_capacity(backend.engine),
        unmeasured=unmeasured,
        noise=_largest_noise([getattr(levers, "noise", None), *more["noises"]]),
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
