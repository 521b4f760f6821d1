"""The server as an evaluation and monitoring backend: several choices and prompts, OpenAI's model
route, vLLM's /tokenize and /detokenize, Prometheus metrics, vLLM's stats line, and nulls.

The same tiny random Llama over the default model's vocabulary as ``test_server.py`` (its fixtures),
served by a real uvicorn server on loopback.
"""

from __future__ import annotations

import logging

import pytest

httpx = pytest.importorskip("httpx", reason="the server extra (pip install -e '.[serve]') is not installed")
pytest.importorskip("fastapi", reason="the server extra (pip install -e '.[serve]') is not installed")
parser = pytest.importorskip("prometheus_client.parser", reason="the server extra lacks prometheus_client")

import test_server  # noqa: E402

from minieng.serve.metrics import ServerMetrics  # noqa: E402
from minieng.serve.server import ServerThread, build_app  # noqa: E402

MODEL, events, make_engine, wait_until = (
    test_server.MODEL,
    test_server.events,
    test_server.make_engine,
    test_server.wait_until,
)
text_model, served = test_server.text_model, test_server.served  # its fixtures, shared

PROMPTS = ["Hello there", "Once upon a time"]


def _complete(server, **fields) -> dict:
    body = {"model": MODEL, "max_tokens": 5, "ignore_eos": True, **fields}
    r = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


# -- several choices and several prompts -------------------------------------------------------------


def test_n_choices_of_a_batch_are_prompt_major_and_seeded_as_vllm(served, text_model):
    """Two prompts x n=2: four choices, index p * n + i, choice i sampled with seed + i (vLLM's
    ParentRequest): each equals the single request for its prompt with that seed. Usage counts each
    prompt once and every choice's tokens."""
    engine, server, _ = served
    got = _complete(server, prompt=PROMPTS, n=2, temperature=0.9, seed=5)
    assert [c["index"] for c in got["choices"]] == [0, 1, 2, 3]
    texts = [c["text"] for c in got["choices"]]
    for p, prompt in enumerate(PROMPTS):
        for i in range(2):
            alone = _complete(server, prompt=prompt, temperature=0.9, seed=5 + i)["choices"]
            assert len(alone) == 1 and texts[p * 2 + i] == alone[0]["text"], (p, i)
    assert texts[0] != texts[1] and texts[2] != texts[3], "two seeds, two samples"
    prompt_tokens = sum(len(text_model.tokenizer.encode(p)) for p in PROMPTS)
    assert got["usage"]["prompt_tokens"] == prompt_tokens and got["usage"]["completion_tokens"] == 4 * 5
    as_ids = _complete(server, prompt=[text_model.tokenizer.encode(p) for p in PROMPTS], n=2, temperature=0.9, seed=5)
    assert [c["text"] for c in as_ids["choices"]] == texts, "a batch of token-id lists is the same batch"
    assert engine.requests == {}


def test_unseeded_choices_differ_and_greedy_batches_answer_each_prompt(served):
    engine, server, finished = served
    got = _complete(server, prompt="Hello", n=3, temperature=1.0)
    assert len({c["text"] for c in got["choices"]}) == 3
    greedy = _complete(server, prompt=PROMPTS, temperature=0)  # lm-eval's batches: n=1, greedy
    for choice, prompt in zip(greedy["choices"], PROMPTS):
        assert choice["text"] == _complete(server, prompt=prompt, temperature=0)["choices"][0]["text"]
    assert wait_until(lambda: engine.requests == {})


def _stream(server, path: str, body: dict) -> list:
    with httpx.stream("POST", f"{server.base_url}/{path}", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return events(r)


def test_a_streamed_batch_carries_each_choices_index_and_sums_usage(served):
    engine, server, _ = served
    body = {"model": MODEL, "prompt": PROMPTS, "n": 2, "temperature": 0.9, "seed": 11, "max_tokens": 6}
    whole = _complete(server, **body)
    got = _stream(
        server, "completions", dict(body, ignore_eos=True, stream=True, stream_options={"include_usage": True})
    )
    assert got[-1] == "[DONE]"
    chunks, last = got[:-2], got[-2]
    texts, reasons = ["" for _ in range(4)], [[] for _ in range(4)]
    for chunk in chunks:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        reasons[choice["index"]].append(choice["finish_reason"])
    assert texts == [c["text"] for c in whole["choices"]]
    assert all(r[-1] == "length" and set(r[:-1]) <= {None} for r in reasons), "one finishing chunk each, last"
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    assert len({c["id"] for c in got[:-1]}) == 1


def test_a_streamed_chat_with_n_choices_opens_each_with_its_role(served):
    engine, server, _ = served
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "n": 2, "temperature": 0.8}
    got = _stream(server, "chat/completions", dict(body, max_tokens=4, ignore_eos=True, stream=True))[:-1]
    roles = [c["choices"][0]["index"] for c in got if c["choices"][0]["delta"].get("role") == "assistant"]
    assert roles == [0, 1], "each choice's first chunk carries the role"
    for index in (0, 1):
        mine = [c["choices"][0] for c in got if c["choices"][0]["index"] == index]
        assert mine[-1]["finish_reason"] == "length" and mine[0]["delta"] == {"role": "assistant", "content": ""}
    whole = httpx.post(
        f"{server.base_url}/chat/completions", json=dict(body, max_tokens=4, ignore_eos=True), timeout=60
    ).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1] and whole["usage"]["completion_tokens"] == 8


def test_a_client_that_leaves_a_batch_aborts_every_choice(served):
    engine, server, finished = served
    body = {"model": MODEL, "prompt": PROMPTS, "n": 2, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=60) as r:
        next(line for line in r.iter_lines() if line.startswith("data: "))
    assert wait_until(lambda: len(finished) == 4 and engine.requests == {})
    assert {out.finish_reason for out in finished} == {"abort"}
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_the_openai_client_retrieves_the_model_and_gets_a_batchs_choices(served):
    openai = pytest.importorskip("openai")
    engine, server, _ = served
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    completion = client.completions.create(
        model=MODEL, prompt=PROMPTS, n=2, max_tokens=3, temperature=0.7, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in completion.choices] == [0, 1, 2, 3] and completion.usage.completion_tokens == 4 * 3


# -- routes --------------------------------------------------------------------------------------------


def test_a_model_is_retrieved_by_its_id_and_an_unknown_one_is_a_404(text_model):
    """Model ids with a slash (Hugging Face names) are one id."""
    name = "org/tiny-test"
    with ServerThread(build_app(make_engine(text_model), name)) as server:
        listed = httpx.get(f"{server.base_url}/models").json()["data"][0]
        r = httpx.get(f"{server.base_url}/models/{name}")
        assert r.status_code == 200 and r.json() == listed and listed["id"] == name
        r = httpx.get(f"{server.base_url}/models/tiny-test")
        assert r.status_code == 404
        error = r.json()["error"]
        assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
        assert error["param"] == "model" and "tiny-test" in error["message"] and name in error["message"]
        r = httpx.get(f"{server.base_url}/engines")
        assert r.status_code == 404 and r.json()["error"]["code"] is None, "an unknown route is no unknown model"


def test_tokenize_and_detokenize_round_trip_as_vllm(served, text_model):
    engine, server, _ = served
    root, tok = server.base_url.removesuffix("/v1"), text_model.tokenizer
    text = "Hello world, once upon a time"
    r = httpx.post(f"{root}/tokenize", json={"model": MODEL, "prompt": text})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["tokens"] == tok.encode(text) and got["count"] == len(got["tokens"])
    assert got["max_model_len"] == engine.max_model_len and got["token_strs"] is None
    back = httpx.post(f"{root}/detokenize", json={"model": MODEL, "tokens": got["tokens"]}).json()
    assert back == {"prompt": text}
    strs = httpx.post(f"{root}/tokenize", json={"prompt": text, "return_token_strs": True}).json()["token_strs"]
    assert strs == tok.convert_ids_to_tokens(got["tokens"])
    messages = [{"role": "user", "content": "Hi"}]
    chat = httpx.post(f"{root}/tokenize", json={"messages": messages}).json()
    assert chat["tokens"] == engine.chat_prompt(messages)
    usage = httpx.post(
        f"{server.base_url}/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 1}
    )
    assert usage.json()["usage"]["prompt_tokens"] == chat["count"], "what the chat endpoint sends the engine"


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("detokenize", {"tokens": [1, 10**9]}, 400, "tokens"),
        ("detokenize", {"tokens": "12"}, 400, "tokens"),
        ("detokenize", {"model": "gpt-4", "tokens": [1]}, 404, "model"),
        ("tokenize", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
        ("tokenize", {"prompt": 5}, 400, "prompt"),
        ("tokenize", {}, 400, "prompt"),
        ("tokenize", {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False}, 400, None),
        ("tokenize", {"messages": []}, 400, "messages"),
        ("tokenize", '{"prompt": "hi"', 400, None),
        ("tokenize", '{"prompt": "hi \\ud800"}', 400, "prompt"),
    ],
)
def test_tokenize_and_detokenize_refuse_with_openai_errors(served, path, body, status, param):
    engine, server, _ = served
    root = server.base_url.removesuffix("/v1")
    kwargs = (
        {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    )
    r = httpx.post(f"{root}/{path}", **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error
    else:
        assert "add_generation_prompt" in error["message"] or "JSON" in error["message"], error


# -- Prometheus metrics -------------------------------------------------------------------------------


def _scrape(server) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, keyed by (name, sorted labels), after checking the format parses."""
    r = httpx.get(server.base_url.removesuffix("/v1") + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in parser.text_string_to_metric_families(r.text):
        assert family.name.startswith("minieng:"), family.name
        for s in family.samples:
            samples[s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))] = (
                s.value
            )
    return samples


def _delta(before: dict, after: dict, name: str, **labels) -> float:
    key = ("minieng:" + name, tuple(sorted(labels.items())))
    return after[key] - before.get(key, 0.0)


def test_metrics_move_by_what_the_requests_did(served):
    """Three requests of known sizes, one streamed and one repeating a prompt: every counter and
    histogram count moves by its exact amount, the cache hits equal the engine's record, and the
    gauges read an idle engine after."""
    engine, server, finished = served
    before = _scrape(server)
    assert before[("minieng:request_success_total", (("finished_reason", "abort"),))] == 0
    head = httpx.head(server.base_url.removesuffix("/v1") + "/metrics")  # aiperf's probe
    assert head.status_code == 200 and head.text == ""
    a, b = list(range(100, 109)), list(range(200, 213))  # 9 and 13 prompt tokens
    _complete(server, prompt=a, max_tokens=5, temperature=0)
    _stream(server, "completions", {"model": MODEL, "prompt": b, "max_tokens": 3, "ignore_eos": True, "stream": True})
    _complete(server, prompt=a, max_tokens=2, temperature=0)  # its full blocks come from the cache
    assert wait_until(lambda: len(finished) == 3)
    after = _scrape(server)
    assert _delta(before, after, "request_success_total", finished_reason="length") == 3
    assert _delta(before, after, "prompt_tokens_total") == 9 + 13 + 9
    assert _delta(before, after, "generation_tokens_total") == 5 + 3 + 2
    assert _delta(before, after, "time_to_first_token_seconds_count") == 3
    assert _delta(before, after, "inter_token_latency_seconds_count") == 4 + 2 + 1, "one gap per later token"
    assert _delta(before, after, "request_time_per_output_token_seconds_count") == 3
    assert _delta(before, after, "e2e_request_latency_seconds_count") == 3
    assert _delta(before, after, "request_prompt_tokens_sum") == 31
    assert _delta(before, after, "request_generation_tokens_sum") == 10
    assert _delta(before, after, "request_generation_tokens_bucket", le="5.0") == 3
    assert _delta(before, after, "request_generation_tokens_bucket", le="2.0") == 1
    hits = sum(out.num_cached_tokens for out in finished)
    assert hits == 8 and _delta(before, after, "prefix_cache_hits_total") == hits
    assert _delta(before, after, "prefix_cache_queries_total") == 31
    ttft_sum = _delta(before, after, "time_to_first_token_seconds_sum")
    e2e_sum = _delta(before, after, "e2e_request_latency_seconds_sum")
    assert 0 < ttft_sum < e2e_sum
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert after[("minieng:" + gauge, ())] == 0, gauge


def test_an_aborted_request_counts_as_abort_and_leaves_the_gauges_idle(served):
    engine, server, finished = served
    before = _scrape(server)
    body = {"model": MODEL, "prompt": "Tell me everything", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/completions", json=body) as r:
        lines = r.iter_lines()  # held: a generator collected closes the response (a client that leaves)
        next(line for line in lines if line.startswith("data: "))
        assert _scrape(server)[("minieng:num_requests_running", ())] == 1
    assert wait_until(lambda: len(finished) == 1)
    after = _scrape(server)
    assert _delta(before, after, "request_success_total", finished_reason="abort") == 1
    assert after[("minieng:num_requests_running", ())] == 0 and after[("minieng:kv_cache_usage_perc", ())] == 0


def test_each_app_has_its_own_registry(text_model):
    first, second = (ServerMetrics(MODEL, 512, 64, 4) for _ in range(2))  # the same names, no clash
    first.prompt_tokens.inc(5)
    assert b"minieng:prompt_tokens_total" in first.render()[0]
    labels = {"model_name": MODEL, "engine": "0"}
    assert first.registry.get_sample_value("minieng:prompt_tokens_total", labels) == 5
    assert second.registry.get_sample_value("minieng:prompt_tokens_total", labels) == 0
    with pytest.raises(ValueError, match="num_blocks"):
        ServerMetrics(MODEL, 512, 0)


# -- vLLM's stats line ----------------------------------------------------------------------------------


def test_the_stats_line_reports_a_known_workload(tiny_engine, caplog):
    """Two requests of 20 and 21 prompt tokens and 3 output tokens each: over the intervals logged,
    prompt tokens sum to 41 and generation tokens to 6, as vLLM's LoggingStatLogger counts them
    (whole prompts at their first token, every token emitted); each line printed is its figures,
    the throughputs over intervals that tile the time; the last reads an idle engine and the
    prefix cache's 16 hits of 41 tokens."""
    caplog.set_level(logging.DEBUG, logger="minieng.serve.async_engine")
    engine = tiny_engine()  # blocks of 4 tokens
    shared = list(range(10, 26))
    app = build_app(engine, MODEL, log_interval_s=0.1)
    with ServerThread(app) as server:
        for tail in ([30, 31, 32, 33], [40, 41, 42, 43, 44]):
            body = {"model": MODEL, "prompt": shared + tail, "max_tokens": 3, "ignore_eos": True}
            assert httpx.post(f"{server.base_url}/completions", json=body, timeout=30).status_code == 200
        logged = app.state.engine_loop.logged
        assert wait_until(lambda: sum(s.num_generation_tokens for s in list(logged)) == 6)
        stats = list(logged)
    assert sum(s.num_prompt_tokens for s in stats) == 41 and sum(s.num_generation_tokens for s in stats) == 6
    messages = [r.getMessage() for r in caplog.records]
    for s in stats:
        assert s.line() in messages
        assert s.line().startswith(
            f"Engine 000: Avg prompt throughput: {s.num_prompt_tokens / s.interval_s:.1f} tokens/s, "
            f"Avg generation throughput: {s.num_generation_tokens / s.interval_s:.1f} tokens/s"
        )
    for previous, s in zip(stats, stats[1:]):
        assert s.end_s - s.interval_s == pytest.approx(previous.end_s), "the intervals tile the time"
    last = stats[-1]
    assert (last.num_running_reqs, last.num_waiting_reqs, last.kv_cache_usage) == (0, 0, 0.0)
    assert last.prefix_cache_hit_rate == pytest.approx(16 / 41)


# -- nulls --------------------------------------------------------------------------------------------

COMPLETION_NULLS = dict.fromkeys(
    "temperature top_p top_k n best_of stream stream_options stop seed max_tokens logprobs echo suffix "
    "presence_penalty frequency_penalty logit_bias user stop_token_ids ignore_eos min_p repetition_penalty "
    "min_tokens prompt_logprobs".split()
)
CHAT_NULLS = dict.fromkeys(
    "temperature top_p top_k n stream stream_options stop seed max_tokens logprobs top_logprobs presence_penalty "
    "frequency_penalty logit_bias user response_format tools tool_choice parallel_tool_calls metadata store "
    "service_tier modalities audio prediction reasoning_effort web_search_options".split()
)


def test_a_body_with_every_unset_option_null_is_served(served):
    """LangChain and LiteLLM send every option they were not given as null: each means its default,
    as OpenAI and vLLM read it (llama.cpp refused such bodies, its issue #25515)."""
    engine, server, _ = served
    r = httpx.post(f"{server.base_url}/completions", json={"model": MODEL, "prompt": "Hello", **COMPLETION_NULLS})
    assert r.status_code == 200, r.text
    got = r.json()
    assert len(got["choices"]) == 1 and got["usage"]["completion_tokens"] <= 16, "null max_tokens: OpenAI's 16"
    messages = [{"role": "user", "content": "Hi"}]
    body = {"model": MODEL, "messages": messages, **CHAT_NULLS, "max_completion_tokens": 4}
    r = httpx.post(f"{server.base_url}/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    stream = _stream(server, "chat/completions", dict(body, stream=True, stream_options={"include_usage": None}))
    assert stream[-1] == "[DONE]" and all("usage" not in c for c in stream[:-1]), "include_usage null: false"


def test_null_means_the_default(served):
    """A seeded request answers the same with the other options absent or null."""
    engine, server, _ = served
    fields = {"prompt": "Hello", "seed": 3, "max_tokens": 8, "ignore_eos": True}
    nulls = {k: v for k, v in COMPLETION_NULLS.items() if k not in fields}
    plain, with_nulls = _complete(server, **fields), _complete(server, **fields, **nulls)
    assert with_nulls["choices"] == plain["choices"] and with_nulls["usage"] == plain["usage"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "seed": 3, "max_tokens": 6}
    answers = [
        httpx.post(f"{server.base_url}/chat/completions", json=b).json()["choices"][0]["message"]["content"]
        for b in (body, {**CHAT_NULLS, **body})
    ]
    assert answers[0] == answers[1] and answers[0]


def test_a_failed_engine_step_fails_its_requests_and_the_server_goes_on(text_model, monkeypatch):
    """A step that raises (out of memory, a kernel's error) answers its requests, whole with a 500
    and streamed with an error event then [DONE], frees their blocks, and the next request runs:
    no client waits forever on a loop that died."""
    engine = make_engine(text_model)
    step = engine.step
    failures = []

    def failing_once():
        if not failures:
            failures.append(1)
            raise RuntimeError("CUDA out of memory (simulated)")
        return step()

    monkeypatch.setattr(engine, "step", failing_once)
    with ServerThread(build_app(engine, MODEL)) as server:
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        failed = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
        assert failed.status_code == 500
        assert "engine step failed (RuntimeError: CUDA out of memory" in failed.json()["error"]["message"]
        assert failed.json()["error"]["type"] == "server_error"
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        failures.clear()
        with httpx.stream("POST", f"{server.base_url}/completions", json=body | {"stream": True}, timeout=60) as r:
            streamed = events(r)
        assert "error" in streamed[0] and streamed[-1] == "[DONE]"
        ok = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
