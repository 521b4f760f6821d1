"""The lessons through the API (``lab.endpoint``): each experiment run against a real server on loopback
(``ServerThread`` over the embedded default model), its figures checked against what the server's
engine recorded of the same requests (``build_app(..., on_finished=list.append)``): request counts,
prompt and answer sizes, the prefix cache's share (from the answers' usage, or the server's ``/metrics``
counters where the usage lacks it). No timing is asserted beyond its sign."""

from __future__ import annotations

import json
import statistics
from contextlib import contextmanager

import pytest

pytest.importorskip("httpx", reason="the server extra (pip install -e '.[serve]') is not installed")
pytest.importorskip("fastapi", reason="the server extra (pip install -e '.[serve]') is not installed")

from minieng.lab import endpoint as api  # noqa: E402
from minieng.lab import endpoint_goodput as api_goodput  # noqa: E402
from minieng.lab.endpoint_backend import EndpointBackend  # noqa: E402
from minieng.lab import endpoint_prefix_cache as api_prefix_cache  # noqa: E402
from minieng.lab.server_metrics import read_prefix_cache_counters  # noqa: E402
from minieng.measure.sweep_plan import prefill_sweep_lengths  # noqa: E402
from minieng.measure.workloads import RequestSpec  # noqa: E402
from minieng.measure import loadgen  # noqa: E402
from minieng.serve.server import ServerThread, build_app  # noqa: E402

pytestmark = pytest.mark.real_model
NAME = "default"


def strip_cached_tokens(app, only_zero: bool = False):
    """``app`` behind an ASGI wrapper that removes ``usage.prompt_tokens_details`` from every
    streamed event: a server that does not report cached tokens (``only_zero``: only where the count
    is 0, as vLLM does)."""

    def strip(line: bytes) -> bytes:
        if not line.startswith(b"data: {"):
            return line
        event = json.loads(line[len(b"data: ") :])
        usage = event.get("usage") or {}
        details = usage.get("prompt_tokens_details")
        if details is not None and (not only_zero or not details.get("cached_tokens")):
            del usage["prompt_tokens_details"]
        return b"data: " + json.dumps(event).encode()

    async def wrapped(scope, receive, send):
        async def send_stripped(message):
            if message["type"] == "http.response.body" and message.get("body"):
                message = dict(message, body=b"\n".join(strip(line) for line in message["body"].split(b"\n")))
            await send(message)

        await app(scope, receive, send_stripped)

    return wrapped


def metrics_as(app, prefix: str | None):
    """``app`` behind an ASGI wrapper that answers ``GET /metrics`` with minieng's metrics renamed
    to ``prefix`` (``"vllm:"``: vLLM's names for the same counters), or 404 for None (a server
    without Prometheus metrics)."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/metrics":
            return await app(scope, receive, send)
        if prefix is None:
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
            return await send({"type": "http.response.body", "body": b""})
        messages = []

        async def keep(message):
            messages.append(message)

        await app(scope, receive, keep)
        start, *bodies = messages
        body = b"".join(m.get("body", b"") for m in bodies).replace(b"minieng:", prefix.encode())
        headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        await send(dict(start, headers=[*headers, (b"content-length", str(len(body)).encode())]))
        await send({"type": "http.response.body", "body": body})

    return wrapped


@contextmanager
def served(engine, wrap=None):
    """A server over ``engine`` on loopback, its engine's finished outputs in order, and the
    ``Endpoint`` connected to it (its calibration request is ``finished[0]``)."""
    finished = []
    app = build_app(engine, NAME, on_finished=finished.append)
    with ServerThread(wrap(app) if wrap else app) as server:
        endpoint = api.connect_endpoint(server.base_url)
        yield endpoint, finished


@contextmanager
def backend_on(engine, seed=None):
    """``served``, as the ``EndpointBackend`` a notebook gets (``lesson_backend(url)``)."""
    with served(engine) as (endpoint, finished):
        yield EndpointBackend(endpoint, seed), finished


def test_connecting_reads_the_model_and_the_servers_token_count(real_engine):
    with served(real_engine()) as (endpoint, finished):
        assert endpoint.model == NAME and endpoint.max_model_len == 1024
        (calibration,) = finished  # the one request connecting sent
        text = api._calibration_text()  # the text connecting sent, about CALIBRATION_CHARS characters
        assert api.CALIBRATION_CHARS <= len(text) < 1.2 * api.CALIBRATION_CHARS
        assert endpoint.chars_per_token == pytest.approx(len(text) / len(calibration.prompt_token_ids))
        assert endpoint.label in endpoint.lines()[0]
        with pytest.raises(ValueError, match="not 'another'"):
            api.connect_endpoint(endpoint.base_url, model="another")


def test_a_server_that_cannot_be_reached_is_named():
    with pytest.raises(ValueError, match="Is the server running"):
        api.connect_endpoint("http://127.0.0.1:9/v1")


def test_the_two_phases_are_the_servers_counts(real_engine):
    with backend_on(real_engine(), seed=1) as (backend, finished):
        short, long = backend.prefill(16, repeats=2), backend.prefill(64, repeats=2)
        decode = backend.decode(5, prompt_tokens=16)
        assert not backend.has_steps and backend.engine is None and backend.noise is None
    prefills, out = finished[1:5], finished[5]
    assert len(finished) == 6  # calibration, 2 lengths x 2 repeats, the decode
    for run, outs in zip((short, long), (prefills[:2], prefills[2:])):
        assert run.tokens == round(statistics.median(len(o.prompt_token_ids) for o in outs))
        assert all(len(o.token_ids) == 1 for o in outs)  # prefill timed on one token
        assert run.steps is None and run.seconds > 0 and run.tok_s == pytest.approx(run.tokens / run.seconds)
    assert short.tokens < long.tokens
    assert len(out.token_ids) == decode.tokens == 5 and len(decode.itl_s) == 4
    assert decode.seconds > 0 and decode.tok_s == pytest.approx(1 / decode.seconds)
    with pytest.raises(ValueError, match="batch=2"):
        backend.decode(5, batch=2)


def test_the_phase_grid_and_the_panels_request_are_the_servers_counts(real_engine, capsys):
    with backend_on(real_engine(), seed=2) as (backend, finished):
        grid = backend.phase_grid((8, 40), (2, 6))
        one = backend.request(24, 3)
        chat = backend.chat("Name one colour.", 4)
    # finished[0] calibrates the endpoint; one untimed round of the three cases, then the timed one
    assert [len(o.token_ids) for o in finished[1:7]] == [2, 2, 6] * 2
    outs = dict(zip(("short", "long_prompt", "long_output"), finished[4:7]))
    for case, out in outs.items():
        assert grid[case]["prompt_tokens"] == len(out.prompt_token_ids)
        assert grid[case]["output_tokens"] == len(out.token_ids)
    assert [grid[c]["output_tokens"] for c in outs] == [2, 2, 6]
    assert grid["long_prompt"]["prompt_tokens"] > grid["short"]["prompt_tokens"]
    assert (one.prompt_tokens, one.output_tokens) == (len(finished[7].prompt_token_ids), 3)
    assert chat.prompt_tokens == len(finished[8].prompt_token_ids) and 1 <= chat.output_tokens <= 4
    assert backend.label in capsys.readouterr().out  # the chat says its text is not kept
    with pytest.raises(ValueError, match="short < long"):
        backend.phase_grid((40, 8), (2, 6))


def test_the_hit_rate_sweep_equals_the_engines_record(real_engine):
    engine = real_engine(block_size=16, enable_prefix_caching=True)
    shares = (0.0, 0.5, 0.9)
    with served(engine) as (endpoint, finished):
        result = api_prefix_cache.endpoint_hit_rate_sweep(endpoint, 96, shares, requests=2, seed=4)
    assert len(finished) == 1 + 3 * (1 + len(shares))  # calibration; per point one untimed request + 2 timed
    for i, point in enumerate([result["cold"], *result["points"]]):
        first, *timed = finished[1 + 3 * i : 4 + 3 * i]
        engine_rate = sum(o.num_cached_tokens for o in timed) / sum(len(o.prompt_token_ids) for o in timed)
        assert point["hit_rate"] == pytest.approx(engine_rate)
        assert point["cached_tokens"] == [o.num_cached_tokens for o in timed]
        # the server's /metrics counted the timed requests alone (the untimed one was read past): the same rate
        counted = point["prefix_cache_counted"]
        assert point["hit_rate_source"] == "usage" and counted["prefix"] == "minieng:"
        assert counted["queries"] == sum(len(o.prompt_token_ids) for o in timed)
        assert counted["hits"] == sum(o.num_cached_tokens for o in timed)
        assert counted["hit_rate"] == pytest.approx(point["hit_rate"])
        if point["share"]:  # the untimed request is the shared prefix alone: its count is the shared tokens
            assert point["shared_tokens"] == len(first.prompt_token_ids)
            assert all(o.prompt_token_ids[: point["shared_tokens"]] == first.prompt_token_ids for o in timed)
    assert result["cold"]["hit_rate"] == 0 and result["points"][-1]["hit_rate"] > 0.5
    assert result["cached_tokens_reported"] and result["block_size"] is None
    assert result["hit_rate_source"] == "usage"
    near, high = api_prefix_cache.endpoint_hit_rate_pair(result)
    assert high is result["points"][-1] and near["hit_rate"] < high["hit_rate"]
    lines = api_prefix_cache.format_hit_rate_sweep(result)
    assert not any("not reported" in line for line in lines)
    assert lines[-1] == f"hit rates: {api_prefix_cache.HIT_RATE_SOURCES['usage']}"


def test_a_server_that_counts_its_hits_only_in_metrics_has_them_from_there(real_engine):
    """vLLM without --enable-prompt-tokens-details: no cached_tokens in usage, but its /metrics
    counts vllm:prefix_cache_queries_total and _hits_total. Each point's hit rate is their deltas over
    its timed requests, which equal the engine's record of those requests."""
    engine = real_engine(block_size=16, enable_prefix_caching=True)
    wrap = lambda app: metrics_as(strip_cached_tokens(app), "vllm:")  # noqa: E731
    with served(engine, wrap) as (endpoint, finished):
        result = api_prefix_cache.endpoint_hit_rate_sweep(endpoint, 96, (0.5, 0.9), requests=2, seed=10)
        counters = read_prefix_cache_counters(endpoint.base_url)
    assert not result["cached_tokens_reported"] and result["hit_rate_source"] == "metrics"
    assert counters.prefix == "vllm:" and counters.queries == sum(len(o.prompt_token_ids) for o in finished)
    for i, point in enumerate([result["cold"], *result["points"]]):
        timed = finished[2 + 3 * i : 4 + 3 * i]  # after the calibration and the point's untimed request
        queries, hits = sum(len(o.prompt_token_ids) for o in timed), sum(o.num_cached_tokens for o in timed)
        assert all(c is None for c in point["cached_tokens"]) and point["hit_rate_source"] == "metrics"
        assert point["prefix_cache_counted"] == {
            "prefix": "vllm:",
            "queries": queries,
            "hits": hits,
            "hit_rate": pytest.approx(hits / queries),
        }
        assert point["hit_rate"] == pytest.approx(hits / queries)
        assert point["uncached_tokens"] == pytest.approx((queries - hits) / len(timed))
    assert result["cold"]["hit_rate"] == 0 < result["points"][0]["hit_rate"] < result["points"][1]["hit_rate"]
    near, high = api_prefix_cache.endpoint_hit_rate_pair(result)
    assert high is result["points"][-1] and near is result["points"][0]
    lines = api_prefix_cache.format_hit_rate_sweep(result)
    assert "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total" in lines[-1]
    assert not any(api.NOT_REPORTED in line for line in lines)


def test_a_server_that_does_not_report_cached_tokens_has_no_hit_rate(real_engine):
    engine = real_engine(block_size=16, enable_prefix_caching=True)
    wrap = lambda app: metrics_as(strip_cached_tokens(app), None)  # noqa: E731 (no usage details, no /metrics)
    with served(engine, wrap) as (endpoint, finished):
        result = api_prefix_cache.endpoint_hit_rate_sweep(endpoint, 64, (0.0, 0.75), requests=1, seed=5)
        assert read_prefix_cache_counters(endpoint.base_url) is None  # 404
    assert sum(o.num_cached_tokens for o in finished) > 0  # the engine's cache did serve blocks
    assert not result["cached_tokens_reported"] and result["hit_rate_source"] is None
    for p in [result["cold"], *result["points"]]:
        assert p["hit_rate"] is None and p["uncached_tokens"] is None
        assert p["hit_rate_source"] is None and p["prefix_cache_counted"] is None
    assert api_prefix_cache.format_hit_rate(result["points"][-1]) == "not reported"
    with pytest.raises(ValueError, match="not reported by this server"):
        api_prefix_cache.endpoint_hit_rate_pair(result)
    assert any(api.NOT_REPORTED in line for line in api_prefix_cache.format_hit_rate_sweep(result))


def test_a_server_that_leaves_out_a_zero_count_still_has_a_hit_rate(real_engine):
    """vLLM reports cached_tokens only when it is not 0: a request without it counts 0 in a sweep
    where another request reported it, and the rates equal the engine's record."""
    engine = real_engine(block_size=16, enable_prefix_caching=True)
    with served(engine, lambda app: strip_cached_tokens(app, only_zero=True)) as (endpoint, finished):
        result = api_prefix_cache.endpoint_hit_rate_sweep(endpoint, 64, (0.75,), requests=2, seed=7)
    assert result["cached_tokens_reported"] and None in result["cold"]["cached_tokens"]
    for i, point in enumerate([result["cold"], *result["points"]]):
        timed = finished[2 + 3 * i : 4 + 3 * i]
        engine_rate = sum(o.num_cached_tokens for o in timed) / sum(len(o.prompt_token_ids) for o in timed)
        assert point["hit_rate"] == pytest.approx(engine_rate)
    assert result["cold"]["hit_rate"] == 0 < result["points"][0]["hit_rate"]


def test_the_probe_sizes_a_sweep_from_the_servers_counts(real_engine):
    with backend_on(real_engine(), seed=8) as (backend, finished):
        probe = backend.probe(max_prompt_tokens=128, budget_s=30, repeats=1)
        assert backend.speed is probe and backend.estimate_s(prefill_tokens=100, decode_steps=3, prefills=1) > 0
    timed = [o for o in finished[1:] if len(o.token_ids) == 1]  # prefills answered in one token
    lengths = [n for n, _ in probe["prefill_points"]]
    assert set(lengths) <= {len(o.prompt_token_ids) for o in timed}
    assert lengths == sorted(set(lengths)) and probe["decode_step_s"] > 0 and probe["server"] == backend.label
    assert sum(len(o.token_ids) == 6 for o in finished) == 1  # one decode of 6 tokens (repeats=1)
    assert prefill_sweep_lengths(probe, 2)  # the engine probe's consumers read it


def test_the_goodput_run_sends_each_spec_at_the_servers_count(real_engine):
    specs = [RequestSpec(0.05 * i, n, o) for i, (n, o) in enumerate([(16, 2), (40, 4), (24, 3)])]
    with served(real_engine()) as (endpoint, finished):
        requests = api_goodput.endpoint_requests(endpoint, specs, seed=9)
        run = loadgen.run_load(endpoint.base_url, endpoint.model, requests, progress=False)
    summary = run.summary()
    assert run.errors == [] and summary.completed == len(specs)
    assert summary.total_prompt_tokens == sum(len(o.prompt_token_ids) for o in finished[1:])
    assert summary.total_output_tokens == sum(s.output_tokens for s in specs)
    assert summary.cached_prompt_tokens == sum(o.num_cached_tokens for o in finished[1:])
    lines = api_goodput.format_client_clock(summary, endpoint)
    assert endpoint.label in lines[0] and any("prefix cache" in line for line in lines)


def test_a_figure_names_the_server_it_measured_and_engine_only_figures_say_why_once(capsys):
    from matplotlib.figure import Figure

    backend = EndpointBackend(api.Endpoint("http://127.0.0.1:9/v1", NAME, 4.0))
    assert backend.label in backend.caption(Figure())._suptitle.get_text()
    assert backend.needs_engine("mfu") is False and backend.needs_engine("mfu") is False
    assert capsys.readouterr().out.count("not through the API") == 1  # said once
    assert backend.why_not("roofline") == api.ENGINE_ONLY["roofline"]
    with pytest.raises(KeyError, match="mfu"):
        backend.needs_engine("flops")
    with pytest.raises(RuntimeError, match="probe"):
        backend.estimate_s(prefill_tokens=10)


def test_bad_arguments_are_refused_before_anything_is_sent():
    endpoint = api.Endpoint("http://127.0.0.1:9/v1", NAME, 4.0)  # no server there
    backend = EndpointBackend(endpoint)
    with pytest.raises(ValueError, match="decode_tokens=1"):
        backend.probe(64, decode_tokens=1)
    with pytest.raises(ValueError, match=r"share=1\.0"):
        api_prefix_cache.endpoint_hit_rate_point(endpoint, 64, 1.0, 2)
    with pytest.raises(ValueError, match="exceed the course's text"):
        backend.request(10**6, 2)
    with pytest.raises(RuntimeError, match="at http://127.0.0.1:9/v1: request 0: ConnectError"):
        api.send_one(endpoint, "text", 2)  # the server named with its error
