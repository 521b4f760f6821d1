"""The OpenAI-compatible server on loopback: the API's objects, its errors, aborts, a soak.

The engine behind it is a tiny random Llama with the default model's vocabulary and tokenizer:
text in, text out, fast enough for a thousand requests. Each test starts a real uvicorn server on
a free port of 127.0.0.1 (``ServerThread``) and talks HTTP to it.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch

httpx = pytest.importorskip("httpx", reason="the server extra (pip install -e '.[serve]') is not installed")
pytest.importorskip("fastapi", reason="the server extra (pip install -e '.[serve]') is not installed")

from helpers import TINY_SHAPE  # noqa: E402
from minieng import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from minieng.loader import LoadedModel, build_model, randomize  # noqa: E402
from minieng.server import ServerThread, build_app  # noqa: E402

MODEL = "tiny-test"


@pytest.fixture(scope="module")
def text_model(default_model):
    """A tiny random Llama over the default model's vocabulary, with its tokenizer and EOS ids."""
    from transformers import LlamaConfig

    from minieng import ModelConfig

    shape = dict(TINY_SHAPE, vocab_size=default_model.model.config.vocab_size, max_position_embeddings=512)
    hf = LlamaConfig(**shape)
    model = build_model(ModelConfig.from_hf(hf), torch.float32, torch.device("cpu"), 512)
    randomize(model, seed=1)
    return LoadedModel(model, default_model.tokenizer, hf, set(default_model.eos_token_ids), None)


def make_engine(text_model, **overrides) -> LLMEngine:
    fields = dict(device="cpu", block_size=4, num_kv_blocks=512, max_model_len=512, max_num_seqs=32)
    fields.update(overrides)
    return LLMEngine(EngineConfig(**fields), loaded=text_model)


@pytest.fixture
def served(text_model):
    """(engine, server, finished outputs) for one test; the server stops after it."""
    engine = make_engine(text_model)
    finished = []
    server = ServerThread(build_app(engine, MODEL, on_finished=finished.append)).start()
    yield engine, server, finished
    server.stop()


def events(response) -> list:
    """The JSON objects of an SSE stream, and "[DONE]" for its terminator."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def all_blocks_free(engine) -> bool:
    return engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def wait_until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# -- the API's objects ------------------------------------------------------------------------------

def test_health_and_models(served):
    engine, server, _ = served
    root = server.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/health").json() == {"status": "ok"}
    models = httpx.get(f"{server.base_url}/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == engine.max_model_len


def test_completion_matches_the_engine_and_counts_usage(served, text_model):
    engine, server, finished = served
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True}
    r = httpx.post(f"{server.base_url}/completions", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["object"] == "text_completion" and got["choices"][0]["finish_reason"] == "length"
    reference = make_engine(text_model).generate(
        ["The capital of France is"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert got["choices"][0]["text"] == reference.text
    n = len(reference.prompt_token_ids)
    assert got["usage"] == {"prompt_tokens": n, "completion_tokens": 12, "total_tokens": n + 12,
                            "prompt_tokens_details": {"cached_tokens": 0}}
    again = httpx.post(f"{server.base_url}/completions", json=body).json()
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (n - 1) // engine.config.block_size * engine.config.block_size > 0, "the prefix cache's hits"
    assert again["choices"][0]["text"] == reference.text
    # The engine side saw the same request, then forgot it.
    assert wait_until(lambda: len(finished) == 2)
    assert finished[0].token_ids == reference.token_ids
    assert engine.requests == {} and all_blocks_free(engine)


@pytest.mark.parametrize("include_usage", [True, False])
def test_completion_stream_follows_openai_usage_rules(served, include_usage):
    engine, server, _ = served
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": include_usage}}
    with httpx.stream("POST", f"{server.base_url}/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        got = events(r)
    assert got[-1] == "[DONE]" and got.count("[DONE]") == 1
    chunks = got[:-1]
    if include_usage:
        content, last = chunks[:-1], chunks[-1]
        assert all(c["usage"] is None for c in content), "content chunks carry usage: null"
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 10
        assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 10
    else:
        content = chunks
        assert all("usage" not in c for c in content), "no usage anywhere without include_usage"
    assert [c["choices"][0]["finish_reason"] for c in content][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    assert len({c["id"] for c in chunks}) == 1


def test_chat_stream_equals_chat_response(served):
    engine, server, _ = served
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Why is the sky blue?"}],
            "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    whole = httpx.post(f"{server.base_url}/chat/completions", json=body).json()
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["role"] == "assistant"
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=dict(body, stream=True)) as r:
        got = events(r)[:-1]
    assert got[0]["object"] == "chat.completion.chunk" and got[0]["id"].startswith("chatcmpl-")
    assert whole["id"].startswith("chatcmpl-")
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, "the first chunk: role, no text"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in got)
    assert text == whole["choices"][0]["message"]["content"] and text
    assert whole["usage"]["completion_tokens"] == 16


def test_stop_strings_and_seeded_sampling(served):
    engine, server, _ = served
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "top_k": 50,
            "seed": 7, "ignore_eos": True}
    a = httpx.post(f"{server.base_url}/completions", json=body).json()["choices"][0]["text"]
    b = httpx.post(f"{server.base_url}/completions", json=body).json()["choices"][0]["text"]
    assert a == b, "the same seed gives the same text"
    stop = a[len(a) // 2:len(a) // 2 + 2]
    if stop.strip():
        c = httpx.post(f"{server.base_url}/completions", json=dict(body, stop=[stop])).json()["choices"][0]
        assert stop not in c["text"] and c["finish_reason"] == "stop"


def test_openai_client_streams(served):
    openai = pytest.importorskip("openai")
    engine, server, _ = served
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].choices == []
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    completion = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0)
    assert completion.usage.completion_tokens <= 4 and completion.choices[0].finish_reason in ("stop", "length")


# -- errors -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, status, param", [
    ('{"model": "tiny-test", "prompt": "hi"', 400, None),  # malformed JSON
    ('[1, 2]', 400, None),  # not an object
    ({"model": MODEL, "prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"model": MODEL, "prompt": 5}, 400, "prompt"),
    ({"model": MODEL, "prompt": "hi", "stream": "yes"}, 400, "stream"),
    ({"model": MODEL, "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ({"model": MODEL, "prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ({"model": MODEL, "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "n": 2}, 400, "n"),
    ({"model": MODEL, "prompt": "hi", "stop": [""]}, 400, "stop"),
    ({"model": MODEL, "prompt": ""}, 400, None),
    ({"model": MODEL, "prompt": [10**9]}, 400, None),
    ({"model": MODEL, "prompt": "word " * 600}, 400, None),  # longer than max_model_len
    ({"model": MODEL, "prompt": "hi", "max_tokens": 100_000}, 400, "max_tokens"),
    ({"prompt": "hi"}, 400, "model"),
    ({"model": "gpt-4", "prompt": "hi"}, 404, "model"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(served, body, status, param):
    engine, server, _ = served
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    r = httpx.post(f"{server.base_url}/completions", **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"] in ("invalid_request_error", "not_found_error")
    if param is not None:
        assert error["param"] == param, error
    ok = httpx.post(f"{server.base_url}/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200
    assert engine.requests == {} and all_blocks_free(engine)


def test_bad_chat_messages_and_unknown_routes(served):
    engine, server, _ = served
    for messages in ([], [{"role": "user", "content": ""}], [{"role": "wizard", "content": "hi"}],
                     [{"role": "user"}]):
        r = httpx.post(f"{server.base_url}/chat/completions", json={"model": MODEL, "messages": messages})
        assert r.status_code == 400 and r.json()["error"]["message"], (messages, r.text)
    r = httpx.get(f"{server.base_url}/engines")
    assert r.status_code == 404 and "error" in r.json()


# -- clients that leave ---------------------------------------------------------------------------------

def test_a_client_that_disconnects_mid_stream_is_aborted_and_its_blocks_freed(served):
    engine, server, finished = served
    body = {"model": MODEL, "prompt": "Tell me everything", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/completions", json=body) as r:
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(6)) if line.startswith("data: ")]
        assert got and engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    # The connection is closed: the request must stop within a step or two, not run 400 tokens.
    assert wait_until(lambda: server.server.config.app.state.engine_loop.num_aborted == 1)
    assert wait_until(lambda: all_blocks_free(engine) and engine.requests == {})
    assert finished[-1].finish_reason == "abort" and len(finished[-1].token_ids) < 400
    assert httpx.post(f"{server.base_url}/completions", json={"model": MODEL, "prompt": "hi"}).status_code == 200


def test_a_slow_reader_does_not_hold_back_others(served):
    """One client reads nothing while another runs to the end: the engine loop never waits on a client."""
    engine, server, _ = served
    slow = httpx.stream("POST", f"{server.base_url}/completions",
                        json={"model": MODEL, "prompt": "slow", "max_tokens": 200, "ignore_eos": True, "stream": True})
    response = slow.__enter__()
    try:
        fast = httpx.post(f"{server.base_url}/completions",
                          json={"model": MODEL, "prompt": "fast", "max_tokens": 20, "ignore_eos": True}, timeout=30)
        assert fast.status_code == 200 and fast.json()["usage"]["completion_tokens"] == 20
        text = "".join(e["choices"][0]["text"] for e in events(response)[:-1] if e["choices"])
        assert text
    finally:
        slow.__exit__(None, None, None)
    assert wait_until(lambda: all_blocks_free(engine))


# -- the soak ---------------------------------------------------------------------------------------------

def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


async def _soak(base_url: str, num_requests: int, seed: int) -> dict:
    import random

    rng = random.Random(seed)
    counts = {"answered": 0, "aborted": 0, "refused": 0, "failed": []}
    semaphore = asyncio.Semaphore(48)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        kind = rng.choices(["stream", "plain", "chat", "abort", "invalid"], weights=[4, 3, 2, 1, 1])[0]
        prompt = "word " * rng.randint(1, 120)
        body = {"model": MODEL, "prompt": prompt, "max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0.7]),
                "ignore_eos": rng.random() < 0.5}
        async with semaphore:
            if kind == "invalid":
                r = await client.post("/completions", json=dict(body, top_p=rng.choice([0, 2, "x"])))
                if r.status_code == 400:
                    counts["refused"] += 1
                else:
                    counts["failed"].append((i, kind, r.status_code))
                return
            if kind == "abort":
                body.update(stream=True, max_tokens=300, ignore_eos=True)
                async with client.stream("POST", "/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            break  # leave after the first chunk
                counts["aborted"] += 1
                return
            if kind == "chat":
                body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                        "max_tokens": body["max_tokens"], "temperature": 0}
                r = await client.post("/chat/completions", json=body)
            elif kind == "plain":
                r = await client.post("/completions", json=body)
            else:
                body.update(stream=True, stream_options={"include_usage": True})
                async with client.stream("POST", "/completions", json=body) as r:
                    lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
                if r.status_code == 200 and lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["usage"]:
                    counts["answered"] += 1
                else:
                    counts["failed"].append((i, kind, r.status_code))
                return
            if r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length"):
                counts["answered"] += 1
            else:
                counts["failed"].append((i, kind, r.status_code, r.text[:200]))

    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        await asyncio.gather(*(one(client, i) for i in range(num_requests)))
    return counts


def test_soak_a_thousand_mixed_requests(text_model):
    """1,000 concurrent requests (streamed, plain, chat, aborted mid-stream, invalid) in two waves:
    every valid one answered, every KV block free at the end, and memory flat between the waves."""
    engine = make_engine(text_model, num_kv_blocks=256)  # small enough that waves preempt
    finished = []
    with ServerThread(build_app(engine, MODEL, on_finished=finished.append)) as server:
        first = asyncio.run(_soak(server.base_url, 500, seed=0))
        assert wait_until(lambda: all_blocks_free(engine))
        rss_after_first = _rss_mib()
        second = asyncio.run(_soak(server.base_url, 500, seed=1))
        assert wait_until(lambda: all_blocks_free(engine) and engine.requests == {})
        rss_after_second = _rss_mib()
        loop = server.server.config.app.state.engine_loop
        assert loop.num_active == 0
    for counts in (first, second):
        assert counts["failed"] == [], counts["failed"][:5]
        assert counts["answered"] > 300 and counts["aborted"] > 20 and counts["refused"] > 20
    assert first["answered"] + first["aborted"] + first["refused"] == 500
    assert len(finished) == sum(c["answered"] + c["aborted"] for c in (first, second))
    assert rss_after_second - rss_after_first < 64, (rss_after_first, rss_after_second)


# -- the load generator --------------------------------------------------------------------------------

def test_stream_metrics_follow_the_definitions():
    from minieng.loadgen import stream_metrics

    m = stream_metrics(10.0, [10.5, 10.7, 11.0], 11.1, prompt_tokens=7, output_tokens=5, finish_reason="length")
    assert m.ttft_s == pytest.approx(0.5) and m.e2el_s == pytest.approx(1.1)
    assert m.tpot_s == pytest.approx((1.1 - 0.5) / 4), "TPOT divides by tokens - 1, not by chunks"
    assert m.itl_s == pytest.approx([0.2, 0.3]) and m.ok and m.output_tokens == 5
    one = stream_metrics(0.0, [0.2], 0.2, 3, 1, "stop")
    assert one.tpot_s is None and one.ok
    nothing = stream_metrics(0.0, [], None, 3, 0, "abort")
    assert nothing.ttft_s is None and nothing.e2el_s is None and not nothing.ok


def test_loadgen_against_minieng_agrees_with_the_engine(text_model):
    """The client's figures against the engine's own records of the same requests: every request
    completes with the server's token counts, and the client's TTFT/E2EL exceed the engine's by
    the loopback HTTP path only (a few ms; bounded here at 50 ms for a loaded CI machine)."""
    from minieng.loadgen import load_requests, run_load
    from minieng.metrics import SLO, serving_metrics
    from minieng.workload import poisson_workload

    engine = make_engine(text_model)
    finished = []
    specs = poisson_workload(24, rate_per_s=40.0, prompt_tokens=48, output_tokens=12, seed=3)
    requests = load_requests(specs, text_model.tokenizer)
    with ServerThread(build_app(engine, MODEL, on_finished=finished.append)) as server:
        result = run_load(server.base_url, MODEL, requests, progress=False)
        assert wait_until(lambda: len(finished) == len(requests))
    assert result.errors == []
    client = result.summary(SLO(ttft_ms=10_000))
    ours = serving_metrics(finished)
    assert client.completed == ours.completed == 24 and client.total_output_tokens == ours.total_output_tokens == 24 * 12
    assert client.total_prompt_tokens == ours.total_prompt_tokens
    assert client.num_good_requests == 24
    for figure in ("ttft_ms", "e2el_ms"):
        gap = getattr(client, figure)["p50"] - getattr(ours, figure)["p50"]
        assert -5 <= gap <= 50, (figure, getattr(client, figure), getattr(ours, figure))
    tpot_gap = client.tpot_ms["p50"] - ours.tpot_ms["p50"]
    assert abs(tpot_gap) <= max(5, 0.25 * ours.tpot_ms["p50"]), (client.tpot_ms, ours.tpot_ms)


def test_loadgen_reports_a_server_without_usage_as_failed_requests():
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from minieng.loadgen import LoadRequest, run_load

    app = FastAPI()

    @app.post("/v1/completions")
    async def completions():
        async def chunks():
            yield 'data: {"choices": [{"text": "hi", "finish_reason": "length"}]}\n\n'
            yield "data: [DONE]\n\n"
        return StreamingResponse(chunks(), media_type="text/event-stream")

    with ServerThread(app) as server:
        result = run_load(server.base_url, "any", [LoadRequest(0.0, "x", 4), LoadRequest(0.0, "y", 4)], progress=False)
    assert len(result.errors) == 2 and "usage" in result.errors[0]
    summary = result.summary()
    assert summary.completed == 0 and summary.failed == 2


def test_loadgen_cli_prints_json(served, capsys):
    from minieng.cli import main

    engine, server, _ = served
    code = main(["loadgen", "--base-url", server.base_url, "--num-requests", "4", "--rate", "50",
                 "--prompt-tokens", "16", "--output-tokens-per-request", "3", "--slo-ttft-ms", "5000", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["errors"] == []
    assert report["metrics"]["completed"] == 4 and report["metrics"]["total_output_tokens"] == 12
    assert report["server"]["model"] == MODEL and report["metrics"]["num_good_requests"] == 4
