"""A load generator for any OpenAI-compatible server (minieng's, vLLM's, SGLang's):
``python -m minieng loadgen --base-url http://127.0.0.1:8000/v1``.

Requests are sent at their arrival times (a Poisson process, or a trace replayed), each as a
streamed completion with ``stream_options.include_usage``, and timed on the client from the
chunks it receives, as vLLM's ``bench serve`` does (``stream_figures``):

- A chunk carries a token when it has output of any kind: text, a chat delta's ``content``,
  ``reasoning_content``/``reasoning`` (reasoning models stream those first) or ``tool_calls``,
  log-probabilities of a token, or a ``usage`` whose ``completion_tokens`` grew. An empty first
  chunk (the chat API's role-only chunk) carries none; vLLM's chat client counts it, we do not.
- TTFT: send -> the first chunk that carries a token. A request whose only token ended it (a
  stop on the first token: no text) has its finishing chunk as its first token.
- ITL: the gaps between successive chunks that carry tokens. A server sends one chunk per engine
  step with new text, so a chunk may carry several tokens (speculative decoding, or text held
  back until a character is whole): ITL is per chunk, TPOT per token.
- E2EL: send -> the finishing chunk (the one with ``finish_reason``).
- TPOT: (E2EL - TTFT) / (output tokens - 1).

Token counts come from the server's ``usage`` block, never from re-tokenizing the text (a client
tokenizer can disagree with the server's); so do the prompt tokens its prefix cache served
(``prompt_tokens_details.cached_tokens``, OpenAI's field; vLLM leaves it out when it is 0, so a
request without it counts 0 once any request of the run reported it, and a run where none did has
no hit rate). A server that sends no usage fails the request with
that reason; so does an ``error`` object anywhere in the stream (vLLM sends one, then
``[DONE]``, when a request fails mid-stream), even after a ``finish_reason``, with its message.
Summaries and goodput are ``metrics.serving_metrics`` (docs/architecture.md, Figures).
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from minieng.measure.metrics import SLO, RequestMetrics, ServingMetrics, serving_metrics
from minieng.measure.workloads import RequestSpec, workload_prompts


# Prompts cut from the text at random places share no prefix beyond a chat template's few tokens: a
# run whose prompt tokens the server's cache served above this share sent them before (same seed).
REUSED_PROMPTS_HIT_RATE = 0.5


@dataclass(frozen=True)
class LoadRequest:
    """One request to send: at ``arrival_s`` seconds after the start, ``prompt`` (text, or token ids
    for ``/v1/completions``), asking for ``max_tokens`` tokens."""

    arrival_s: float
    prompt: str | list[int]
    max_tokens: int


@dataclass
class LoadResult:
    """A run: per-request figures in send order (``RequestMetrics``; failed requests have
    ``finish_reason`` "error" and are not ``ok``), the run's wall time and the errors seen."""

    requests: list[RequestMetrics]
    duration_s: float
    errors: list[str] = field(default_factory=list)

    def summary(self, slo: SLO | None = None) -> ServingMetrics:
        """vLLM's report of the run (``serving_metrics``), with goodput under ``slo``."""
        return serving_metrics(self.requests, self.duration_s, slo)


def load_requests(specs: list[RequestSpec], tokenizer, as_text: bool = True, seed: int = 0) -> list[LoadRequest]:
    """Prompts of real text of each spec's length (``workloads.workload_prompts``, cut where ``seed``
    draws), as text (decoded with ``tokenizer``: the server's count may differ by a token or two, and
    its usage is what is reported) or as token ids (exact, for a server with the same tokenizer)."""
    prompts = workload_prompts(tokenizer, specs, seed=seed)
    return [
        LoadRequest(s.arrival_s, tokenizer.decode(p) if as_text else p, s.output_tokens) for s, p in zip(specs, prompts)
    ]


def stream_metrics(
    send_s: float,
    token_chunk_s: list[float],
    last_chunk_s: float | None,
    prompt_tokens: int,
    output_tokens: int,
    finish_reason: str | None,
    cached_tokens: int | None = None,
) -> RequestMetrics:
    """A request's figures from a client's view of its stream (the module docstring's definitions).

    Args:
        send_s: when the request was sent (``time.perf_counter()``).
        token_chunk_s: arrival times of the chunks that carried tokens, in order.
        last_chunk_s: arrival time of the finishing chunk (None if none came: the last token's).
        prompt_tokens, output_tokens: from the server's usage.
        cached_tokens: the usage's ``prompt_tokens_details.cached_tokens`` (None: not reported).
    """
    ttft = token_chunk_s[0] - send_s if token_chunk_s else None
    e2el = (last_chunk_s if last_chunk_s is not None else token_chunk_s[-1]) - send_s if token_chunk_s else None
    tpot = (e2el - ttft) / (output_tokens - 1) if ttft is not None and output_tokens >= 2 else None
    itl = [b - a for a, b in zip(token_chunk_s, token_chunk_s[1:])]
    return RequestMetrics(
        ttft,
        tpot,
        e2el,
        itl,
        None,
        prompt_tokens,
        output_tokens,
        finish_reason,
        finish_reason in ("stop", "length"),
        send_s,
        cached_tokens=cached_tokens,
    )


# Fields of a chat delta that carry generated tokens: text, a reasoning model's thinking (vLLM's
# older and newer names), and tool calls.
_DELTA_TOKEN_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")


def _carries_token(choice: dict, chat: bool) -> bool:
    """Whether one streamed choice carries output: text of any kind, or a token's log-probabilities."""
    if chat:
        delta = choice.get("delta") or {}
        if any(delta.get(name) for name in _DELTA_TOKEN_FIELDS):
            return True
    elif choice.get("text"):
        return True
    logprobs = choice.get("logprobs") or {}
    return bool(logprobs.get("content") or logprobs.get("tokens")) if isinstance(logprobs, dict) else False


def _stream_error(chunk: dict) -> str | None:
    """The message of an error object in a chunk (OpenAI's ``{"error": {...}}``, or vLLM's older
    ``{"object": "error", "message": ...}``), or None."""
    error = chunk.get("error")
    if error:
        return str(error.get("message") or error) if isinstance(error, dict) else str(error)
    if chunk.get("object") == "error":
        return str(chunk.get("message") or chunk)
    return None


def stream_figures(send_s: float, chunks: list[tuple[float, dict]], chat: bool) -> RequestMetrics:
    """A request's figures from the chunks of its stream, each with its arrival time.

    Args:
        send_s: when the request was sent (``time.perf_counter()``).
        chunks: ``(arrival time, chunk)`` for every ``data:`` object before ``[DONE]``, in order.
        chat: chunks of ``/v1/chat/completions`` (deltas) rather than ``/v1/completions`` (text).
    Raises:
        RuntimeError: an error object in any chunk (its message), or no usage block in the stream.
    """
    token_s: list[float] = []
    finish_s, finish, usage, tokens_seen = None, None, None, 0
    for now, chunk in chunks:
        error = _stream_error(chunk)
        if error is not None:
            raise RuntimeError(f"the server reported an error in the stream: {error}")
        choices = chunk.get("choices") or []
        if chunk.get("usage"):
            usage = chunk["usage"]
        # A usage on a chunk with choices (vLLM's continuous_usage_stats) counts tokens as they come.
        grew = bool(choices and usage and usage.get("completion_tokens", 0) > tokens_seen)
        if grew:
            tokens_seen = usage["completion_tokens"]
        if grew or any(_carries_token(c, chat) for c in choices):
            token_s.append(now)
        for choice in choices:
            if choice.get("finish_reason") and finish is None:
                finish, finish_s = choice["finish_reason"], now
    if usage is None:
        raise RuntimeError("the server sent no usage block: it must support stream_options.include_usage")
    output_tokens = usage["completion_tokens"]
    if not token_s and output_tokens >= 1 and finish_s is not None:
        token_s = [finish_s]  # its only token ended it (a stop): no text came, but the token did
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return stream_metrics(send_s, token_s, finish_s, usage["prompt_tokens"], output_tokens, finish, cached)


async def _one(client, url: str, body: dict, chat: bool) -> RequestMetrics:
    send = time.perf_counter()
    chunks: list[tuple[float, dict]] = []
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")[:300]
            raise RuntimeError(f"HTTP {response.status_code}: {detail}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunks.append((time.perf_counter(), json.loads(data)))
    return stream_figures(send, chunks, chat)


async def run_load_async(
    base_url: str,
    model: str,
    requests: list[LoadRequest],
    chat: bool = False,
    ignore_eos: bool = True,
    temperature: float = 0.0,
    timeout_s: float = 600.0,
    progress: bool = True,
) -> LoadResult:
    """Send ``requests`` at their arrival times to ``base_url`` (``http://host:port/v1``) and time them.

    ``ignore_eos`` (vLLM's extension) makes each answer exactly ``max_tokens`` long, as benchmarks
    of fixed sizes need; a server that ignores the field answers shorter. Raises ``ValueError``
    for an empty request list.
    """
    import httpx  # lazy: the serve extra's; the rest of loadgen runs without it

    if not requests:
        raise ValueError("no requests to send")
    url = f"{base_url.rstrip('/')}/{'chat/completions' if chat else 'completions'}"
    bar = tqdm(total=len(requests), desc="loadgen", unit="req", disable=not progress)
    results: list[RequestMetrics | None] = [None] * len(requests)
    errors: list[str] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)

    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        start = time.perf_counter()

        async def send(i: int, req: LoadRequest) -> None:
            await asyncio.sleep(max(0.0, start + req.arrival_s - time.perf_counter()))
            body = {
                "model": model,
                "max_tokens": req.max_tokens,
                "temperature": temperature,
                "stream": True,
                "stream_options": {"include_usage": True},
                "ignore_eos": ignore_eos,
            }
            if chat:
                body["messages"] = [{"role": "user", "content": req.prompt}]
            else:
                body["prompt"] = req.prompt
            sent = time.perf_counter()
            try:
                results[i] = await _one(client, url, body, chat)
            except Exception as e:  # a failed request is a result, not a crash of the run
                errors.append(f"request {i}: {type(e).__name__}: {e}")
                results[i] = RequestMetrics(None, None, None, [], None, 0, 0, "error", False, sent)
            bar.update(1)

        await asyncio.gather(*(send(i, r) for i, r in enumerate(requests)))
        duration = time.perf_counter() - start
    bar.close()
    return LoadResult(results, duration, errors)


def run_load(base_url: str, model: str, requests: list[LoadRequest], **kwargs) -> LoadResult:
    """``run_load_async`` from synchronous code (a script, the CLI; in a notebook, which already runs
    an event loop, it runs in a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_load_async(base_url, model, requests, **kwargs))
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run_load_async(base_url, model, requests, **kwargs)).result()


def served_models(base_url: str) -> list[str]:
    """The model ids of ``GET {base_url}/models``. Raises ``ValueError`` when the server cannot be reached."""
    import httpx  # lazy: the serve extra's

    try:
        response = httpx.get(f"{base_url.rstrip('/')}/models", timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise ValueError(
            f"cannot list the models of {base_url}: {e}. Is the server running, and does the URL end with /v1?"
        ) from None
    return [m["id"] for m in response.json().get("data", [])]
