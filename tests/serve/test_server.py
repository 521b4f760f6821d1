"""The OpenAI-compatible server on loopback: the API's objects, its errors, aborts, a soak, the loadgen.

The engine behind it is a tiny random Llama with the default model's vocabulary and tokenizer:
text in, text out, fast enough for a thousand requests. Each test starts a real uvicorn server on
a free port of 127.0.0.1 (``ServerThread``) and talks HTTP to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import re
import threading
import time

import pytest
import torch

httpx = pytest.importorskip("httpx", reason="the server extra (pip install -e '.[serve]') is not installed")
pytest.importorskip("fastapi", reason="the server extra (pip install -e '.[serve]') is not installed")

from helpers import TINY_SHAPE  # noqa: E402

from minieng import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from minieng.measure.metrics import request_metrics  # noqa: E402
from minieng.model.loader import LoadedModel, build_model, randomize  # noqa: E402
from minieng.serve.server import ServerThread, build_app  # noqa: E402

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
            data = line[len("data: ") :]
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
    body = {
        "model": MODEL,
        "prompt": "The capital of France is",
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = httpx.post(f"{server.base_url}/completions", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["object"] == "text_completion" and got["choices"][0]["finish_reason"] == "length"
    reference = make_engine(text_model).generate(
        ["The capital of France is"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    )[0]
    assert got["choices"][0]["text"] == reference.text
    n = len(reference.prompt_token_ids)
    assert got["usage"] == {
        "prompt_tokens": n,
        "completion_tokens": 12,
        "total_tokens": n + 12,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
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
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 10,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": include_usage},
    }
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
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Why is the sky blue?"}],
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
    }
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
    body = {
        "model": MODEL,
        "prompt": "Hello",
        "max_tokens": 24,
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 50,
        "seed": 7,
        "ignore_eos": True,
    }
    a = httpx.post(f"{server.base_url}/completions", json=body).json()["choices"][0]["text"]
    b = httpx.post(f"{server.base_url}/completions", json=body).json()["choices"][0]["text"]
    assert a == b, "the same seed gives the same text"
    stop = a[len(a) // 2 : len(a) // 2 + 2]
    if stop.strip():
        c = httpx.post(f"{server.base_url}/completions", json=dict(body, stop=[stop])).json()["choices"][0]
        assert stop not in c["text"] and c["finish_reason"] == "stop"


def test_openai_client_streams(served):
    openai = pytest.importorskip("openai")
    engine, server, _ = served
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].choices == []
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    completion = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0)
    assert completion.usage.completion_tokens <= 4 and completion.choices[0].finish_reason in ("stop", "length")


# -- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, status, param",
    [
        ('{"model": "tiny-test", "prompt": "hi"', 400, None),  # malformed JSON
        ("[1, 2]", 400, None),  # not an object
        ({"model": MODEL, "prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ({"model": MODEL, "prompt": 5}, 400, "prompt"),
        # Prompts of the wrong shape; batches (["hi", "there"], [[1, 2], [3]]) are served
        # (test_server_choices.py).
        ({"model": MODEL, "prompt": [1.5]}, 400, "prompt"),
        ({"model": MODEL, "prompt": [1, "a"]}, 400, "prompt"),
        ({"model": MODEL, "prompt": [True, 2]}, 400, "prompt"),
        ({"model": MODEL, "prompt": [["hi"]]}, 400, "prompt"),
        ({"model": MODEL, "prompt": [[1, 2], "there"]}, 400, "prompt"),
        ({"model": MODEL, "prompt": [[1, 2], [3, True]]}, 400, "prompt"),
        ({"model": MODEL, "prompt": ["hi", ""]}, 400, "prompt"),  # one empty prompt of a batch
        ({"model": MODEL, "prompt": [[1, 2], [10**9]]}, 400, "prompt"),
        ({"model": MODEL, "prompt": []}, 400, "prompt"),
        ({"model": MODEL, "prompt": {"text": "hi"}}, 400, "prompt"),
        ({"model": MODEL, "prompt": None}, 400, "prompt"),
        ({"model": MODEL, "prompt": "hi", "stream": "yes"}, 400, "stream"),
        ({"model": MODEL, "prompt": "hi", "top_p": 0}, 400, "top_p"),
        ({"model": MODEL, "prompt": "hi", "top_p": 1.5}, 400, "top_p"),
        ({"model": MODEL, "prompt": "hi", "temperature": -1}, 400, "temperature"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "n": 0}, 400, "n"),
        ({"model": MODEL, "prompt": "hi", "n": 2, "temperature": 0}, 400, "n"),  # identical choices, as vLLM
        ({"model": MODEL, "prompt": "hi", "n": 129}, 400, "n"),  # over the server's 128 choices
        ({"model": MODEL, "prompt": ["hi"] * 65, "n": 2}, 400, "n"),  # 130 choices
        ({"model": MODEL, "prompt": ["hi"] * 129}, 400, "prompt"),
        ({"model": MODEL, "prompt": "hi", "n": 3, "best_of": 2}, 400, "best_of"),  # OpenAI: best_of >= n
        ({"model": MODEL, "prompt": "hi", "temperature": None, "top_p": "high"}, 400, "top_p"),
        ({"model": MODEL, "prompt": "hi", "stop": [""]}, 400, "stop"),
        ({"model": MODEL, "prompt": ""}, 400, "prompt"),
        ({"model": MODEL, "prompt": [10**9]}, 400, "prompt"),
        ({"model": MODEL, "prompt": "word " * 600}, 400, "prompt"),  # longer than max_model_len
        ({"model": MODEL, "prompt": "hi", "max_tokens": 100_000}, 400, "max_tokens"),
        ({"prompt": "hi"}, 400, "model"),
        ({"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(served, body, status, param):
    engine, server, _ = served
    kwargs = (
        {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    )
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
    for messages in ([], [{"role": "user", "content": ""}], [{"role": "wizard", "content": "hi"}], [{"role": "user"}]):
        r = httpx.post(f"{server.base_url}/chat/completions", json={"model": MODEL, "messages": messages})
        assert r.status_code == 400 and r.json()["error"]["message"], (messages, r.text)
    r = httpx.get(f"{server.base_url}/engines")
    assert r.status_code == 404 and "error" in r.json()


def test_a_batch_of_one_prompt_is_that_prompt(served):
    """OpenAI's batch forms with one prompt (a list of one string, of one token-id list) answer
    as the prompt itself: one choice, the same text."""
    engine, server, _ = served
    base = {"model": MODEL, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    ids = engine.tokenize("Hello there")
    texts = [
        httpx.post(f"{server.base_url}/completions", json=dict(base, prompt=prompt)).json()["choices"][0]["text"]
        for prompt in ("Hello there", ["Hello there"], ids, [ids])
    ]
    assert texts[0] and texts == [texts[0]] * 4


# Fields minieng cannot honour, each with a value that asks for something: refused with 400 naming
# the field (they used to be ignored: 200 with an answer that did not do what was asked).
NOT_HONOURED = [
    ("completions", "prompt_logprobs", 1),  # vLLM's field: minieng returns them through echo + logprobs
    ("completions", "best_of", 3),
    ("completions", "suffix", " the end."),
    ("completions", "logit_bias", {"12": -100}),
    ("completions", "presence_penalty", 0.5),
    ("completions", "frequency_penalty", -1),
    ("completions", "repetition_penalty", 1.2),
    ("completions", "min_tokens", 4),
    ("chat/completions", "echo", True),  # vLLM's chat echo (the last message repeated)
    ("chat/completions", "response_format", {"type": "json_object"}),
    ("chat/completions", "tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("chat/completions", "tool_choice", "required"),
    ("chat/completions", "functions", [{"name": "f", "parameters": {}}]),
    ("chat/completions", "logit_bias", {"12": 5}),
]


def _body(path: str, **fields) -> dict:
    if path == "completions":
        return {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, **fields}
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, **fields}


@pytest.mark.parametrize("path, field, value", NOT_HONOURED)
def test_a_parameter_it_cannot_honour_is_refused_naming_it(served, path, field, value):
    engine, server, _ = served
    r = httpx.post(f"{server.base_url}/{path}", json=_body(path, **{field: value}))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{field}: minieng ") and (
        "omit" in error["message"] or "send" in error["message"]
    )
    assert engine.requests == {}


@pytest.mark.parametrize("path", ["completions", "chat/completions"])
def test_stream_options_without_stream_is_refused(served, path):
    engine, server, _ = served
    for stream in (False, None):
        fields = {"stream_options": {"include_usage": True}} | ({} if stream is None else {"stream": stream})
        r = httpx.post(f"{server.base_url}/{path}", json=_body(path, **fields))
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options", r.text
    r = httpx.post(f"{server.base_url}/{path}", json=_body(path, stream_options=None))
    assert r.status_code == 200, "stream_options: null is its absence"


def test_neutral_values_of_fields_it_cannot_honour_are_accepted(served):
    """What clients send by default (logprobs null, penalties 0, n 1, best_of 1, echo false,
    tool_choice "none", response_format text, user) asks for nothing: 200, the same answer."""
    engine, server, _ = served
    plain = httpx.post(f"{server.base_url}/completions", json=_body("completions", temperature=0)).json()
    neutral = dict(
        logprobs=None,
        echo=False,
        best_of=1,
        n=1,
        logit_bias={},
        presence_penalty=0,
        frequency_penalty=0.0,
        suffix=None,
        user="someone",
        stream=False,
        stream_options=None,
        repetition_penalty=1.0,
        min_p=0,
        min_tokens=0,
    )
    r = httpx.post(f"{server.base_url}/completions", json=_body("completions", temperature=0, **neutral))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == plain["choices"][0]["text"]
    chat_neutral = dict(
        logprobs=False,
        top_logprobs=None,
        response_format={"type": "text"},
        tools=None,
        tool_choice="none",
        presence_penalty=0,
        n=1,
        parallel_tool_calls=True,
    )
    r = httpx.post(f"{server.base_url}/chat/completions", json=_body("chat/completions", **chat_neutral))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "raw, param",
    [
        ('"temperature": Infinity', "temperature"),
        ('"temperature": 1e400', "temperature"),
        ('"temperature": -Infinity', "temperature"),
        ('"temperature": NaN', "temperature"),
        ('"top_p": Infinity', "top_p"),
        ('"top_p": NaN', "top_p"),
        ('"top_k": Infinity', "top_k"),
        ('"max_tokens": 1e400', "max_tokens"),
        ('"seed": NaN', "seed"),
    ],
)
def test_non_finite_sampling_values_are_refused(served, raw, param):
    """Python's JSON reads Infinity, NaN and 1e400 (inf) as floats: temperature inf gave random
    text with 200; every non-finite value is now a 400 naming its field."""
    engine, server, _ = served
    for path, start in (
        ("completions", '{"model": "tiny-test", "prompt": "hi", '),
        ("chat/completions", '{"model": "tiny-test", "messages": [{"role": "user", "content": "hi"}], '),
    ):
        r = httpx.post(
            f"{server.base_url}/{path}", content=start + raw + "}", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["param"] == param
    assert engine.requests == {}


@pytest.mark.parametrize(
    "path, body",
    [
        ("completions", '{"model": "tiny-test", "prompt": "hi \\ud800 there"}'),
        ("completions", '{"model": "tiny-test", "prompt": ["hi \\udfff"]}'),
        ("chat/completions", '{"model": "tiny-test", "messages": [{"role": "user", "content": "hi \\ud800"}]}'),
        (
            "chat/completions",
            '{"model": "tiny-test", "messages": [{"role": "system", "content": "be \\udc00"}, '
            '{"role": "user", "content": "hi"}]}',
        ),
        (
            "chat/completions",
            '{"model": "tiny-test", "messages": [{"role": "user", "content": '
            '[{"type": "text", "text": "hi \\ud800"}]}]}',
        ),
    ],
)
def test_a_lone_surrogate_is_a_400_not_a_500(served, path, body):
    """JSON's \\ud800 escape decodes to a lone surrogate, which no tokenizer takes (it was a
    plain-text 500)."""
    engine, server, _ = served
    r = httpx.post(f"{server.base_url}/{path}", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "lone surrogate" in error["message"]
    assert error["param"] == ("prompt" if path == "completions" else "messages")
    proper = json.loads(
        body.replace("\\ud800", "\\ud83d\\ude00").replace("\\udfff", "\\u00e9").replace("\\udc00", "\\u00e9")
    )
    ok = httpx.post(f"{server.base_url}/{path}", json=dict(proper, max_tokens=2))
    assert ok.status_code == 200, "a surrogate pair (one character) is fine"


def _chat(server, messages, **fields) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **fields}
    return httpx.post(f"{server.base_url}/chat/completions", json=body)


def test_chat_content_as_text_parts_and_the_developer_role(served):
    """OpenAI's forms vLLM and llama.cpp accept: text parts are joined with newlines, "developer"
    is the system role. Each answer equals the one for the plain form."""
    engine, server, _ = served
    answer = lambda r: (r.status_code, r.json()["choices"][0]["message"]["content"])  # noqa: E731
    plain = answer(
        _chat(
            server,
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Why is the sky blue?\nAnd the sea?"},
            ],
        )
    )
    assert plain[0] == 200 and plain[1]
    parts = [{"type": "text", "text": "Why is the sky blue?"}, {"type": "text", "text": "And the sea?"}]
    assert (
        answer(
            _chat(
                server,
                [
                    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                    {"role": "user", "content": parts},
                ],
            )
        )
        == plain
    )
    assert (
        answer(
            _chat(
                server,
                [
                    {"role": "developer", "content": "Be brief."},
                    {"role": "user", "content": "Why is the sky blue?\nAnd the sea?"},
                ],
            )
        )
        == plain
    )


@pytest.mark.parametrize(
    "content, says",
    [
        ([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}], "'image_url'"),
        (
            [{"type": "text", "text": "Look:"}, {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
            "content part 1 is of type 'input_audio'",
        ),
        ([{"type": "text"}], "without a text string"),
        (["just a string"], "a str"),
        ({"type": "text", "text": "a part, not a list"}, "valid string"),
    ],
)
def test_chat_content_parts_other_than_text_are_refused(served, content, says):
    engine, server, _ = served
    r = _chat(server, [{"role": "user", "content": content}])
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and says in error["message"], error


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
    slow = httpx.stream(
        "POST",
        f"{server.base_url}/completions",
        json={"model": MODEL, "prompt": "slow", "max_tokens": 200, "ignore_eos": True, "stream": True},
    )
    response = slow.__enter__()
    try:
        fast = httpx.post(
            f"{server.base_url}/completions",
            json={"model": MODEL, "prompt": "fast", "max_tokens": 20, "ignore_eos": True},
            timeout=30,
        )
        assert fast.status_code == 200 and fast.json()["usage"]["completion_tokens"] == 20
        text = "".join(e["choices"][0]["text"] for e in events(response)[:-1] if e["choices"])
        assert text
    finally:
        slow.__exit__(None, None, None)
    assert wait_until(lambda: all_blocks_free(engine))


def post_and_leave(server, path: str, body: dict, leave_when) -> None:
    """Send a request on a raw socket, then close the connection once ``leave_when()`` holds,
    without reading the answer: a client that gives up (a timeout, a closed tab, Ctrl-C)."""
    import socket

    data = json.dumps(body).encode()
    head = (
        f"POST /v1/{path} HTTP/1.1\r\nHost: {server.host}:{server.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(head + data)
        assert wait_until(leave_when), "the request never got going"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["completions", "chat/completions"])
def test_a_client_that_disconnects_mid_decode_is_aborted(served, path, stream):
    """The client leaves while its long request decodes. A non-streamed request used to run to
    max_tokens (the handler looked for a disconnect only after 0.5 s without output, and a
    decoding request has output every step); now every endpoint in both modes aborts it within
    a step or two, and its blocks return to the pool."""
    engine, server, finished = served
    body = _body(path, max_tokens=400, ignore_eos=True, stream=stream)
    decoding = lambda: any(len(r.seq.output_token_ids) >= 3 for r in list(engine.requests.values()))  # noqa: E731
    post_and_leave(server, path, body, decoding)
    assert wait_until(lambda: len(finished) == 1), "the request neither finished nor was aborted"
    out = finished[0]
    assert out.finish_reason == "abort" and len(out.token_ids) < 200, (out.finish_reason, len(out.token_ids))
    assert server.server.config.app.state.engine_loop.num_aborted == 1
    assert wait_until(lambda: all_blocks_free(engine) and engine.requests == {})


@pytest.mark.parametrize("path", ["completions", "chat/completions"])
def test_a_client_that_leaves_while_its_prompt_is_tokenized_is_never_queued(served, path):
    engine, server, finished = served
    started, release = threading.Event(), threading.Event()
    name = "tokenize" if path == "completions" else "chat_prompt"
    original = getattr(engine, name)

    def slow(prompt):
        started.set()
        release.wait(10)
        return original(prompt)

    setattr(engine, name, slow)
    post_and_leave(server, path, _body(path, max_tokens=4), started.is_set)
    time.sleep(0.2)  # the disconnect reaches the server while the tokenizer works
    release.set()
    time.sleep(0.2)
    assert finished == [] and engine.requests == {} and not engine.has_unfinished_requests()
    assert httpx.post(f"{server.base_url}/{path}", json=_body(path, max_tokens=2)).status_code == 200


# -- large bodies and the event loop -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["completions", "chat/completions"])
def test_tokenizing_runs_off_the_event_loop(served, path):
    """While a prompt is tokenized (or templated) the server still answers: the tokenizer runs in
    a worker thread, not the event loop's. A 1 MB prompt took the tokenizer a second on the
    loop, and /health waited that long. Here tokenizing blocks until /health has answered."""
    engine, server, _ = served
    started, release = threading.Event(), threading.Event()
    threads = []
    name = "tokenize" if path == "completions" else "chat_prompt"
    original = getattr(engine, name)

    def blocking(prompt):
        if isinstance(prompt, str) or name == "chat_prompt":
            threads.append(threading.get_ident())
            started.set()
            assert release.wait(10), "never released"
        return original(prompt)

    setattr(engine, name, blocking)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, f"{server.base_url}/{path}", json=_body(path, max_tokens=2), timeout=30)
        assert started.wait(10)
        health = httpx.get(f"{server.base_url.removesuffix('/v1')}/health", timeout=5)  # the loop is free
        assert health.json() == {"status": "ok"} and not answer.done()
        release.set()
        assert answer.result().status_code == 200
    assert threads and server.thread.ident not in threads, "tokenized on the event loop's thread"


def test_a_body_over_the_cap_is_refused_with_413_before_it_is_parsed(text_model):
    engine = make_engine(text_model)
    tokenized = []
    tokenize = engine.tokenize
    engine.tokenize = lambda prompt: tokenized.append(prompt) or tokenize(prompt)
    with ServerThread(build_app(engine, MODEL, max_body_bytes=100_000)) as server:
        url = f"{server.base_url}/completions"
        big = {"model": MODEL, "prompt": "word " * 30_000}  # 150 kB
        r = httpx.post(url, json=big)
        assert r.status_code == 413 and "100000 bytes" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["type"] == "invalid_request_error"

        def chunked():  # no Content-Length: the cap counts the bytes as they come
            data = json.dumps(big).encode()
            for i in range(0, len(data), 16_384):
                yield data[i : i + 16_384]

        r = httpx.post(url, content=chunked(), headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        assert tokenized == [], "a refused body reached the tokenizer"
        small = httpx.post(url, json={"model": MODEL, "prompt": "word " * 300, "max_tokens": 2})
        assert small.status_code == 200 and tokenized
        chat = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "word " * 30_000}]},
        )
        assert chat.status_code == 413
    from minieng.serve.server import MIN_MAX_BODY_BYTES, default_max_body_bytes

    assert default_max_body_bytes(engine) == MIN_MAX_BODY_BYTES == 2**20


# -- requests that end on their own, streamed ------------------------------------------------------------


def _greedy_ids(text_model, path: str, prompt: str, n: int) -> list[int]:
    """The tiny model's first n greedy tokens for a prompt (as the chat template wraps it for chat)."""
    engine = make_engine(text_model)
    ids = engine.chat_prompt([{"role": "user", "content": prompt}]) if path == "chat/completions" else prompt
    return engine.generate(ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0].token_ids


def _whole_and_streamed(server, path: str, body: dict) -> tuple[dict, list]:
    whole = httpx.post(f"{server.base_url}/{path}", json=body).json()
    with httpx.stream(
        "POST", f"{server.base_url}/{path}", json=dict(body, stream=True, stream_options={"include_usage": True})
    ) as r:
        got = events(r)
    assert got[-1] == "[DONE]"
    return whole, got[:-1]


def _text(chunks: list, chat: bool) -> str:
    return "".join(
        (c["choices"][0]["delta"].get("content", "") if chat else c["choices"][0]["text"])
        for c in chunks
        if c["choices"]
    )


@pytest.mark.parametrize("path", ["completions", "chat/completions"])
@pytest.mark.parametrize("end", ["stop string", "eos"])
def test_a_streamed_request_that_ends_naturally_finishes_with_stop(text_model, path, end):
    """Every other streaming test stops on length (ignore_eos): here the request ends on a stop
    string, or on EOS, and the streamed answer ends like the whole one: the last choice chunk
    says finish_reason "stop", the text is the same, and so is the usage."""
    chat = path == "chat/completions"
    prompt = "Tell me a story about a dragon"
    ids = _greedy_ids(text_model, path, prompt, 24)
    loaded, body = text_model, {"model": MODEL, "max_tokens": 24, "temperature": 0}
    body |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    if end == "eos":  # the model's third greedy token made its EOS: it stops there, 3 tokens in
        eos = ids[2]
        assert eos not in ids[:2]
        loaded = dataclasses.replace(text_model, eos_token_ids={eos})
        expected_tokens = 3
    else:
        text = text_model.tokenizer.decode(ids, skip_special_tokens=True)
        at = next(i for i in range(len(text) // 3, len(text) - 2) if text[i : i + 3].strip() == text[i : i + 3])
        body["stop"] = [text[at : at + 3]]
        expected_tokens = None
    engine = make_engine(loaded)
    with ServerThread(build_app(engine, MODEL)) as server:
        whole, chunks = _whole_and_streamed(server, path, body)
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "stop"
    content, usage_chunk = chunks[:-1], chunks[-1]
    reasons = [c["choices"][0]["finish_reason"] for c in content]
    assert reasons[-1] == "stop" and all(r is None for r in reasons[:-1]), reasons
    assert _text(content, chat) == (choice["message"]["content"] if chat else choice["text"])
    tokens = ("prompt_tokens", "completion_tokens")  # cached_tokens differ: the second request hits the cache
    assert [usage_chunk["usage"][k] for k in tokens] == [whole["usage"][k] for k in tokens]
    if expected_tokens is not None:
        assert whole["usage"]["completion_tokens"] == expected_tokens
    else:
        assert body["stop"][0] not in _text(content, chat) and whole["usage"]["completion_tokens"] < 24


def test_stop_token_ids_end_the_answer(served, text_model):
    """vLLM's stop_token_ids extension is honoured (it used to be ignored)."""
    engine, server, _ = served
    ids = _greedy_ids(text_model, "completions", "Once upon a time", 8)
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "stop_token_ids": [ids[1]],
    }
    assert ids[1] != ids[0]
    got = httpx.post(f"{server.base_url}/completions", json=body).json()
    assert got["choices"][0]["finish_reason"] == "stop" and got["usage"]["completion_tokens"] == 2


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
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": rng.randint(1, 24),
            "temperature": rng.choice([0, 0.7]),
            "ignore_eos": rng.random() < 0.5,
        }
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
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": body["max_tokens"],
                    "temperature": 0,
                }
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
        assert loop._queues == {}, "a finished or aborted request's output queue stayed behind"
    for counts in (first, second):
        assert counts["failed"] == [], counts["failed"][:5]
        assert counts["answered"] > 300 and counts["aborted"] > 20 and counts["refused"] > 20
    assert first["answered"] + first["aborted"] + first["refused"] == 500
    assert len(finished) == sum(c["answered"] + c["aborted"] for c in (first, second))
    assert rss_after_second - rss_after_first < 64, (rss_after_first, rss_after_second)


# -- vLLM's stats line -------------------------------------------------------------------------------

STATS_LINE = re.compile(
    r"Engine 000: Avg prompt throughput: (\d+\.\d) tokens/s, Avg generation throughput: (\d+\.\d) tokens/s, "
    r"Running: (\d+) reqs, Waiting: (\d+) reqs, GPU KV cache usage: (\d+\.\d)%, Prefix cache hit rate: (\d+\.\d)%"
)


def test_the_server_logs_vllms_stats_line_every_interval(tiny_engine, caplog):
    """S1: the server logs prompt and generation throughput as vLLM's LoggingStatLogger counts them;
    two quiet intervals later the line drops to DEBUG, as vLLM's does. A tiny model and token ids:
    no tokenizer to load."""
    caplog.set_level(logging.DEBUG, logger="minieng.serve.async_engine")
    engine = tiny_engine()  # blocks of 4 tokens
    shared = list(range(10, 26))  # four blocks, cached by the first request for the second
    with ServerThread(build_app(engine, MODEL, log_interval_s=0.1)) as server:
        for tail in ([30, 31, 32, 33], [40, 41, 42, 43, 44]):
            body = {"model": MODEL, "prompt": shared + tail, "max_tokens": 3, "ignore_eos": True}
            assert httpx.post(f"{server.base_url}/completions", json=body, timeout=30).status_code == 200

        def lines(level):
            return [STATS_LINE.fullmatch(r.getMessage()) for r in caplog.records if r.levelno == level]

        assert wait_until(lambda: len(lines(logging.DEBUG)) >= 1), "quiet intervals are logged at DEBUG"
    info = lines(logging.INFO)
    assert info and all(info), [r.getMessage() for r in caplog.records]
    assert any(float(m[1]) > 0 for m in info) and any(float(m[2]) > 0 for m in info)
    last = info[-1]  # after both requests: nothing running, hits 16 of the 20 + 21 tokens looked up
    assert (last[3], last[4], last[6]) == ("0", "0", f"{100 * 16 / 41:.1f}")


def test_log_interval_zero_logs_no_stats(tiny_engine, caplog):
    caplog.set_level(logging.DEBUG, logger="minieng.serve.async_engine")
    app = build_app(tiny_engine(), MODEL, log_interval_s=0)
    with ServerThread(app) as server:
        body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}
        assert httpx.post(f"{server.base_url}/completions", json=body, timeout=30).status_code == 200
        time.sleep(0.2)
        assert app.state.engine_loop.stat_logger is None
    assert not any(STATS_LINE.search(r.getMessage()) for r in caplog.records)
    with pytest.raises(ValueError, match="log_interval_s"):
        build_app(tiny_engine(), MODEL, log_interval_s=-1)


# -- the load generator --------------------------------------------------------------------------------


def test_stream_metrics_follow_the_definitions():
    from minieng.measure.loadgen import stream_metrics

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
    from minieng.measure.metrics import SLO, serving_metrics
    from minieng.measure.workloads import poisson_workload
    from minieng.measure.loadgen import load_requests, run_load

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
    assert (
        client.completed == ours.completed == 24 and client.total_output_tokens == ours.total_output_tokens == 24 * 12
    )
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

    from minieng.measure.loadgen import LoadRequest, run_load

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
    from minieng.cli.main import main

    engine, server, _ = served
    code = main(
        [
            "loadgen",
            "--base-url",
            server.base_url,
            "--num-requests",
            "4",
            "--rate",
            "50",
            "--prompt-tokens",
            "16",
            "--output-tokens-per-request",
            "3",
            "--slo-ttft-ms",
            "5000",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["errors"] == []
    assert report["metrics"]["completed"] == 4 and report["metrics"]["total_output_tokens"] == 12
    assert report["server"]["model"] == MODEL and report["metrics"]["num_good_requests"] == 4


def _timed(*chunks) -> list[tuple[float, dict]]:
    """Chunks arriving 1 s apart, the first at t = 1 (the request is sent at t = 0)."""
    return [(float(i + 1), chunk) for i, chunk in enumerate(chunks)]


def _delta(finish=None, **delta) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE_3 = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}


def test_loadgen_times_reasoning_as_tokens():
    """A reasoning model streams reasoning_content before content: its first token is the first
    reasoning chunk (TTFT 2 s here), not the first content (4 s), as vLLM's bench client counts."""
    from minieng.measure.loadgen import stream_figures

    chunks = _timed(
        _delta(role="assistant", content=""),
        _delta(reasoning_content="Let me"),
        _delta(reasoning_content=" think."),
        _delta(content="Blue."),
        _delta("stop"),
        USAGE_3,
    )
    m = stream_figures(0.0, chunks, chat=True)
    assert m.ttft_s == pytest.approx(2.0) and m.e2el_s == pytest.approx(5.0), "E2EL: the finishing chunk"
    assert m.itl_s == pytest.approx([1.0, 1.0]) and m.tpot_s == pytest.approx(1.5) and m.ok
    newer = _timed(_delta(reasoning="Hm."), _delta(content="Yes", finish="stop"), USAGE_3)  # vLLM's newer name
    assert stream_figures(0.0, newer, chat=True).ttft_s == pytest.approx(1.0)
    tools = _timed(_delta(tool_calls=[{"index": 0, "function": {"arguments": "{"}}]), _delta("tool_calls"), USAGE_3)
    assert stream_figures(0.0, tools, chat=True).ttft_s == pytest.approx(1.0)


def test_loadgen_counts_tokens_seen_in_usage_or_logprobs():
    """Chunks with no text still carry a token when their usage grew (vLLM's continuous usage
    stats) or they carry its log-probabilities; the final usage-only chunk carries none."""
    from minieng.measure.loadgen import stream_figures

    def text(t, usage=None, logprobs=None, finish=None):
        return {"choices": [{"text": t, "logprobs": logprobs, "finish_reason": finish}], "usage": usage}

    held_back = _timed(
        text("", usage={"prompt_tokens": 5, "completion_tokens": 1}), text("ab"), text("", finish="length"), USAGE_3
    )
    assert stream_figures(0.0, held_back, chat=False).ttft_s == pytest.approx(1.0)
    logprobs = _timed(
        text("", logprobs={"tokens": ["\ufffd"], "token_logprobs": [-0.1]}), text("é", finish="length"), USAGE_3
    )
    assert stream_figures(0.0, logprobs, chat=False).ttft_s == pytest.approx(1.0)


def test_loadgen_times_a_request_whose_only_token_hit_a_stop(served, text_model):
    """minieng's own stream of a request whose first token completes a stop string: no text at
    all, one token. The loadgen gave it no TTFT or E2EL, so it never counted toward goodput,
    while the engine's record did; now its finishing chunk is its first (and last) token."""
    from minieng.measure.metrics import SLO
    from minieng.measure.loadgen import stream_figures

    engine, server, finished = served
    first = text_model.tokenizer.decode(_greedy_ids(text_model, "completions", "Hello", 1))
    body = {
        "model": MODEL,
        "prompt": "Hello",
        "max_tokens": 8,
        "temperature": 0,
        "stop": [first],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    send, chunks = time.perf_counter(), []
    with httpx.stream("POST", f"{server.base_url}/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append((time.perf_counter(), json.loads(line[6:])))
    assert [c["choices"][0]["text"] for _, c in chunks if c["choices"]] == [""]
    m = stream_figures(send, chunks, chat=False)
    assert (m.output_tokens, m.finish_reason, m.ok) == (1, "stop", True)
    assert m.ttft_s is not None and m.ttft_s == m.e2el_s and m.tpot_s is None
    assert SLO(ttft_ms=60_000, e2el_ms=60_000).met_by(m)
    assert wait_until(lambda: finished) and SLO(ttft_ms=60_000).met_by(request_metrics(finished[0]))


def test_loadgen_fails_a_request_on_an_error_in_its_stream():
    """An error object anywhere in a stream fails the request with its message, even after a
    finish_reason (vLLM's error-then-[DONE] stream was reported as "server sent no usage block")."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from minieng.measure.loadgen import LoadRequest, run_load, stream_figures

    error = {"error": {"message": "the KV cache is exhausted", "type": "server_error", "code": 500}}
    after_finish = _timed(_delta(content="Hi"), _delta("stop"), error, USAGE_3)
    with pytest.raises(RuntimeError, match="the KV cache is exhausted"):
        stream_figures(0.0, after_finish, chat=True)
    with pytest.raises(RuntimeError, match="old style"):
        stream_figures(0.0, _timed({"object": "error", "message": "old style"}, USAGE_3), chat=True)

    app = FastAPI()

    @app.post("/v1/completions")
    async def completions():
        async def chunks():
            yield 'data: {"choices": [{"text": "hi", "finish_reason": null}]}\n\n'
            yield f"data: {json.dumps(error)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    with ServerThread(app) as server:
        result = run_load(server.base_url, "any", [LoadRequest(0.0, "x", 4)], progress=False)
    assert len(result.errors) == 1 and "the KV cache is exhausted" in result.errors[0], result.errors
    assert result.summary().failed == 1 and not result.requests[0].ok
