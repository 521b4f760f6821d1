"""The two phases' speed on one shape: TTFT and prefill MFU, TPOT and MBU with CUDA graphs and eager,
and NVML's readings during a batch-1 decode.

Prefill rows also time the first request of each new length: a GPU plans attention for every new
shape, and ``new_shape_cost_ms`` is what that first request pays over a warm one. A decode row
says which of its steps replayed a CUDA graph (``decode_mode``): a batch too wide for any
captured bucket runs eagerly even on an engine with graphs.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from minieng.config import EngineConfig, SamplingParams
from minieng.engine.llm_engine import LLMEngine
from .checkpoints import GREEDY, CheckSizes, cpu_pool, release
from minieng.lab.probes import minieng_decode, minieng_prefill
from minieng.measure.nvml import TelemetrySampler, summarize
from minieng.measure.peaks import Peak
from minieng.measure.roofline import phase_utilization
from minieng.measure.workloads import text_prompts


def prefill(engine: LLMEngine, peaks: list[Peak], sizes: CheckSizes) -> list[dict]:
    """Per prompt length shorter than the engine's ``max_model_len``: the median TTFT of ``repeats``
    warm requests sent alone (``ttft_ms``), the first request's (``first_request_ttft_ms``), their
    difference (``new_shape_cost_ms``) and the steps' utilization (``roofline.phase_utilization``)."""
    rows = []
    for n in sizes.prefill_lens:
        if n >= engine.max_model_len:
            continue
        prompts = text_prompts(engine.tokenizer, n, sizes.repeats + 1)
        first_ttft, _ = minieng_prefill(engine, prompts[:1])  # the first request of this length
        ttft, steps = minieng_prefill(engine, prompts[1:])
        util = phase_utilization(engine.model_config, engine.dtype.itemsize, steps, peaks)
        rows.append(
            {
                "prompt_tokens": n,
                "ttft_ms": 1e3 * ttft,
                "first_request_ttft_ms": 1e3 * first_ttft,
                "new_shape_cost_ms": 1e3 * (first_ttft - ttft),
                "utilization": util,
            }
        )
    return rows


def decode(engine: LLMEngine, peaks: list[Peak], sizes: CheckSizes) -> list[dict]:
    """Per batch size up to the engine's ``max_num_seqs``: the median TPOT of the batch decoding
    together (``decode_context`` prompt tokens each, ``big_batch_context`` past batch 64), how many
    of its decode steps replayed a graph (``graphed_steps`` of ``steps``) and their utilization."""
    rows = []
    for b in sizes.batches:
        if b > engine.config.max_num_seqs:
            continue
        context = sizes.decode_context if b <= 64 else sizes.big_batch_context
        prompts = text_prompts(engine.tokenizer, context, b)
        tpot, steps = minieng_decode(engine, prompts, sizes.output_tokens)
        util = phase_utilization(engine.model_config, engine.dtype.itemsize, steps, peaks)
        rows.append(
            {
                "batch_size": b,
                "context_tokens": context,
                "tpot_ms": 1e3 * tpot,
                "graphed_steps": sum(s.forward_path == "cuda_graph" for s in steps),
                "steps": len(steps),
                "utilization": util,
            }
        )
    return rows


def decode_mode(row: dict) -> str:
    """How a decode row's steps ran: "graphs" when every step replayed a CUDA graph, "eager" when
    none did (no bucket fits that batch and context), else "graphs i/n" steps."""
    graphed, steps = row["graphed_steps"], row["steps"]
    return "graphs" if graphed == steps > 0 else "eager" if graphed == 0 else f"graphs {graphed}/{steps}"


def warm(engine: LLMEngine) -> None:
    """Two 16-token prompts for 4 tokens, untimed: allocation, kernel selection, first shapes."""
    engine.generate(text_prompts(engine.tokenizer, 16, 2), SamplingParams(max_tokens=4, **GREEDY))


def shape_speed(
    name: str, path: Path, device: torch.device, peaks: list[Peak], sizes: CheckSizes, load_format: str
) -> dict:
    """Prefill and decode of one shape, with CUDA graphs (``decode_graphs``) and eager
    (``decode_eager``), on one loaded copy of the weights; beside them the engine's start-up
    (``load_s``, ``graph_capture_s``, ``num_graphs``), its pool, and ``tpot_floor_b1_ms``: the
    weights' bytes over the measured bandwidth (``peaks[0]``), batch 1's floor."""
    base = dict(
        model=str(path),
        load_format=load_format,
        device=str(device),
        max_num_seqs=max(sizes.batches),
        max_num_batched_tokens=max(sizes.prefill_lens),
        enable_prefix_caching=False,
        strict_forward_paths=True,  # a fast path that fails must fail the check, not pass as slow steps
        **cpu_pool(device),
    )
    start = time.perf_counter()
    engine = LLMEngine(**base)
    out = {
        "shape": name,
        "params": engine.model_config.num_params,
        "load_s": time.perf_counter() - start,
        "weight_bytes": engine.memory_plan.weight_bytes,
        "kv_pool_tokens": engine.memory_plan.kv_tokens,
        "max_model_len": engine.max_model_len,
    }
    graphs = engine.runner.fast.graphs
    out["graph_capture_s"] = graphs.capture_s if graphs else None
    out["num_graphs"] = graphs.num_graphs if graphs else 0
    warm(engine)
    out["prefill"] = prefill(engine, peaks, sizes)
    out["decode_graphs"] = decode(engine, peaks, sizes)
    loaded = engine.loaded
    del engine, graphs
    release()
    eager = LLMEngine(EngineConfig(**base, enforce_eager=True), loaded=loaded)
    warm(eager)
    out["decode_eager"] = decode(eager, peaks, sizes)
    bandwidth = peaks[0].bandwidth_gbps * 1e9
    out["tpot_floor_b1_ms"] = 1e3 * out["weight_bytes"] / bandwidth  # weights / measured bandwidth
    del eager, loaded
    release()
    return out


def nvml_during_decode(
    path: Path, device: torch.device, peaks: list[Peak], sizes: CheckSizes, load_format: str, nvml=None
) -> list[dict]:
    """NVML's util.gpu and GPM metrics (SM occupancy, DRAM bandwidth) over a batch-1 decode of
    about ``nvml_seconds`` (32 tokens at least), eager and with graphs, beside the decode steps'
    MFU and MBU and their median TPOT. Meant for a CUDA device; elsewhere the sampler records why
    it has nothing (``nvml``: the NVML module, tests pass a fake; default ``pynvml``)."""
    rows = []
    for eager in (True, False):
        engine = LLMEngine(
            model=str(path),
            load_format=load_format,
            device=str(device),
            max_num_seqs=8,
            enforce_eager=eager,
            **cpu_pool(device),
        )
        prompt = text_prompts(engine.tokenizer, 64, 1)
        engine.generate(prompt, SamplingParams(max_tokens=8, **GREEDY))
        step = statistics.median(s.duration_s for s in engine.step_records[-4:])
        tokens = min(engine.max_model_len - 80, max(32, int(sizes.nvml_seconds / step)))
        first = len(engine.step_records)
        with TelemetrySampler(engine.device, nvml=nvml) as sampler:
            engine.generate(prompt, SamplingParams(max_tokens=tokens, **GREEDY))
        steps = [s for s in engine.step_records[first:] if s.num_prefill_tokens == 0]
        util = phase_utilization(engine.model_config, engine.dtype.itemsize, steps, peaks)
        rows.append(
            {
                "enforce_eager": eager,
                "decode_steps": len(steps),
                "nvml": summarize(sampler.samples),
                "mfu_percent": util["measured"]["mfu_percent"],
                "mbu_percent": util["measured"]["mbu_percent"],
                "tpot_ms": 1e3 * statistics.median(s.duration_s for s in steps),
            }
        )
        del engine
        release()
    return rows
