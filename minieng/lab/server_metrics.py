"""A server's prefix-cache counters, read from its Prometheus endpoint (``GET /metrics``): the hit
rate of a run of requests when the server's answers do not report ``usage.prompt_tokens_details.cached_tokens``
(vLLM without ``--enable-prompt-tokens-details``; ``lab.endpoint_prefix_cache``'s module docstring).

vLLM's v1 engine counts two counters per engine (labels ``model_name``, ``engine``;
``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``): ``vllm:prefix_cache_queries_total``, the
prompt tokens looked up in the cache, and ``vllm:prefix_cache_hits_total``, those it served. Both
count a request once, when the scheduler first admits it (``vllm/v1/core/kv_cache_manager.py``,
``get_computed_blocks``; a request resumed after a preemption goes to the separate
``preempted_queries`` of ``vllm/v1/metrics/stats.py``'s ``PrefixCacheStats``), and none for a request
that skips the cache (``prompt_logprobs``). So over a run of requests, hits delta / queries delta is
the tokens served from the cache over the prompt tokens, the same figure as the sum of the answers'
``cached_tokens`` over the sum of their ``prompt_tokens``. minieng's server counts the same, under
``minieng:`` (``serve.metrics``: ``StepRecord.prefix_cache_lookups``, at a request's first
admission, ``prompt_logprobs`` excluded), before the request's first token is streamed.

The deltas hold every request the server admitted between two reads: another client's requests
sent meanwhile count too. SGLang exposes its hit rate as a gauge (``sglang:cache_hit_rate``), not
as counters whose deltas cover chosen requests: out of scope here (its answers report
``cached_tokens`` with ``--enable-cache-report``).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIXES = ("vllm:", "minieng:")  # the servers whose counters are read, the first found wins
QUERIES = "prefix_cache_queries_total"
HITS = "prefix_cache_hits_total"


@dataclass(frozen=True)
class PrefixCacheCounters:
    """A server's prefix-cache counters at one read, summed over their labels (vLLM's engines and
    models): ``queries`` (prompt tokens looked up), ``hits`` (tokens the cache served), both in
    tokens since the server started, and the ``prefix`` they were read under (``"vllm:"``,
    ``"minieng:"``)."""

    prefix: str
    queries: float
    hits: float

    def since(self, earlier: PrefixCacheCounters) -> dict | None:
        """The tokens counted between ``earlier`` and this read: ``{"prefix", "queries", "hits",
        "hit_rate"}`` (``hit_rate``: hits / queries, None when nothing was queried). None when the
        two reads are of different servers' counters, or a counter went down (the server restarted)."""
        queries, hits = self.queries - earlier.queries, self.hits - earlier.hits
        if self.prefix != earlier.prefix or queries < 0 or hits < 0:
            return None
        return {
            "prefix": self.prefix,
            "queries": int(queries),
            "hits": int(hits),
            "hit_rate": hits / queries if queries > 0 else None,
        }


def metrics_url(base_url: str) -> str:
    """The ``/metrics`` URL of the server whose OpenAI API is at ``base_url`` (``http://host:port/v1``):
    vLLM, SGLang and minieng serve it at the server's root, beside ``/v1``, not under it."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return f"{root}/metrics"


def parse_prefix_cache_counters(text: str) -> PrefixCacheCounters | None:
    """The prefix-cache counters in ``text``, Prometheus' text format, parsed by prometheus_client
    (``parser.text_string_to_metric_families``): for the first of ``PREFIXES`` under which both
    ``prefix_cache_queries_total`` and ``prefix_cache_hits_total`` appear, each summed over its samples
    (one per label set; the counters' ``_created`` samples are not counts and are left out). None
    when neither server's pair is there, or ``text`` is not Prometheus' format.

    Raises:
        ImportError: prometheus_client is not installed (the serve extra: ``pip install 'minieng[serve]'``).
    """
    try:
        from prometheus_client.parser import text_string_to_metric_families  # lazy: the serve extra's
    except ImportError as e:
        raise ImportError("reading a server's /metrics needs prometheus_client: pip install 'minieng[serve]'") from e

    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    except (ValueError, TypeError, IndexError):  # what the parser raises on text that is not its format
        return None
    for prefix in PREFIXES:
        if prefix + QUERIES in sums and prefix + HITS in sums:
            return PrefixCacheCounters(prefix, sums[prefix + QUERIES], sums[prefix + HITS])
    return None


def read_prefix_cache_counters(base_url: str, timeout_s: float = 10.0) -> PrefixCacheCounters | None:
    """The prefix-cache counters of the server whose OpenAI API is at ``base_url`` (an
    ``Endpoint.base_url``), from ``GET /metrics`` at its root (``metrics_url``), with httpx as the
    load generator sends its requests (no credentials: vLLM's ``--api-key`` guards ``/v1`` only).
    None, not an error, when the server has no ``/metrics`` (connection refused, a timeout, an HTTP
    error status such as 404) or no prefix-cache counters there (``parse_prefix_cache_counters``).

    Raises:
        ImportError: httpx or prometheus_client is not installed (the serve extra).
    """
    try:
        import httpx  # lazy: the serve extra's, as in lab.endpoint
    except ImportError as e:
        raise ImportError("reading a server's /metrics needs httpx: pip install 'minieng[serve]'") from e

    try:
        response = httpx.get(metrics_url(base_url), timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return parse_prefix_cache_counters(response.text)


def counted_between(before: PrefixCacheCounters | None, after: PrefixCacheCounters | None) -> dict | None:
    """``after.since(before)``: the tokens the server's prefix cache was queried for and served
    between two reads; None when either read found no counters."""
    if before is None or after is None:
        return None
    return after.since(before)
