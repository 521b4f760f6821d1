"""A server's prefix-cache counters from its ``/metrics`` (``lab.server_metrics``): vLLM's text
summed over its engines, minieng's own exposition read back, and None (not an error) wherever a
server has no such counters."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client", reason="the server extra (pip install -e '.[serve]') is not installed")
pytest.importorskip("httpx", reason="the server extra (pip install -e '.[serve]') is not installed")

from minieng.lab import server_metrics as sm  # noqa: E402

# vLLM's exposition of the two counters with two engines (data parallel), as prometheus_client writes it.
VLLM_TEXT = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 300.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 960.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 48.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""


def test_vllms_counters_are_summed_over_its_engines_without_their_created_times():
    counters = sm.parse_prefix_cache_counters(VLLM_TEXT)
    assert counters == sm.PrefixCacheCounters("vllm:", 1200.0 + 300.0, 960.0 + 48.0)


def test_minienges_own_exposition_reads_back():
    from minieng.serve.metrics import ServerMetrics

    metrics = ServerMetrics("m", max_model_len=64, num_blocks=8, block_size=16)
    metrics.prefix_cache_queries.inc(80)
    metrics.prefix_cache_hits.inc(32)
    text, _ = metrics.render()
    assert sm.parse_prefix_cache_counters(text.decode()) == sm.PrefixCacheCounters("minieng:", 80.0, 32.0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        '{"detail": "Not Found"}',
        "<html><body>404</body></html>",
        "# TYPE sglang:cache_hit_rate gauge\nsglang:cache_hit_rate 0.5\n",  # a gauge, out of scope
        VLLM_TEXT.replace("vllm:prefix_cache_hits", "vllm:other_hits"),  # queries without hits
    ],
)
def test_text_without_both_counters_gives_none(text):
    assert sm.parse_prefix_cache_counters(text) is None


def test_the_delta_between_two_reads():
    before, after = sm.PrefixCacheCounters("vllm:", 1000, 200), sm.PrefixCacheCounters("vllm:", 1500, 600)
    assert sm.counted_between(before, after) == {"prefix": "vllm:", "queries": 500, "hits": 400, "hit_rate": 0.8}
    assert sm.counted_between(before, before)["hit_rate"] is None  # nothing queried: no rate, not 0
    assert sm.counted_between(None, after) is None and sm.counted_between(before, None) is None
    assert sm.counted_between(after, before) is None  # counters that went down: a restarted server
    assert sm.counted_between(before, sm.PrefixCacheCounters("minieng:", 1500, 600)) is None


@pytest.mark.parametrize(
    ("base_url", "url"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/metrics"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/metrics"),
        ("https://host/proxy/v1", "https://host/proxy/metrics"),
    ],
)
def test_metrics_live_at_the_servers_root(base_url, url):
    assert sm.metrics_url(base_url) == url


def test_a_server_without_metrics_gives_none():
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    from minieng.serve.server import ServerThread

    assert sm.read_prefix_cache_counters("http://127.0.0.1:9/v1", timeout_s=5) is None  # connection refused
    with ServerThread(FastAPI()) as server:  # no /metrics route: 404
        assert sm.read_prefix_cache_counters(server.base_url) is None
    app = FastAPI()
    app.get("/metrics", response_class=PlainTextResponse)(lambda: VLLM_TEXT)
    with ServerThread(app) as server:
        assert sm.read_prefix_cache_counters(server.base_url) == sm.PrefixCacheCounters("vllm:", 1500.0, 1008.0)
