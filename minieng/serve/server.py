"""An OpenAI-compatible HTTP server over one engine: ``python -m minieng serve``.

Endpoints: ``GET /health``, ``GET /v1/models`` and ``GET /v1/models/{model}`` (OpenAI's),
``POST /v1/completions`` and ``POST /v1/chat/completions`` (the chat template applied), streamed as
server-sent events when ``stream`` is true, with ``n`` choices of each prompt and a completion's
batch of prompts (``respond``), log-probabilities and a completion's echoed prompt
(``logprobs.py``: OpenAI's objects, as vLLM builds them); vLLM's ``POST /tokenize`` and
``POST /detokenize``; and ``GET /metrics``, Prometheus' text format (``metrics.ServerMetrics``:
vLLM's ``vllm:`` metrics as ``minieng:``). Built on FastAPI and uvicorn; request bodies are checked
by the models of ``protocol.py``, after a size cap (``max_body_bytes``: 413 beyond it, before any
parsing).

One engine loop serves every connection (``AsyncEngine``): a task on the server's event loop
that, between steps, queues the requests handlers have submitted and aborts the ones whose
clients left, then runs ``engine.step()`` in a thread of its own, so the event loop keeps
accepting connections and writing streams while the model computes. Each step's outputs are put
on per-request queues without waiting, so a slow client never holds the loop back: its text waits
in its queue. With nothing to run (no request, or a static batch filling) the loop sleeps until a
request arrives or the batch's timeout. Handlers never touch the engine's state while a step
runs; they only validate (``LLMEngine.check_request``, which changes nothing) and submit.
Tokenizing and applying the chat template run in worker threads too: a prompt of a megabyte
takes the tokenizer most of a second, which on the event loop would stall every other client.

A client that disconnects aborts its request, whatever the endpoint and mode: each handler runs
beside a watcher of the connection (``connections.cancel_on_disconnect``, vLLM's ``with_cancellation``),
and a disconnect cancels the handler, whose ``except``/``finally`` asks the loop to abort the
request; that happens before the next step, and its KV blocks return to the pool. Finished
requests are released from the engine (``LLMEngine.release_request``) once their last output is
queued, so memory stays flat however long the server runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import NamedTuple

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from minieng.config import DEFAULT_MODEL_NAME, SamplingParams
from minieng.core.outputs import check_text
from minieng.engine.llm_engine import LLMEngine
from minieng.core.outputs import RequestOutput
from minieng.measure.logged_throughput import DEFAULT_LOG_INTERVAL_S
from minieng.serve.connections import BodyLimit, cancel_on_disconnect
from minieng.serve.async_engine import AsyncEngine, EngineStepError, check_log_interval, new_request_id
from minieng.serve.logprobs import ChoiceLogprobs
from minieng.serve.metrics import ServerMetrics
from minieng.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    NotHonoured,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    error_body,
    model_card,
    models_list,
    usage,
    usage_chunk,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# The request body cap: enough for a prompt that fills the context in any JSON form (a token as
# token ids takes ~7 bytes, as escaped text at most a dozen), and never under 1 MiB.
BODY_BYTES_PER_TOKEN = 32
MIN_MAX_BODY_BYTES = 2**20
# The most choices (n x prompts) one request may ask for: each is an engine request holding its own
# KV blocks, so a larger batch is better split by the client. OpenAI's API caps n at 128.
DEFAULT_MAX_CHOICES = 128


class _Prepared(NamedTuple):
    """One prompt of a request, ready for the engine: its ids, its ``SamplingParams`` and, with
    completions' ``echo``, the text to return before the completion (None: no echo)."""

    ids: list[int]
    params: SamplingParams
    echo: str | None = None


class _Refused(Exception):
    """A request refused with an OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def default_max_body_bytes(engine: LLMEngine) -> int:
    """The body cap ``build_app`` uses unless given one: ``BODY_BYTES_PER_TOKEN`` per token of
    ``max_model_len``, at least ``MIN_MAX_BODY_BYTES``."""
    return max(MIN_MAX_BODY_BYTES, BODY_BYTES_PER_TOKEN * engine.max_model_len)


def served_model_name(engine: LLMEngine) -> str:
    """The model id clients must send: the ``--model`` given, or the embedded default's name."""
    if engine.config.model:
        return engine.config.model
    return DEFAULT_MODEL_NAME


def build_app(
    engine: LLMEngine,
    model_name: str | None = None,
    on_finished: Callable[[RequestOutput], None] | None = None,
    max_body_bytes: int | None = None,
    log_interval_s: float | None = DEFAULT_LOG_INTERVAL_S,
    max_choices: int = DEFAULT_MAX_CHOICES,
):
    """The FastAPI application serving ``engine`` under ``model_name`` (default ``served_model_name``).

    The engine loop starts and stops with the application (its lifespan). ``app.state.engine_loop``
    is the ``AsyncEngine``, ``app.state.metrics`` the ``ServerMetrics`` behind ``GET /metrics`` (a
    registry of this app's own). Request bodies over ``max_body_bytes`` (default
    ``default_max_body_bytes``) are refused with 413. A request may ask for at most ``max_choices``
    choices, ``n`` x its prompts (400 beyond). Every ``log_interval_s`` seconds the loop logs vLLM's
    stats line (``AsyncEngine``; None or 0: none). Raises ``ValueError`` for a negative
    ``log_interval_s`` or a ``max_choices`` under 1.
    """
    check_log_interval(log_interval_s)
    if max_choices < 1:
        raise ValueError(f"max_choices={max_choices} must be >= 1 (choices a request may ask for, n x prompts)")
    model_name = model_name or served_model_name(engine)
    created = int(time.time())
    metrics = ServerMetrics(
        model_name, engine.max_model_len, engine.block_manager.num_blocks, engine.block_manager.block_size
    )

    @asynccontextmanager
    async def lifespan(app):
        app.state.engine_loop = AsyncEngine(engine, on_finished, log_interval_s, metrics)
        app.state.engine_loop.start()
        yield
        await app.state.engine_loop.stop()

    app = FastAPI(title="minieng", lifespan=lifespan)
    app.state.metrics = metrics
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes or default_max_body_bytes(engine))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        errors = exc.errors() or [{"msg": "invalid request"}]
        if errors[0].get("type") == "json_invalid":
            return JSONResponse(error_body("the body is not valid JSON", 400), status_code=400)
        loc = errors[0].get("loc", ())
        param = str(loc[1]) if len(loc) > 1 else None  # the top-level field (loc[0] is "body")
        # A field of a union type fails once per member: "a valid string or a valid list".
        reasons = dict.fromkeys(e["msg"] for e in errors if len(e.get("loc", ())) > 1 and str(e["loc"][1]) == param)
        message = " or ".join(reasons) or errors[0]["msg"]
        return JSONResponse(error_body(f"{param}: {message}" if param else message, 400, param), status_code=400)

    @app.exception_handler(_Refused)
    async def _refused(request, exc: _Refused):
        return JSONResponse(error_body(exc.message, exc.status, exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        message = str(exc.detail)
        if exc.status_code in (404, 405):  # OpenAI's wording for a route it does not serve
            message = f"Invalid URL ({request.method} {request.url.path}): {message}"
        return JSONResponse(error_body(message, exc.status_code), status_code=exc.status_code)

    def unknown_model(name: str) -> _Refused:
        return _Refused(
            404, f"the model {name!r} does not exist: this server runs {model_name!r}", "model", "model_not_found"
        )

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return models_list(model_name, engine.max_model_len, created)

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        """OpenAI's ``GET /v1/models/{model}``: the model object, or 404 (``model_not_found``)."""
        if model_id != model_name:
            raise unknown_model(model_id)
        return model_card(model_name, engine.max_model_len, created)

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def prometheus_metrics(request: Request):
        """Prometheus' text format (``ServerMetrics``), as vLLM's ``/metrics``; HEAD too (aiperf
        probes the route with it before it reads it)."""
        text, content_type = metrics.render(request.headers.get("accept"))
        return Response(text, media_type=content_type)

    def refuse_early(body, chat: bool) -> None:
        """What needs no tokenizer: the model's name, fields minieng cannot honour, and the number
        of choices (``n`` x prompts) against ``max_choices``."""
        if body.model != model_name:
            raise unknown_model(body.model)
        try:
            body.check_honoured(engine.config.max_logprobs)
        except NotHonoured as e:
            raise _Refused(400, str(e), e.param) from None
        n, num_prompts = body.num_choices, 1 if chat else len(body.prompts())
        if n * num_prompts > max_choices:
            asked = f"{num_prompts} prompts x n={n}" if num_prompts > 1 else f"n={n}"
            raise _Refused(
                400,
                f"{asked} asks for {n * num_prompts} choices; this server answers at most {max_choices} "
                "per request (each choice is an engine request): send fewer prompts or a smaller n per request",
                "n" if n > 1 else "prompt",
            )

    def prepare(body, chat: bool) -> list[_Prepared]:
        """Each prompt's ids (the chat template applied), ``SamplingParams`` and echoed text, in
        order, or ``_Refused`` naming the prompt. Tokenizes: run in a worker thread, never on the
        event loop."""
        if chat:
            messages, param = body.conversation(), "messages"
            try:
                for i, m in enumerate(messages):
                    check_text(m["content"], f"message {i}'s content")
                prompts = [engine.chat_prompt(messages)]
            except (ValueError, TemplateError) as e:  # no template, an empty message, an order it refuses
                raise _Refused(400, f"messages: {e}", "messages") from None
            default_max_tokens = None  # OpenAI's chat answers may run to the end of the context
            if body.max_completion_tokens is not None:
                body.max_tokens = body.max_completion_tokens
        else:
            prompts, param, default_max_tokens = body.prompts(), "prompt", 16
        echo = not chat and bool(body.echo)
        # A prompt scored without generating may fill the whole context (the engine's rule).
        checked = SamplingParams(max_tokens=0, prompt_logprobs=0) if body.max_tokens == 0 else None
        prepared = []
        for p, prompt in enumerate(prompts):
            which = param if len(prompts) == 1 else f"{param} {p}"
            try:
                ids = engine.check_request(prompt, checked)
            except ValueError as e:  # empty, too long, not Unicode, ids outside the vocabulary
                raise _Refused(400, f"{which}: {e}", param) from None
            room = engine.max_model_len - len(ids)
            try:
                params = body.sampling_params(default_max_tokens or room)
            except ValueError as e:
                raise _Refused(400, str(e)) from None
            if params.max_tokens > room:
                raise _Refused(
                    400,
                    f"{'the prompt' if which == param else which} has {len(ids)} tokens and "
                    f"max_tokens={params.max_tokens}: together they exceed the context of "
                    f"{engine.max_model_len} tokens; lower max_tokens",
                    "max_tokens",
                )
            text = None
            if echo:  # as vLLM: a text prompt as sent, token ids decoded
                text = prompt if isinstance(prompt, str) else engine.tokenizer.decode(ids) if engine.tokenizer else ""
            prepared.append(_Prepared(ids, params, text))
        return prepared

    async def handle(request: Request, body, chat: bool):
        arrival_s = time.perf_counter()
        refuse_early(body, chat)
        prepared = await asyncio.to_thread(prepare, body, chat)
        return await respond(
            request, prepared, body.num_choices, chat, body.include_usage, body.stream, arrival_s, body.num_top_logprobs
        )

    def token_text(token_id: int) -> str:
        """A token's own text (vLLM's ``tokenizer.decode(token_id)``; without a tokenizer vLLM's
        ``token_id:N`` form)."""
        tok = engine.tokenizer
        return f"token_id:{token_id}" if tok is None else tok.decode([token_id])

    async def respond(
        request: Request,
        prepared: list[_Prepared],
        n: int,
        chat: bool,
        include_usage: bool,
        stream: bool,
        arrival_s: float,
        num_top_logprobs: int | None = None,
    ):
        """Submit ``n`` choices of each prompt, one engine request each, and answer them, each
        choice's text and log-probabilities gathered by a ``ChoiceLogprobs`` (``num_top_logprobs``:
        the request's k, None when it asks for none).

        Choice ``i`` of prompt ``p`` has ``index`` ``p * n + i`` (prompt-major, as OpenAI's API and
        vLLM's ``serving_completion.py`` order them) and, with a ``seed``, samples with ``seed`` + i,
        as vLLM's ``ParentRequest._get_child_sampling_params`` (``vllm/v1/engine/parallel_sampling.py``)
        gives its n children their own seeds. Usage sums them as vLLM does: each prompt's tokens
        once, every choice's tokens, and the prefix cache's hits on each prompt's first choice.
        """
        loop: AsyncEngine = request.app.state.engine_loop
        response_id = new_request_id("chatcmpl" if chat else "cmpl")
        queue: asyncio.Queue = asyncio.Queue()  # every choice's outputs, each naming its request
        choice_ids, choices = [], []
        for p, (ids, params, echo) in enumerate(prepared):
            for i in range(n):
                child = params if params.seed is None else replace(params, seed=params.seed + i)
                choice_ids.append(loop.submit(ids, child, arrival_s, f"{response_id}-{p * n + i}", queue)[0])
                choices.append(ChoiceLogprobs(num_top_logprobs, token_text, chat, echo))
        created = int(time.time())

        def totals(finals: list[RequestOutput]) -> dict:
            return usage(
                sum(len(p.ids) for p in prepared),
                sum(len(out.token_ids) for out in finals),
                sum(finals[p * n].num_cached_tokens for p in range(len(prepared))),
            )

        if stream:
            return StreamingResponse(
                _sse(loop, response_id, queue, choice_ids, choices, created, chat, include_usage, totals),
                media_type="text/event-stream",
            )
        index_of = {rid: i for i, rid in enumerate(choice_ids)}
        texts: list[list[str]] = [[] for _ in choice_ids]
        finals: list[RequestOutput | None] = [None] * len(choice_ids)
        remaining = len(choice_ids)
        try:
            while remaining:
                out = await queue.get()
                if isinstance(out, EngineStepError):
                    raise _Refused(500, str(out))
                i = index_of[out.request_id]
                texts[i].append(choices[i].add(out))
                if out.finished:
                    finals[i], remaining = out, remaining - 1
        except BaseException:  # the client left (cancel_on_disconnect), the server stops, or an error
            for rid in choice_ids:
                loop.abort(rid)  # a no-op for those that finished
            raise
        make = chat_response if chat else completion_response
        answers = [("".join(t), out.finish_reason, c.take()) for t, out, c in zip(texts, finals, choices)]
        return make(response_id, model_name, created, answers, totals(finals))

    async def _sse(
        loop: AsyncEngine,
        response_id: str,
        queue: asyncio.Queue,
        choice_ids: list[str],
        choices: list[ChoiceLogprobs],
        created: int,
        chat: bool,
        include_usage: bool,
        totals: Callable[[list[RequestOutput]], dict],
    ) -> AsyncIterator[str]:
        """The server-sent events of every choice, as their tokens come, each chunk naming its
        choice's ``index`` and carrying the log-probabilities of the tokens since the choice's last
        chunk (tokens whose text is held back wait for the next chunk with text, or the last);
        then the usage chunk (with ``include_usage``) and ``[DONE]``."""
        index_of = {rid: i for i, rid in enumerate(choice_ids)}
        finals: list[RequestOutput | None] = [None] * len(choice_ids)
        remaining = len(choice_ids)
        try:
            if chat:  # OpenAI's first chat chunk of each choice carries the role and no text
                for i in range(len(choice_ids)):
                    role = {"role": "assistant", "content": ""}
                    yield _event(chat_chunk(response_id, model_name, created, role, None, include_usage, i))
            while remaining:
                out = await queue.get()
                if isinstance(out, EngineStepError):  # vLLM's way: an error event, then [DONE]
                    remaining = 0
                    yield _event(error_body(str(out), 500))
                    yield "data: [DONE]\n\n"
                    return
                i = index_of[out.request_id]
                text = choices[i].add(out)
                if out.finished:
                    finals[i], remaining = out, remaining - 1
                elif not text:
                    continue  # tokens whose text is not yet safe to show (a partial character, a stop prefix)
                reason, logprobs = out.finish_reason if out.finished else None, choices[i].take()
                if chat:
                    delta = {"content": text} if text else {}
                    yield _event(
                        chat_chunk(response_id, model_name, created, delta, reason, include_usage, i, logprobs)
                    )
                else:
                    yield _event(
                        completion_chunk(response_id, model_name, created, text, reason, include_usage, i, logprobs)
                    )
            if include_usage:
                yield _event(usage_chunk(response_id, model_name, created, chat, totals(finals)))
            yield "data: [DONE]\n\n"
        finally:
            if remaining:  # the client left (the response was cancelled)
                for rid in choice_ids:
                    loop.abort(rid)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await cancel_on_disconnect(request, handle(request, body, chat=False))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await cancel_on_disconnect(request, handle(request, body, chat=True))

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise unknown_model(name)

    def tokenizer():
        if engine.tokenizer is None:
            raise _Refused(400, "this model has no tokenizer: nothing to tokenize or detokenize with")
        return engine.tokenizer

    def tokenize_body(body: TokenizeCompletionRequest | TokenizeChatRequest) -> dict:
        """vLLM's ``TokenizeResponse``; runs in a worker thread (a long prompt takes the tokenizer a while)."""
        tok = tokenizer()
        if isinstance(body, TokenizeChatRequest):
            try:
                body.check_honoured()
            except NotHonoured as e:
                raise _Refused(400, str(e), e.param) from None
            try:
                ids = engine.chat_prompt(body.conversation())
            except (ValueError, TemplateError) as e:
                raise _Refused(400, f"messages: {e}", "messages") from None
        else:
            try:
                check_text(body.prompt, "prompt")
            except ValueError as e:
                raise _Refused(400, str(e), "prompt") from None
            ids = list(tok.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False))
        strs = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids, "token_strs": strs}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        """vLLM's ``POST /tokenize``: a prompt (``TokenizeCompletionRequest``) or a conversation
        (``TokenizeChatRequest``, told apart by its ``messages``) to ``{count, max_model_len,
        tokens, token_strs}``."""
        data = await _json_body(request)
        kind = TokenizeChatRequest if isinstance(data, dict) and "messages" in data else TokenizeCompletionRequest
        body = _validated(kind, data)
        check_model(body.model)
        return await cancel_on_disconnect(request, asyncio.to_thread(tokenize_body, body))

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        """vLLM's ``POST /detokenize``: ``{"prompt": text}`` of ``tokens``, special tokens included."""
        check_model(body.model)
        tok, vocab = tokenizer(), engine.model_config.vocab_size
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise _Refused(400, f"tokens: token ids must be in [0, {vocab}); got {bad}", "tokens")
        return {"prompt": await asyncio.to_thread(tok.decode, body.tokens)}

    return app


async def _json_body(request: Request):
    """The request's JSON body, or the 400 FastAPI gives a body that is not JSON."""
    try:
        return json.loads(await request.body())
    except ValueError:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",), "msg": "JSON decode error"}]) from None


def _validated(model: type[BaseModel], data):
    """``model`` validated from ``data``, or ``RequestValidationError`` located in the body (the
    app's 400, naming the field), as FastAPI validates a declared body."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class ServerThread:
    """A uvicorn server running ``app`` in a background thread (notebooks and tests).

    ``with ServerThread(app) as server:`` starts it on a free port of 127.0.0.1 and waits until it
    accepts connections; ``server.base_url`` is ``http://127.0.0.1:PORT/v1``.
    """

    def __init__(self, app, host: str = DEFAULT_HOST, port: int = 0):
        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self.host, self.port = host, port
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="minieng-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 30.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.host}:{self.port} (port in use?)")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def show_stats_logs() -> None:
    """Print minieng's INFO logs (the stats line) on stderr in vLLM's format, ``INFO 12-02 10:00:00
    [async_engine.py:103] Engine 000: Avg prompt throughput: ...``; a no-op once ``minieng``'s logger
    has a handler."""
    log = logging.getLogger("minieng")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S")
        )
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def serve(
    engine: LLMEngine,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    model_name: str | None = None,
    log_interval_s: float | None = DEFAULT_LOG_INTERVAL_S,
) -> None:
    """Serve ``engine`` until interrupted (``python -m minieng serve``), logging vLLM's stats line
    every ``log_interval_s`` seconds (None or 0: never)."""
    show_stats_logs()
    app = build_app(engine, model_name, log_interval_s=log_interval_s)
    uvicorn.run(app, host=host, port=port, log_level="info")
