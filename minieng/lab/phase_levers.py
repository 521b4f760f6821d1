"""Two prefill experiments beside decode's lesson: what a bigger batch (notebook 03) and more FLOP/s
(notebook 11) buy each phase.

- ``prefill_batch_sweep``: 1, 2, 4, 8 prompts of one length prefilled together in one step.
  Past the knee one prompt already keeps the device computing, so more prompts add work in
  proportion and prefill tok/s stays flat; below it, or where one prompt leaves the device idle (a
  small model on a large GPU), the batch fills idle FLOP/s and tok/s grows.
- ``thread_knob``: on a CPU, torch's intra-op threads multiply the FLOP/s a matrix
  product reaches far more than the bytes a copy moves; TTFT (compute-bound) and TPOT
  (memory-bound) are timed at each thread count, with both ceilings beside them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.lab.probes import minieng_decode, minieng_prefill, warm_up
from minieng.measure.peaks import measure_copy, measure_matmul
from minieng.measure.roofline import phase_utilization
from minieng.measure.workloads import text_prompts


def prefill_batch_sweep(
    engine: LLMEngine,
    prompt_tokens: int,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    peaks: Sequence = (),
    warmup: bool = False,
) -> list[dict]:
    """Prefill tok/s of ``b`` distinct prompts of ``prompt_tokens`` tokens sent together, for each
    ``b`` of ``batch_sizes``, each batch prefilled in one step.

    While it runs the step's token budget is raised to the largest batch's tokens (no prompt is
    chunked) and the prefix cache is switched off and emptied (a hit would shorten a prefill).
    ``warmup``: run each batch once, untimed, before timing it (on a GPU every new shape plans its
    attention; a CPU needs none once the engine has run a prompt of that length).

    Returns:
        one dict per batch: ``batch_size``, ``prompt_tokens``, ``step_s`` (the prefill step's
        duration, s), ``tok_s`` (batch x prompt tokens / ``step_s``) and, with ``peaks``
        (``peaks.Peak``s), ``utilization``: ``roofline.phase_utilization`` of the step.
    Raises:
        ValueError: no batch size, a batch above the engine's ``max_num_seqs``, or more prompt
            tokens than the KV pool holds at once.
        RuntimeError: a batch that did not prefill in one step.
    """
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"batch_sizes={list(batch_sizes)}: one or more batch sizes, each >= 1")
    largest = max(batch_sizes)
    if largest > engine.config.max_num_seqs:
        raise ValueError(f"a batch of {largest} prompts exceeds max_num_seqs={engine.config.max_num_seqs}")
    block = engine.config.block_size
    needed = largest * math.ceil((prompt_tokens + 1) / block)
    if needed > engine.block_manager.num_blocks:
        raise ValueError(
            f"{largest} prompts of {prompt_tokens} tokens need {needed} KV blocks, the pool has "
            f"{engine.block_manager.num_blocks}: shorten the prompts or give the engine a larger pool"
        )
    prompts = text_prompts(engine.tokenizer, prompt_tokens, largest)
    params = SamplingParams.fixed_length(1)
    budget = max(engine.config.max_num_batched_tokens, largest * prompt_tokens)
    rows = []
    with engine.block_manager.caching(False), engine.reconfigured(max_num_batched_tokens=budget):
        for b in batch_sizes:
            if warmup:
                engine.generate(prompts[:b], params)
            first = len(engine.step_records)
            engine.generate(prompts[:b], params)
            steps = [s for s in engine.step_records[first:] if s.num_prefill_tokens > 0]
            if len(steps) != 1:
                raise RuntimeError(f"{b} prompts of {prompt_tokens} tokens took {len(steps)} prefill steps, not one")
            row = {
                "batch_size": b,
                "prompt_tokens": prompt_tokens,
                "step_s": steps[0].duration_s,
                "tok_s": b * prompt_tokens / steps[0].duration_s,
            }
            if peaks:
                row["utilization"] = phase_utilization(
                    engine.model_config, engine.dtype.itemsize, steps, peaks, engine.matmul_bytes
                )
            rows.append(row)
    return rows


COPY_BYTES = 64 * 1024**2  # each of the copy's two buffers: past a CPU's last-level cache, seconds to fill
MATMUL_N = 1024


def thread_knob(
    engine: LLMEngine,
    prompt_tokens: int,
    decode_steps: int,
    threads: Sequence[int] | None = None,
    decode_prompt_tokens: int = 64,
    repeats: int = 2,
    matmul_n: int = MATMUL_N,
    copy_bytes: int = COPY_BYTES,
) -> list[dict]:
    """The same CPU engine at each torch thread count (``torch.set_num_threads``): the matmul
    ceiling, the copy bandwidth, TTFT and TPOT.

    At each count, after a short warm-up generate (the thread pool resizes): the best FLOP/s of an
    ``matmul_n``-cube product and the best bytes/s (read + written) of a ``copy_bytes`` copy
    (``peaks.measure_matmul``, ``peaks.measure_copy``, 3 runs each), the median TTFT of
    ``repeats`` distinct ``prompt_tokens``-token prompts sent alone (prefix cache off) and the TPOT
    of one request decoding ``decode_steps`` tokens after a ``decode_prompt_tokens``-token prompt.
    The thread count in force before the call is restored afterwards, even when it raises.

    Args:
        threads: the counts to run at, in that order (default: all of them now, then 1).
    Returns:
        one dict per count: ``threads``, ``matmul_flop_s``, ``copy_bytes_s``, ``ttft_s``, ``tpot_s``.
    Raises:
        ValueError: an engine on a GPU (its FLOP/s do not move with the host's threads), a count
            below 1, or fewer than 2 decode steps (TPOT needs 2 tokens).
    """
    if engine.device.type != "cpu":
        raise ValueError(f"thread_knob turns the CPU's threads; this engine runs on {engine.device}")
    if decode_steps < 2:
        raise ValueError(f"decode_steps={decode_steps}: TPOT needs 2 or more")
    before = torch.get_num_threads()
    threads = [before, 1] if threads is None else list(threads)
    if not threads or min(threads) < 1:
        raise ValueError(f"threads={threads}: one or more counts, each >= 1")
    tok = engine.tokenizer
    prefill_prompts = text_prompts(tok, prompt_tokens, repeats)
    decode_prompt = text_prompts(tok, decode_prompt_tokens, 1)
    rows = []
    try:
        with engine.block_manager.caching(False):
            for count in threads:
                torch.set_num_threads(count)
                warm_up(engine, output_tokens=2)
                matmul = measure_matmul(engine.device, engine.dtype, n=matmul_n, repeats=3)
                copy = measure_copy(engine.device, nbytes=copy_bytes, repeats=3)
                ttft_s = minieng_prefill(engine, prefill_prompts)[0]
                tpot_s = minieng_decode(engine, decode_prompt, decode_steps + 1)[0]
                rows.append(
                    {
                        "threads": count,
                        "matmul_flop_s": matmul.max,
                        "copy_bytes_s": copy.max,
                        "ttft_s": ttft_s,
                        "tpot_s": tpot_s,
                    }
                )
    finally:
        torch.set_num_threads(before)
    return rows
