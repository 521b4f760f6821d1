"""An OpenAI-compatible HTTP server over one engine: ``python -m minieng serve``.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions`` (the chat template applied), streamed as server-sent events when
``stream`` is true. Built on FastAPI and uvicorn; request bodies are checked by the models of
``protocol.py``, after a size cap (``max_body_bytes``: 413 beyond it, before any parsing).

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
beside a watcher of the connection (``_cancel_on_disconnect``, vLLM's ``with_cancellation``),
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
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from starlette.exceptions import HTTPException

from minieng.config import DEFAULT_MODEL_NAME, SamplingParams
from minieng.engine.chat_template import check_text
from minieng.engine.llm_engine import LLMEngine
from minieng.engine.outputs import RequestOutput
from minieng.measure.logged_throughput import DEFAULT_LOG_INTERVAL_S
from minieng.serve.async_engine import AsyncEngine, check_log_interval
from minieng.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    NotHonoured,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    error_body,
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


class _Refused(Exception):
    """A request refused with an OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class BodyLimit:
    """ASGI middleware: reads a request's body whole, and answers 413 (OpenAI's error body) to one
    over ``max_bytes`` before anything parses or tokenizes it; the app then reads the body from
    memory.

    A body is over the cap by its ``Content-Length``, or (chunked) once the bytes received pass
    it; from then on its bytes are read and dropped, not kept, so that the client, which sends
    the whole body before it reads, gets the 413 rather than a reset connection.
    """

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        too_large = length.isdigit() and int(length) > self.max_bytes
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before it finished sending
            more = message.get("more_body", False)
            if not too_large:
                body += message.get("body", b"")
                too_large = len(body) > self.max_bytes
        if too_large:
            error = error_body(
                f"the request body is larger than this server's cap of {self.max_bytes} bytes: shorten the prompt", 413
            )
            return await JSONResponse(error, status_code=413)(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


async def _cancel_on_disconnect(request: Request, handler: Awaitable):
    """Run ``handler`` until it returns or the client disconnects, whichever comes first (vLLM's
    ``with_cancellation``). A disconnect cancels the handler, whose ``CancelledError`` aborts its
    request; the answer is then an empty 499 ("client closed request"), which nobody reads.
    A streamed response returns at once, and its stream watches the connection itself."""
    work = asyncio.ensure_future(handler)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            await asyncio.wait({work})  # let its clean-up (the abort) run
    if work.cancelled():
        return Response(status_code=499)
    return work.result()


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the ASGI server reports it through ``receive``)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


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
):
    """The FastAPI application serving ``engine`` under ``model_name`` (default ``served_model_name``).

    The engine loop starts and stops with the application (its lifespan). ``app.state.engine_loop``
    is the ``AsyncEngine``. Request bodies over ``max_body_bytes`` (default
    ``default_max_body_bytes``) are refused with 413. Every ``log_interval_s`` seconds the loop logs
    vLLM's stats line (``AsyncEngine``; None or 0: none). Raises ``ValueError`` for a negative
    ``log_interval_s``.
    """
    check_log_interval(log_interval_s)
    model_name = model_name or served_model_name(engine)

    @asynccontextmanager
    async def lifespan(app):
        app.state.engine_loop = AsyncEngine(engine, on_finished, log_interval_s)
        app.state.engine_loop.start()
        yield
        await app.state.engine_loop.stop()

    app = FastAPI(title="minieng", lifespan=lifespan)
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
        return JSONResponse(error_body(exc.message, exc.status, exc.param), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        return JSONResponse(error_body(str(exc.detail), exc.status_code), status_code=exc.status_code)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return models_list(model_name, engine.max_model_len)

    def refuse_early(body) -> None:
        """What needs no tokenizer: the model's name, and fields minieng cannot honour."""
        if body.model != model_name:
            raise _Refused(404, f"the model {body.model!r} does not exist: this server runs {model_name!r}", "model")
        try:
            body.check_honoured()
        except NotHonoured as e:
            raise _Refused(400, str(e), e.param) from None

    def prepare(body, chat: bool) -> tuple[list[int], SamplingParams]:
        """A request's prompt ids (the chat template applied) and its ``SamplingParams``, or
        ``_Refused``. Tokenizes: run in a worker thread, never on the event loop."""
        if chat:
            messages, param = body.conversation(), "messages"
            try:
                for i, m in enumerate(messages):
                    check_text(m["content"], f"message {i}'s content")
                prompt = engine.chat_prompt(messages)
            except (ValueError, TemplateError) as e:  # no template, an empty message, an order it refuses
                raise _Refused(400, f"messages: {e}", "messages") from None
            default_max_tokens = None  # OpenAI's chat answers may run to the end of the context
            if body.max_completion_tokens is not None:
                body.max_tokens = body.max_completion_tokens
        else:
            prompt, param, default_max_tokens = body.prompt, "prompt", 16
        try:
            ids = engine.check_request(prompt)
        except ValueError as e:  # empty, too long, not Unicode, ids outside the vocabulary
            raise _Refused(400, f"{param}: {e}", param) from None
        room = engine.max_model_len - len(ids)
        try:
            params = body.sampling_params(default_max_tokens or room)
        except ValueError as e:
            raise _Refused(400, str(e)) from None
        if params.max_tokens > room:
            raise _Refused(
                400,
                f"the prompt has {len(ids)} tokens and max_tokens={params.max_tokens}: together "
                f"they exceed the context of {engine.max_model_len} tokens; lower max_tokens",
                "max_tokens",
            )
        return ids, params

    async def handle(request: Request, body, chat: bool):
        arrival_s = time.perf_counter()
        refuse_early(body)
        ids, params = await asyncio.to_thread(prepare, body, chat)
        return await respond(request, ids, params, chat, body.include_usage, body.stream, arrival_s)

    async def respond(
        request: Request,
        ids: list[int],
        params: SamplingParams,
        chat: bool,
        include_usage: bool,
        stream: bool,
        arrival_s: float,
    ):
        loop: AsyncEngine = request.app.state.engine_loop
        request_id, queue = loop.submit(ids, params, arrival_s, "chatcmpl" if chat else "cmpl")
        created = int(time.time())
        if stream:
            return StreamingResponse(
                _sse(loop, request_id, queue, created, chat, include_usage, len(ids)), media_type="text/event-stream"
            )
        text, out = [], None
        try:
            while out is None or not out.finished:
                out = await queue.get()
                text.append(out.delta)
        except asyncio.CancelledError:  # the client left (_cancel_on_disconnect), or the server stops
            loop.abort(request_id)
            raise
        totals = usage(len(ids), len(out.token_ids), out.num_cached_tokens)
        make = chat_response if chat else completion_response
        return make(request_id, model_name, created, "".join(text), out.finish_reason, totals)

    async def _sse(
        loop: AsyncEngine,
        request_id: str,
        queue: asyncio.Queue,
        created: int,
        chat: bool,
        include_usage: bool,
        prompt_tokens: int,
    ) -> AsyncIterator[str]:
        out = None
        try:
            if chat:  # OpenAI's first chat chunk carries the role and no text
                yield _event(
                    chat_chunk(
                        request_id, model_name, created, {"role": "assistant", "content": ""}, None, include_usage
                    )
                )
            while out is None or not out.finished:
                out = await queue.get()
                if not out.delta and not out.finished:
                    continue  # tokens whose text is not yet safe to show (a partial character, a stop prefix)
                reason = out.finish_reason if out.finished else None
                if chat:
                    delta = {"content": out.delta} if out.delta else {}
                    yield _event(chat_chunk(request_id, model_name, created, delta, reason, include_usage))
                else:
                    yield _event(completion_chunk(request_id, model_name, created, out.delta, reason, include_usage))
            if include_usage:
                totals = usage(prompt_tokens, len(out.token_ids), out.num_cached_tokens)
                yield _event(usage_chunk(request_id, model_name, created, chat, totals))
            yield "data: [DONE]\n\n"
        finally:
            if out is None or not out.finished:  # the client left (the response was cancelled)
                loop.abort(request_id)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await _cancel_on_disconnect(request, handle(request, body, chat=False))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await _cancel_on_disconnect(request, handle(request, body, chat=True))

    return app


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
