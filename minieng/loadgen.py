"""A load generator for any OpenAI-compatible server (minieng's, vLLM's, SGLang's):
``python -m minieng loadgen --base-url http://127.0.0.1:8000/v1``.

Requests are sent at their arrival times (a Poisson process, or a trace replayed), each as a
streamed completion with ``stream_options.include_usage``, and timed on the client from the
chunks it receives, as vLLM's ``bench serve`` does:

- TTFT: send -> the first chunk that carries output text. An empty first chunk (the chat API's
  role-only chunk) is not a token; vLLM's chat client counts it, we do not.
- ITL: the gaps between successive chunks that carry text. A server sends one chunk per engine
  step with new text, so a chunk may carry several tokens (speculative decoding, or text held
  back until a character is whole): ITL is per chunk, TPOT per token.
- E2EL: send -> the last chunk with a choice (the one with ``finish_reason``).
- TPOT: (E2EL - TTFT) / (output tokens - 1).

Token counts come from the server's ``usage`` block, never from re-tokenizing the text (a client
tokenizer can disagree with the server's). A server that sends no usage fails the request with
that reason. Summaries and goodput are ``metrics.serving_metrics`` (DESIGN.md section 4).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from .metrics import SLO, RequestMetrics, ServingMetrics, serving_metrics
from .workload import RequestSpec


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


def load_requests(specs: list[RequestSpec], tokenizer, as_text: bool = True) -> list[LoadRequest]:
    """Prompts of real text of each spec's length (``workload.workload_prompts``), as text (decoded
    with ``tokenizer``: the server's count may differ by a token or two, and its usage is what is
    reported) or as token ids (exact, for a server with the same tokenizer)."""
    from .workload import workload_prompts

    prompts = workload_prompts(tokenizer, specs)
    return [LoadRequest(s.arrival_s, tokenizer.decode(p) if as_text else p, s.output_tokens)
            for s, p in zip(specs, prompts)]


def stream_metrics(send_s: float, text_chunk_s: list[float], last_chunk_s: float | None, prompt_tokens: int,
                   output_tokens: int, finish_reason: str | None) -> RequestMetrics:
    """A request's figures from a client's view of its stream (the module docstring's definitions).

    Args:
        send_s: when the request was sent (``time.perf_counter()``).
        text_chunk_s: arrival times of the chunks that carried output text, in order.
        last_chunk_s: arrival time of the last chunk with a choice (None if none came).
        prompt_tokens, output_tokens: from the server's usage.
    """
    ttft = text_chunk_s[0] - send_s if text_chunk_s else None
    e2el = (last_chunk_s if last_chunk_s is not None else text_chunk_s[-1]) - send_s if text_chunk_s else None
    tpot = (e2el - ttft) / (output_tokens - 1) if ttft is not None and output_tokens >= 2 else None
    itl = [b - a for a, b in zip(text_chunk_s, text_chunk_s[1:])]
    return RequestMetrics(ttft, tpot, e2el, itl, None, prompt_tokens, output_tokens, finish_reason,
                          finish_reason in ("stop", "length"), send_s)


async def _one(client, url: str, body: dict, chat: bool) -> RequestMetrics:
    send = time.perf_counter()
    text_times: list[float] = []
    last = None
    finish, usage = None, None
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
            chunk = json.loads(data)
            now = time.perf_counter()
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if text:
                    text_times.append(now)
                last = now
                finish = choice.get("finish_reason") or finish
    if usage is None:
        raise RuntimeError("the server sent no usage block: it must support stream_options.include_usage")
    return stream_metrics(send, text_times, last, usage["prompt_tokens"], usage["completion_tokens"], finish)


async def run_load_async(base_url: str, model: str, requests: list[LoadRequest], chat: bool = False,
                         ignore_eos: bool = True, temperature: float = 0.0, timeout_s: float = 600.0,
                         progress: bool = True) -> LoadResult:
    """Send ``requests`` at their arrival times to ``base_url`` (``http://host:port/v1``) and time them.

    ``ignore_eos`` (vLLM's extension) makes each answer exactly ``max_tokens`` long, as benchmarks
    of fixed sizes need; a server that ignores the field answers shorter. Raises ``ValueError``
    for an empty request list.
    """
    import httpx
    from tqdm.auto import tqdm

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
            body = {"model": model, "max_tokens": req.max_tokens, "temperature": temperature, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
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
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run_load_async(base_url, model, requests, **kwargs)).result()


def served_models(base_url: str) -> list[str]:
    """The model ids of ``GET {base_url}/models``. Raises ``ValueError`` when the server cannot be reached."""
    import httpx

    try:
        response = httpx.get(f"{base_url.rstrip('/')}/models", timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise ValueError(f"cannot list the models of {base_url}: {e}. Is the server running, and does the "
                         "URL end with /v1?") from None
    return [m["id"] for m in response.json().get("data", [])]
