"""Notebook 07 through the API (``lab.endpoint``'s ``ENDPOINT`` parameter): TTFT against the prefix
cache's hit rate (``endpoint_hit_rate_point``, ``endpoint_hit_rate_sweep``, ``endpoint_hit_rate_pair``)
and its table (``format_hit_rate_sweep``).

The prefix cache's share is OpenAI's ``usage.prompt_tokens_details.cached_tokens``. vLLM reports it
with ``--enable-prompt-tokens-details`` and leaves it out when it is 0
(``vllm/entrypoints/openai/serving_completion.py``: ``if self.enable_prompt_tokens_details and
num_cached_tokens``), SGLang with ``--enable-cache-report``, minieng always. So a request without it
counts 0 once any request of the same sweep reported it. When none did, a point's hit rate is the
server's own prefix-cache counters over its timed requests, read from its ``/metrics`` before and
after them (``server_metrics``: vLLM's ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``,
minieng's ``minieng:`` ones); a server with neither has none, and the results say "not reported by
this server" rather than guess. Each point says which (``hit_rate_source``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from minieng.lab.endpoint import NOT_REPORTED, Endpoint, _corpus, _cut, _texts, send_one
from minieng.lab.prefix_caching import ARTICLE_POINTS, hit_rate_pair
from minieng.lab.server_metrics import counted_between, read_prefix_cache_counters
from minieng.measure.metrics import common_tail, served_from_cache, summarize_ms

HIT_RATE_SOURCES = {
    "engine": "from the engine's record of each request (its cached tokens); the cold point with the cache off",
    "usage": "from each answer's usage.prompt_tokens_details.cached_tokens",
    "metrics": "from the server's /metrics: {prefix}prefix_cache_hits_total / {prefix}prefix_cache_queries_total "
    "over each point's timed requests (its answers do not report cached_tokens)",
}


def _shared_prompts(endpoint: Endpoint, prompt_tokens: int, share: float, count: int, rng) -> tuple[str, list[str]]:
    """A shared prefix of about ``share`` of a ``prompt_tokens``-token prompt ("" for 0) and ``count``
    prompts of about ``prompt_tokens`` tokens that begin with it, each then a distinct turn."""
    chars = max(2, round(prompt_tokens * endpoint.chars_per_token))
    shared_chars = round(share * chars)
    shared = _cut(_corpus(), int(rng.integers(0, len(_corpus()) - chars - 100)), shared_chars) if shared_chars else ""
    turn_tokens = max(1, round((chars - len(shared) - 1) / endpoint.chars_per_token))
    turns = _texts(endpoint, turn_tokens, count, rng)
    return shared, [f"{shared} {t}" if shared else t for t in turns]


def endpoint_hit_rate_point(
    endpoint: Endpoint,
    prompt_tokens: int,
    share: float,
    requests: int,
    absent_is_zero: bool = False,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
) -> dict:
    """One point of notebook 07's sweep through the API: ``requests`` prompts of about
    ``prompt_tokens`` tokens whose first ``share`` (of the characters, cut at a word) is one shared
    system prompt, each sent alone and answered in one token, after the shared prefix was sent alone
    (untimed) so the server's cache holds it. With ``share`` 0 the prompts share nothing (the cold
    point: an API cannot switch a server's cache off, but no cache serves a prefix it never saw), and
    one distinct prompt goes first, untimed, as a warm-up.

    ``absent_is_zero``: count a request whose usage lacks ``cached_tokens`` as 0 (vLLM leaves the field
    out when it is 0: the module docstring); ``endpoint_hit_rate_sweep`` sets it once any request of
    the sweep reported the field. The server's prefix-cache counters are read from its ``/metrics``
    after the untimed request and after the timed ones (``server_metrics``), so they count the timed
    requests alone. Returns a JSON-serializable dict of ``HitRatePoint``'s fields
    (``shared_tokens``: the server's count of the shared prefix alone; ``user_tokens``: the mean prompt
    count beyond it; ``hit_rate``: cached / prompt tokens over the timed requests, from their usage or
    else the counters' hits / queries, None when neither reported it; ``ttft_ms``: ``summarize_ms``;
    ``cache``: True; ``uncached_tokens``: mean prompt - cached tokens, None when not reported) and
    ``share``, ``prompt_tokens`` (mean count), ``cached_tokens`` (per request, None where not
    reported), ``prefix_cache_counted`` (the counters' deltas: ``PrefixCacheCounters.since``; None
    without them), ``hit_rate_source`` (``"usage"``, ``"metrics"`` or None) and ``server``.
    Raises ``ValueError`` for a share outside [0, 1) or ``requests`` < 1; ``RuntimeError`` for a failed request.
    """
    if not 0 <= share < 1 or requests < 1:
        raise ValueError(f"share={share} must lie in [0, 1) and requests={requests} be >= 1")
    rng = rng if rng is not None else np.random.default_rng(seed)
    shared, prompts = _shared_prompts(endpoint, prompt_tokens, share, requests + (0 if share else 1), rng)
    if shared:
        shared_tokens = send_one(endpoint, shared, 1).prompt_tokens  # the cache now holds its full blocks
    else:
        send_one(endpoint, prompts.pop(0), 1)  # a warm-up, as the engine's cold point runs one first
        shared_tokens = 0
    before = read_prefix_cache_counters(endpoint.base_url)  # after the untimed request: it is not counted
    runs = [send_one(endpoint, p, 1) for p in prompts]
    after = read_prefix_cache_counters(endpoint.base_url) if before is not None else None
    point = {
        "share": share,
        "shared_tokens": shared_tokens,
        "prompt_tokens": statistics.mean(r.prompt_tokens for r in runs),
        "ttft_ms": summarize_ms(r.ttft_s for r in runs),
        "cache": True,
        "cached_tokens": [r.cached_tokens for r in runs],
        "prefix_cache_counted": counted_between(before, after),
        "server": endpoint.label,
    }
    point["user_tokens"] = point["prompt_tokens"] - shared_tokens
    return _with_hit_rate(point, [r.prompt_tokens for r in runs], absent_is_zero)


def _with_hit_rate(point: dict, prompts: list[int], absent_is_zero: bool) -> dict:
    """``point`` with ``hit_rate``, ``uncached_tokens`` and ``hit_rate_source``: from its per-request
    ``cached_tokens`` ("usage"; a missing one is unknown unless ``absent_is_zero``), else from its
    ``prefix_cache_counted`` ("metrics": hits / queries, computed = (queries - hits) / requests),
    else None."""
    cached = served_from_cache(point["cached_tokens"], absent_is_zero)
    counted = point.get("prefix_cache_counted")
    point["prompt_token_counts"] = prompts
    if cached is not None:
        point["hit_rate"], point["hit_rate_source"] = cached / sum(prompts), "usage"
        point["uncached_tokens"] = (sum(prompts) - cached) / len(prompts)
    elif counted is not None and counted["hit_rate"] is not None:
        point["hit_rate"], point["hit_rate_source"] = counted["hit_rate"], "metrics"
        point["uncached_tokens"] = (counted["queries"] - counted["hits"]) / len(prompts)
    else:
        point["hit_rate"], point["uncached_tokens"], point["hit_rate_source"] = None, None, None
    return point


def endpoint_hit_rate_sweep(
    endpoint: Endpoint,
    prompt_tokens: int,
    shares: Sequence[float] = (0.0, 0.01, 0.25, 0.5, 0.75, 0.9, 0.97),
    requests: int = 4,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
) -> dict:
    """``prefix_caching.ttft_vs_hit_rate`` through the API: a cold point (``share`` 0: distinct
    prompts) and one ``endpoint_hit_rate_point`` per share, in the dict that sweep returns, so
    ``prefix_caching.hit_rate_pair`` and notebook 07's figure read it. Each point's prompts are cut from
    fresh places of the text: no point hits what an earlier one (or an earlier run, ``seed=None``) left.

    Returns:
        ``server``, ``prompt_tokens`` (asked), ``block_size`` (None: the server's is not in its API),
        ``cold``, ``points``, ``article_points``, ``cached_tokens_reported`` (whether any request of
        the sweep reported ``cached_tokens``) and ``hit_rate_source``: "usage" when one did, else
        "metrics" when the server's ``/metrics`` counted a point's requests, else None (every hit
        rate None: ``NOT_REPORTED``).
    Raises:
        ValueError: no share, a share outside [0, 1), or ``requests`` < 1.
    """
    if not shares:
        raise ValueError("endpoint_hit_rate_sweep: give one or more shares")
    rng = rng if rng is not None else np.random.default_rng(seed)
    cold = endpoint_hit_rate_point(endpoint, prompt_tokens, 0.0, requests, rng=rng)
    points = [endpoint_hit_rate_point(endpoint, prompt_tokens, s, requests, rng=rng) for s in shares]
    reported = any(c is not None for p in [cold, *points] for c in p["cached_tokens"])
    for p in [cold, *points]:
        _with_hit_rate(p, p["prompt_token_counts"], absent_is_zero=reported)
    sources = {p["hit_rate_source"] for p in [cold, *points]}
    return {
        "server": endpoint.label,
        "prompt_tokens": prompt_tokens,
        "block_size": None,
        "cold": cold,
        "points": points,
        "article_points": [{"hit_rate": h, "ttft_s": t} for h, t in ARTICLE_POINTS],
        "cached_tokens_reported": reported,
        "hit_rate_source": "usage" if reported else ("metrics" if "metrics" in sources else None),
    }


def endpoint_hit_rate_pair(result: dict) -> tuple[dict, dict]:
    """``prefix_caching.hit_rate_pair`` of ``endpoint_hit_rate_sweep``'s result: the highest hit rate
    and the lower point nearest the article's 85.5%, which claim S5 compares.

    Raises:
        ValueError: a point has no hit rate (the server neither reported cached tokens nor counted
            them in ``/metrics``: ``NOT_REPORTED``), or every point hit alike (its prefix cache off,
            or prompts too short for a block).
    """
    if any(p["hit_rate"] is None for p in [result["cold"], *result["points"]]):
        raise ValueError(f"hit rates {NOT_REPORTED}")
    if len({p["hit_rate"] for p in result["points"]}) < 2:
        raise ValueError(
            "every point of the sweep hit alike: is the server's prefix cache on (vLLM: on by default; "
            "--no-enable-prefix-caching turns it off), and are the prompts longer than one of its blocks?"
        )
    return hit_rate_pair(result)


def format_hit_rate(point: dict) -> str:
    """A point's hit rate as a notebook prints it: ``"90.0%"``, or "not reported"."""
    return "not reported" if point["hit_rate"] is None else f"{point['hit_rate']:.1%}"


def format_hit_rate_sweep(result: dict) -> list[str]:
    """``endpoint_hit_rate_sweep``'s (or an ``EngineBackend.hit_rate_sweep``'s) result as notebook 07's table: per point the shared tokens (the
    server's count), the hit rate and computed tokens (from its usage, else its ``/metrics``, or "not
    reported"), P50 and tail TTFT (the P99 where 100 requests support it, else the max) and the
    speed-up over cold; then where the hit rates came from (``HIT_RATE_SOURCES``, or ``NOT_REPORTED``)."""
    cold = result["cold"]["ttft_ms"]["p50"]
    tail, key = common_tail([result["cold"]["ttft_ms"]] + [p["ttft_ms"] for p in result["points"]])
    lines = [
        f"measured: {result['server']}; prompts of about {result['prompt_tokens']} tokens",
        f"{'shared tokens':>13} {'hit rate':>12} {'computed tokens':>16} {'P50 TTFT ms':>12} {tail + ' TTFT ms':>15} "
        f"{'faster than cold':>17}",
    ]
    cold_name = "cold" if result["cold"]["cache"] else "cache off"
    for name, p in [(cold_name, result["cold"])] + [(str(p["shared_tokens"]), p) for p in result["points"]]:
        computed = "?" if p["uncached_tokens"] is None else f"{p['uncached_tokens']:.0f}"
        lines.append(
            f"{name:>13} {format_hit_rate(p):>12} {computed:>16} {p['ttft_ms']['p50']:>12.1f} {p['ttft_ms'][key]:>15.1f} "
            f"{cold / p['ttft_ms']['p50']:>16.2f}x"
        )
    if result["cold"]["cache"]:
        lines.append(
            "(cold: prompts that share nothing, which no cache can serve; an API cannot switch the server's cache off)"
        )
    source = result["hit_rate_source"]
    if source is None:
        lines.append(f"hit rates: {NOT_REPORTED}; nor counted in its /metrics (vllm:prefix_cache_hits_total)")
    else:
        counted = [
            p["prefix_cache_counted"] for p in [result["cold"], *result["points"]] if p.get("prefix_cache_counted")
        ]
        lines.append(f"hit rates: {HIT_RATE_SOURCES[source].format(prefix=counted[0]['prefix'] if counted else '')}")
    return lines
