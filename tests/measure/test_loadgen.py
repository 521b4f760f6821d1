"""The load generator's own figures: the prefix cache's share read from the server's usage, and prompts
that follow ``--seed``.

A real server on loopback (``ServerThread``) over the embedded default model; the engine's own
record of what its prefix cache served is the reference.
"""

from __future__ import annotations

import pytest

pytest.importorskip("httpx", reason="the server extra (pip install -e '.[serve]') is not installed")
pytest.importorskip("fastapi", reason="the server extra (pip install -e '.[serve]') is not installed")

from minieng.lab.report import format_serving  # noqa: E402
from minieng.measure.workloads import RequestSpec  # noqa: E402
from minieng.measure.loadgen import LoadRequest, load_requests, run_load, stream_figures  # noqa: E402
from minieng.serve.server import ServerThread, build_app  # noqa: E402

pytestmark = pytest.mark.real_model


def test_the_hit_rate_equals_the_engines_record_on_a_shared_prefix_workload(real_engine):
    """Six prompts that share 48 tokens, sent one after another: the server's cache serves the shared
    blocks from the second request on, and loadgen's count (from each usage block) is the engine's."""
    engine = real_engine(block_size=16, enable_prefix_caching=True)
    shared = list(range(1000, 1048))
    requests = [LoadRequest(0.4 * i, shared + list(range(2000 + 16 * i, 2016 + 16 * i)), 2) for i in range(6)]
    finished = []
    with ServerThread(build_app(engine, "default", on_finished=finished.append)) as server:
        result = run_load(server.base_url, "default", requests, progress=False)
    assert result.errors == []
    engine_cached = sum(out.num_cached_tokens for out in finished)
    summary = result.summary()
    assert engine_cached >= 48 and summary.cached_prompt_tokens == engine_cached
    assert summary.prefix_cache_hit_rate == pytest.approx(engine_cached / summary.total_prompt_tokens)
    report = {"metrics": summary.to_dict(), "workload": _workload(requests)}
    assert any("of prompt tokens served from the cache" in line for line in format_serving(report))


def test_prompts_follow_the_seed(default_model):
    specs = [RequestSpec(0.0, 64, 4) for _ in range(4)]
    first = load_requests(specs, default_model.tokenizer, as_text=False, seed=1)
    assert [r.prompt for r in first] == [r.prompt for r in load_requests(specs, default_model.tokenizer, False, 1)]
    other = load_requests(specs, default_model.tokenizer, as_text=False, seed=2)
    assert all(a.prompt != b.prompt for a, b in zip(first, other))


def test_a_server_that_does_not_report_cached_tokens_has_no_hit_rate():
    usage = {"prompt_tokens": 10, "completion_tokens": 2}
    chunks = [(1.0, {"choices": [{"text": "a"}]}), (2.0, {"choices": [{"text": "b", "finish_reason": "length"}]})]
    silent = stream_figures(0.0, [*chunks, (2.0, {"choices": [], "usage": usage})], chat=False)
    details = dict(usage, prompt_tokens_details={"cached_tokens": 4})
    told = stream_figures(0.0, [*chunks, (2.0, {"choices": [], "usage": details})], chat=False)
    assert silent.cached_tokens is None and told.cached_tokens == 4
    from minieng.measure.metrics import serving_metrics

    assert serving_metrics([silent]).prefix_cache_hit_rate is None
    mixed = serving_metrics([silent, told])  # vLLM leaves out a 0: once one request said, silence is 0
    assert mixed.cached_prompt_tokens == 4 and mixed.prefix_cache_hit_rate == pytest.approx(4 / 20)
    report = {"metrics": serving_metrics([silent]).to_dict(), "workload": _workload([LoadRequest(0.0, "x", 2)])}
    assert any("did not report cached prompt tokens" in line for line in format_serving(report))


def _workload(requests: list[LoadRequest]) -> dict:
    return {
        "kind": "test",
        "num_requests": len(requests),
        "prompt_tokens_total": 0,
        "output_tokens_total": sum(r.max_tokens for r in requests),
        "last_arrival_s": max(r.arrival_s for r in requests),
    }


def test_served_from_cache_counts_a_left_out_zero_once_the_server_reports():
    from minieng.measure.metrics import served_from_cache

    assert served_from_cache([None, 4, None]) == 4  # one request said: the others' silence is 0
    assert served_from_cache([None, None]) is None  # a server that never reports
    assert served_from_cache([None, 3], absent_is_zero=False) is None  # a sweep that knows better
    assert served_from_cache([None, 3], absent_is_zero=True) == served_from_cache([0, 3]) == 3
