"""Log-probabilities through the server: completions' ``logprobs`` and ``echo`` (``max_tokens: 0``
scores a prompt, what lm-eval's loglikelihood requests do), chat's ``logprobs`` / ``top_logprobs``,
streamed and whole, against transformers' ``log_softmax`` over the same tokens (float32, 1e-4).

The engine is a tiny random Llama over the default model's vocabulary and tokenizer, built with a
transformers twin of the same weights (``helpers.tiny_pair``), served by a real uvicorn server on
loopback as in ``test_server.py`` (its helpers). lm-eval itself is not needed here: ``make
eval-check`` runs it (tests/eval/).
"""

from __future__ import annotations

import pytest
import torch

httpx = pytest.importorskip("httpx", reason="the server extra (pip install -e '.[serve]') is not installed")
pytest.importorskip("fastapi", reason="the server extra (pip install -e '.[serve]') is not installed")

import test_server  # noqa: E402
from helpers import TINY_SHAPE, hf_logits, tiny_pair  # noqa: E402

from minieng.model.loader import LoadedModel  # noqa: E402
from minieng.serve.server import ServerThread, build_app  # noqa: E402

MODEL, events, make_engine, wait_until = (
    test_server.MODEL,
    test_server.events,
    test_server.make_engine,
    test_server.wait_until,
)
TOL = 1e-4  # float32: the engine's paged forward against transformers' eager one
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def twin(default_model):
    """(transformers model, LoadedModel): one tiny random Llama over the default model's vocabulary,
    with its tokenizer and EOS ids on minieng's side."""
    from transformers import LlamaConfig

    shape = dict(TINY_SHAPE, vocab_size=default_model.model.config.vocab_size, max_position_embeddings=512)
    hf, loaded = tiny_pair(LlamaConfig(**shape, tie_word_embeddings=False), seed=3)
    return hf, LoadedModel(
        loaded.model, default_model.tokenizer, loaded.hf_config, set(default_model.eos_token_ids), None
    )


def _serve(twin, **engine_fields):
    engine = make_engine(twin[1], **engine_fields)
    finished = []
    return engine, ServerThread(build_app(engine, MODEL, on_finished=finished.append)).start(), finished


@pytest.fixture
def served(twin):
    """(transformers model, engine, server, finished outputs); the server stops after the test."""
    engine, server, finished = _serve(twin)
    yield twin[0], engine, server, finished
    server.stop()


def _post(server, path: str, **fields) -> dict:
    r = httpx.post(f"{server.base_url}/{path}", json={"model": MODEL, **fields}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(server, path: str, **fields) -> list[dict]:
    body = {"model": MODEL, "stream": True, **fields}
    with httpx.stream("POST", f"{server.base_url}/{path}", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        got = events(r)
    assert got[-1] == "[DONE]"
    return got[:-1]


def _refused(server, path: str, param: str, **fields) -> str:
    r = httpx.post(f"{server.base_url}/{path}", json={"model": MODEL, **fields}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    return error["message"]


def _final(finished, response_id: str, index: int = 0):
    """The engine's final output of choice ``index`` of a response (request ids are ``id-index``)."""
    request_id = f"{response_id}-{index}"
    assert wait_until(lambda: any(out.request_id == request_id for out in finished))
    return next(out for out in finished if out.request_id == request_id)


def _prompt_tokens_counted(server) -> float:
    """``minieng:prompt_tokens_total`` of /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "minieng:prompt_tokens")
    return next(s.value for s in family.samples if s.name == "minieng:prompt_tokens_total")


@torch.no_grad()
def _reference(hf, ids: list[int]) -> torch.Tensor:
    """transformers' log_softmax at every position of ``ids``: [len(ids), vocab] float32."""
    return torch.log_softmax(hf_logits(hf, ids), dim=-1)


def _check_top(top: dict[str, float], row: torch.Tensor, own: float, k: int, tokenizer, what: str) -> None:
    """A completion's ``top_logprobs`` entry: the token's own value and the k most likely values
    (k + 1 entries at most, OpenAI's rule), each the value of the token its text names."""
    expected = sorted({round(v, 3) for v in row.topk(k).values.tolist()} | {round(own, 3)})
    assert sorted(round(v, 3) for v in top.values()) == pytest.approx(expected, abs=1e-3), what
    assert len(top) <= k + 1, what
    for text, value in top.items():
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == 1:  # a text that is one token names it: its value is that token's
            assert abs(value - row[ids[0]].item()) < TOL, what


# -- completions ---------------------------------------------------------------------------------------


def test_echoed_greedy_completion_equals_transformers(served):
    """``echo`` with ``logprobs``: the prompt's tokens (the first null) then the completion's, each
    value and its top-k those of transformers' log_softmax; the sums the issue names within 1e-4; the
    text is the prompt then the completion, and ``text_offset`` indexes each token's text in it."""
    hf, engine, server, finished = served
    k = 3
    got = _post(
        server, "completions", prompt=PROMPT, max_tokens=8, temperature=0, ignore_eos=True, logprobs=k, echo=True
    )
    choice = got["choices"][0]
    out = _final(finished, got["id"])
    prompt, generated = out.prompt_token_ids, out.token_ids
    ids, p = prompt + generated, len(prompt)
    ref = _reference(hf, ids)
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids) == p + 8
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, "nothing predicts the first token"
    expected = [ref[i - 1, ids[i]].item() for i in range(1, len(ids))]
    assert lp["token_logprobs"][1:] == pytest.approx(expected, abs=TOL)
    assert sum(lp["token_logprobs"][1:p]) == pytest.approx(sum(expected[: p - 1]), abs=TOL), "the prompt's sum"
    assert sum(lp["token_logprobs"][p:]) == pytest.approx(sum(expected[p - 1 :]), abs=TOL), "the completion's sum"
    for i in range(1, len(ids)):
        _check_top(lp["top_logprobs"][i], ref[i - 1], expected[i - 1], k, engine.tokenizer, f"token {i}")
    for j in range(p, len(ids)):  # greedy: each generated token is the most likely (lm-eval's is_greedy)
        assert lp["token_logprobs"][j] == max(lp["top_logprobs"][j].values())
    text = choice["text"]
    assert text == PROMPT + out.text and text.startswith(PROMPT)
    assert lp["tokens"] == [engine.tokenizer.decode([i]) for i in ids]
    assert "".join(lp["tokens"]) == text, "these tokens' texts make up the text"
    offsets = lp["text_offset"]
    assert offsets[0] == 0
    for token, offset in zip(lp["tokens"], offsets):
        assert text[offset : offset + len(token)] == token
    assert got["usage"]["prompt_tokens"] == p and got["usage"]["completion_tokens"] == 8


def test_logprobs_are_the_raw_distribution_whatever_the_sampling(served):
    """Sampled at temperature 1.7 with top_k: the values are still log_softmax of the raw logits
    (vLLM's raw_logprobs), and without echo only the completion's tokens come back."""
    hf, engine, server, finished = served
    got = _post(
        server,
        "completions",
        prompt=PROMPT,
        max_tokens=6,
        temperature=1.7,
        top_k=40,
        seed=2,
        ignore_eos=True,
        logprobs=0,
    )
    out = _final(finished, got["id"])
    ids, p = out.prompt_token_ids + out.token_ids, len(out.prompt_token_ids)
    ref = _reference(hf, ids)
    lp = got["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 6 and got["choices"][0]["text"] == out.text
    assert lp["token_logprobs"] == pytest.approx(
        [ref[p - 1 + j, t].item() for j, t in enumerate(out.token_ids)], abs=TOL
    )
    assert all(len(top) == 1 for top in lp["top_logprobs"]), "k=0: the sampled token's alone"
    assert lp["text_offset"][0] == 0


def test_max_tokens_0_with_echo_scores_the_prompt_without_generating(served):
    """What lm-eval's loglikelihood asks: the prompt alone, scored; no completion token, usage 0;
    the engine loop goes on (a scored prompt has no emission) and /metrics counts its prompt."""
    hf, engine, server, finished = served
    before = _prompt_tokens_counted(server)
    got = _post(server, "completions", prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
    choice, out = got["choices"][0], _final(finished, got["id"])
    assert _prompt_tokens_counted(server) - before == len(out.prompt_token_ids)
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length" and out.token_ids == []
    assert got["usage"]["completion_tokens"] == 0 and got["usage"]["prompt_tokens"] == len(out.prompt_token_ids)
    ref = _reference(hf, out.prompt_token_ids)
    ids = out.prompt_token_ids
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(
        [ref[i - 1, ids[i]].item() for i in range(1, len(ids))], abs=TOL
    )
    plain = _post(server, "completions", prompt=PROMPT, max_tokens=0, echo=True)  # echo alone: the text only
    assert plain["choices"][0]["text"] == PROMPT and plain["choices"][0]["logprobs"] is None
    streamed = _stream(server, "completions", prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
    assert [c["choices"][0]["text"] for c in streamed] == [PROMPT]
    assert streamed[0]["choices"][0]["logprobs"] == choice["logprobs"]
    assert _post(server, "completions", prompt=PROMPT, max_tokens=2)["usage"]["completion_tokens"] == 2


def test_lm_eval_loglikelihood_batch(served):
    """lm-eval's ``local-completions`` request: a batch of token-id prompts (context + continuation),
    ``max_tokens: 1, logprobs: 1, echo: true, temperature: 0``; it sums ``token_logprobs[ctxlen:-1]``
    and calls a continuation greedy when each value is its top entry's maximum. Both equal
    transformers' over the same tokens."""
    hf, engine, server, finished = served
    tok = engine.tokenizer
    pairs = [("The capital of France is", " Paris"), ("Water boils at", " 100 degrees"), ("One plus one is", " two")]
    pairs.append(("Two", " plus two is four and more"))
    prompts = [tok.encode(c) + tok.encode(x) for c, x in pairs]
    got = _post(server, "completions", prompt=prompts, max_tokens=1, logprobs=1, echo=True, temperature=0, seed=1234)
    assert [c["index"] for c in got["choices"]] == [0, 1, 2, 3]
    for (context, _), ids, choice in zip(pairs, prompts, got["choices"]):
        ctxlen = len(tok.encode(context))
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(ids) + 1, "the prompt's tokens, then the one generated"
        ref = _reference(hf, ids)
        expected = sum(ref[i - 1, ids[i]].item() for i in range(ctxlen, len(ids)))
        assert sum(lp["token_logprobs"][ctxlen:-1]) == pytest.approx(expected, abs=TOL)
        greedy = all(ref[i - 1].argmax().item() == ids[i] for i in range(ctxlen, len(ids)))
        is_greedy = all(
            v == max(top.values()) for v, top in zip(lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1])
        )
        assert is_greedy == greedy


def test_streamed_logprobs_equal_the_whole_response(served):
    """Two prompts x n=2, sampled with a seed, echoed with logprobs: each choice's chunks, put
    together, carry the whole response's text and log-probabilities, text offsets included."""
    hf, engine, server, finished = served
    fields = dict(
        prompt=[PROMPT, "Once upon a time"], n=2, max_tokens=7, temperature=0.9, seed=4, logprobs=2, echo=True
    )
    whole = _post(server, "completions", **fields)
    chunks = _stream(server, "completions", **fields)
    for choice in whole["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == choice["index"]]
        assert "".join(c["text"] for c in mine) == choice["text"]
        joined = {key: [v for c in mine if c["logprobs"] for v in c["logprobs"][key]] for key in choice["logprobs"]}
        assert joined == choice["logprobs"], choice["index"]
        assert all(c["logprobs"] is not None for c in mine if c["text"]), "every chunk with text carries its tokens'"
    assert len({c["text"] for c in whole["choices"]}) == 4


def test_logprobs_beyond_the_servers_cap_are_refused_naming_it(twin):
    """The cap is the engine's max_logprobs (vLLM's rule), not OpenAI's 5: 4 passes a cap of 4 and 5
    is refused naming the cap; so is chat's top_logprobs. Nothing reaches the engine."""
    engine, server, _ = _serve(twin, max_logprobs=4)
    try:
        assert len(_post(server, "completions", prompt=PROMPT, max_tokens=2, logprobs=4)["choices"]) == 1
        message = _refused(server, "completions", "logprobs", prompt=PROMPT, max_tokens=2, logprobs=5)
        assert "max_logprobs=4" in message and "ask for 4 or fewer" in message
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logprobs": True}
        assert "max_logprobs=4" in _refused(server, "chat/completions", "top_logprobs", **chat, top_logprobs=5)
        assert engine.requests == {}
    finally:
        server.stop()


def test_what_log_probabilities_cannot_ask_is_refused(served):
    hf, engine, server, _ = served
    assert "echo=true" in _refused(server, "completions", "max_tokens", prompt=PROMPT, max_tokens=0)
    _refused(server, "completions", "logprobs", prompt=PROMPT, logprobs=-1)
    _refused(server, "completions", "logprobs", prompt=PROMPT, logprobs=True)  # an integer, not a flag
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert "logprobs" in _refused(server, "chat/completions", "top_logprobs", **chat, top_logprobs=2)
    _refused(server, "chat/completions", "logprobs", **chat, logprobs=3)  # a flag, not a count
    _refused(server, "chat/completions", "max_tokens", **dict(chat, max_tokens=0))
    _refused(server, "chat/completions", "echo", **chat, echo=True)
    _refused(server, "completions", "prompt_logprobs", prompt=PROMPT, prompt_logprobs=1)
    assert engine.requests == {}


# -- chat ----------------------------------------------------------------------------------------------


def test_chat_top_logprobs_equal_transformers(served):
    """``logprobs: true, top_logprobs: 3``: one item per completion token, its value transformers',
    ``bytes`` its text's UTF-8, ``top_logprobs`` the 3 most likely, most likely first; the stream's
    items, put together, are the same."""
    hf, engine, server, finished = served
    fields = dict(messages=[{"role": "user", "content": "Hi there"}], max_tokens=6, temperature=0, ignore_eos=True)
    got = _post(server, "chat/completions", **fields, logprobs=True, top_logprobs=3)
    out = _final(finished, got["id"])
    ids, p = out.prompt_token_ids + out.token_ids, len(out.prompt_token_ids)
    ref = _reference(hf, ids)
    content = got["choices"][0]["logprobs"]["content"]
    assert len(content) == 6 and got["choices"][0]["message"]["content"] == out.text
    for j, (item, token) in enumerate(zip(content, out.token_ids)):
        row = ref[p - 1 + j]
        assert item["token"] == engine.tokenizer.decode([token])
        assert item["bytes"] == list(item["token"].encode("utf-8"))
        assert abs(item["logprob"] - row[token].item()) < TOL
        top = item["top_logprobs"]
        assert [t["logprob"] for t in top] == pytest.approx(row.topk(3).values.tolist(), abs=TOL)
        assert top[0]["token"] == item["token"], "greedy: the token is the most likely"
        assert all(t["bytes"] == list(t["token"].encode("utf-8")) for t in top)
    assert sum(i["logprob"] for i in content) == pytest.approx(
        sum(ref[p - 1 + j, t].item() for j, t in enumerate(out.token_ids)), abs=TOL
    )
    chunks = _stream(server, "chat/completions", **fields, logprobs=True, top_logprobs=3)
    streamed = [item for c in chunks for item in ((c["choices"][0]["logprobs"] or {}).get("content") or [])]
    assert streamed == content
    plain = _post(server, "chat/completions", **fields, logprobs=True)
    assert [i["top_logprobs"] for i in plain["choices"][0]["logprobs"]["content"]] == [[]] * 6, "top_logprobs 0"
    assert _post(server, "chat/completions", **fields)["choices"][0]["logprobs"] is None


# -- the openai client ---------------------------------------------------------------------------------


def test_the_openai_client_reads_the_log_probabilities(served):
    openai = pytest.importorskip("openai")
    hf, engine, server, _ = served
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    completion = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=3, logprobs=2, echo=True, temperature=0
    )
    lp = completion.choices[0].logprobs
    p = len(engine.tokenize(PROMPT))
    assert completion.choices[0].text.startswith(PROMPT) and len(lp.tokens) == p + 3
    assert lp.token_logprobs[0] is None and all(isinstance(v, float) for v in lp.token_logprobs[1:])
    assert lp.top_logprobs[0] is None and all(1 <= len(t) <= 3 for t in lp.top_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    messages = [{"role": "user", "content": "Hi"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, logprobs=True, top_logprobs=2)
    items = chat.choices[0].logprobs.content
    assert len(items) == 3 and all(len(i.top_logprobs) == 2 and i.logprob <= 0 for i in items)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=3, logprobs=True, top_logprobs=2, temperature=0, stream=True
    )
    streamed = [
        i for chunk in stream if chunk.choices and chunk.choices[0].logprobs for i in chunk.choices[0].logprobs.content
    ]
    greedy = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=3, logprobs=True, top_logprobs=2, temperature=0
    )
    assert [i.token for i in streamed] == [i.token for i in greedy.choices[0].logprobs.content]
