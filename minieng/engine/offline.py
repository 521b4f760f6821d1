"""The offline entry points: run prompts to completion (``generate``) or stream one (``stream``).

vLLM keeps these in its ``LLM`` class, a thin driver over the engine; here ``LLMEngine.generate``
and ``LLMEngine.stream`` call these functions, so the engine module keeps to requests and steps.
Both drive ``engine.step()`` and, under static batching, sleep while a partial batch fills
(``LLMEngine.idle_wait_s``) rather than stepping for nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq

from tqdm.auto import tqdm

from minieng.config import SamplingParams
from minieng.core.outputs import Prompt
from minieng.core.outputs import RequestOutput


def generate(
    engine, prompts: Prompt | Seq[Prompt], params: SamplingParams | Seq[SamplingParams] | None, use_tqdm: bool
) -> list[RequestOutput]:
    """``LLMEngine.generate``: check every prompt, queue them all, step until all finish."""
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    if params is None or isinstance(params, SamplingParams):
        params = [params or SamplingParams()] * len(prompts)
    if len(params) != len(prompts):
        raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
    checked = []
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        try:
            checked.append(engine.check_request(prompt, sp))
        except ValueError as e:
            raise ValueError(f"prompt {i}: {e} (nothing was queued)") from None
    ids = [engine.add_request(tokens, sp) for tokens, sp in zip(checked, params)]
    pending = set(ids)
    with tqdm(total=len(ids), desc="generate", unit="req", disable=not use_tqdm) as progress:
        while pending:
            wait_until_runnable(engine, pending)
            for out in engine.step():
                if out.finished and out.request_id in pending:
                    pending.discard(out.request_id)
                    progress.update(1)
    return [engine.output(i) for i in ids]


def stream_deltas(engine, request_id: str) -> Iterator[str]:
    """``LLMEngine.stream``'s iterator: step until ``request_id`` finishes, yielding its text deltas."""
    while not engine.requests[request_id].seq.is_finished:
        wait_until_runnable(engine, {request_id})
        for out in engine.step():
            if out.request_id == request_id and out.delta:
                yield out.delta


def wait_until_runnable(engine, request_ids: set[str]) -> None:
    """Sleep while a static batch fills (``idle_wait_s``), instead of stepping for nothing.

    Raises:
        ValueError: the batch can never fill (an infinite ``batch_timeout_s``, and nothing
            else can arrive while a caller waits here); ``request_ids`` are aborted and
            released first, so the engine is left without them.
    """
    wait_s = engine.idle_wait_s()
    if math.isinf(wait_s):
        num_waiting = len(engine.scheduler.waiting)
        for request_id in request_ids:
            engine.abort_request(request_id)
            engine.release_request(request_id)
        raise ValueError(
            f"static batching with batch_timeout_s=inf starts a batch only when "
            f"max_num_seqs={engine.config.max_num_seqs} requests wait, and only {num_waiting} "
            "do: queue more prompts, or give a finite batch_timeout_s (the requests were aborted)"
        )
    if wait_s > 0:
        time.sleep(wait_s)
