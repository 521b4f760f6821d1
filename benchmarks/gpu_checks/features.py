"""The engine's features on a real shape, each through the lesson's own experiment: the prefix cache
(``prefix_caching``), speculative decoding (``speculative``), quantization (``quantization``) and
tensor parallelism (``tensor_parallel``).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from minieng.engine.llm_engine import LLMEngine
from .checkpoints import CheckSizes, cpu_pool, release
from minieng.lab.prefix_caching import measure_point
from minieng.lab.quantization import QuantBenchConfig, device_schemes, run_quantization
from minieng.lab.speculative import k_sweep, machinery_overhead
from minieng.lab.tensor_parallel import format_tensor_parallel, measure_tensor_parallel
from minieng.measure.peaks import Peak
from minieng.measure.workloads import text_prompts


def prefix_cache(path: Path, device: torch.device, sizes: CheckSizes, load_format: str) -> dict:
    """TTFT against the prefix cache's hit rate at ``prefix_tokens``-token prompts: the cold
    baseline (cache off: ``cold_ttft_p50_ms``, ``cold_ttft_p99_ms``) and one point per shared
    share of the prompt (``points``: ``share``, ``hit_rate``, ``ttft_p50_ms``, ``ttft_p99_ms``)."""
    engine = LLMEngine(
        model=str(path),
        load_format=load_format,
        device=str(device),
        max_num_batched_tokens=sizes.prefix_tokens,
        max_num_seqs=8,
        **cpu_pool(device),
    )
    n, rows = sizes.prefix_tokens, []
    cold = measure_point(engine, 0, n, sizes.repeats, cache=False)
    for share in sizes.prefix_shares:
        shared = int(share * n)
        point = measure_point(engine, shared, n - shared, sizes.repeats, cache=True)
        rows.append(
            {
                "share": share,
                "hit_rate": point.hit_rate,
                "ttft_p50_ms": point.ttft_ms["p50"],
                "ttft_p99_ms": point.ttft_ms["p99"],
            }
        )
    del engine
    release()
    return {
        "prompt_tokens": n,
        "cold_ttft_p50_ms": cold.ttft_ms["p50"],
        "cold_ttft_p99_ms": cold.ttft_ms["p99"],
        "points": rows,
    }


def speculative(target: Path, draft: Path, device: torch.device, sizes: CheckSizes) -> dict:
    """Draft-model speculation, ``target`` with ``draft`` proposing: ``speculative.k_sweep``'s rows
    (c, v, the predicted and measured speedups per k) and ``machinery``, the overhead of the
    machinery apart from the draft model per k (``speculative.machinery_overhead``)."""
    # k at its largest: a GPU engine captures verification graphs for every k up to it.
    engine = LLMEngine(
        model=str(target),
        draft_model=str(draft),
        speculative_method="draft",
        num_speculative_tokens=max(sizes.spec_ks),
        device=str(device),
        max_num_seqs=8,
        **cpu_pool(device),
    )
    prompts = text_prompts(engine.tokenizer, 64, 1)
    result = k_sweep(engine, prompts, sizes.spec_ks, sizes.output_tokens)
    result["machinery"] = [machinery_overhead(engine, prompts[0], k, sizes.output_tokens) for k in sizes.spec_ks]
    del engine
    release()
    return result


def quantization(path: Path, device: torch.device, peaks: list[Peak], sizes: CheckSizes, load_format: str) -> dict:
    """Every scheme with a kernel on the device against the float engine, sharing its weights
    (``quantization.run_quantization``: per scheme TTFT and TPOT as ratios to the float engine's,
    beside the bytes and FLOP-rate predictions, and the greedy tokens' quality)."""
    engine = LLMEngine(
        model=str(path),
        load_format=load_format,
        device=str(device),
        max_num_seqs=max(sizes.quant_batches),
        max_num_batched_tokens=sizes.quant_prompt,
        max_model_len=min(sizes.quant_prompt + 512, sizes.max_position),
        kv_cache_memory_gib=2.0 if device.type == "cuda" else 0.25,
        enable_prefix_caching=False,
    )
    cfg = QuantBenchConfig(
        schemes=device_schemes(engine.device, engine.dtype),
        prompt_tokens=sizes.quant_prompt,
        batch_sizes=sizes.quant_batches,
        output_tokens=sizes.output_tokens,
        repeats=sizes.repeats,
        quality_prompts=1,
        quality_tokens=sizes.quality_tokens,
    )
    result = run_quantization(engine, cfg, peaks)
    del engine
    release()
    return result


def tensor_parallel(path: Path, device: torch.device, sizes: CheckSizes, load_format: str) -> dict:
    """Decode at tensor_parallel_size 1 and 2 (``tensor_parallel.measure_tensor_parallel``, its
    fields and ``table``): over two GPUs where the machine has them (``{"skipped": why}`` with one),
    as two processes on a CPU."""
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        return {"skipped": f"{torch.cuda.device_count()} GPU here: tensor parallelism needs two"}
    run = measure_tensor_parallel(
        2,
        batch_sizes=tuple(sizes.batches[:2]),
        prompt_len=sizes.decode_context,
        output_tokens=sizes.output_tokens,
        model=str(path),
        load_format=load_format,
        device=str(device),
    )
    return asdict(run) | {"table": format_tensor_parallel(run)}
