"""One shape's decode through each path the engine has, on one copy of the weights.

The paths: eager (``enforce_eager=True``); the default (CUDA graphs on a GPU); ``compile=True``
(compiled regions, inside the graphs on a GPU); ``attention_backend="triton"`` (the paged
attention kernel, graphs too; skipped where Triton cannot run). Each row is labelled by what ran,
read back from the engine, and says how many CUDA kernels one decode step launches (on CUDA).
"""

from __future__ import annotations

from pathlib import Path

import torch

from minieng.config import EngineConfig
from minieng.engine.llm_engine import LLMEngine
from .checkpoints import CheckSizes, cpu_pool, release
from .speed import decode, warm
from minieng.lab.gpu_utilization import decode_ops, decoding
from minieng.measure.peaks import Peak
from minieng.measure.workloads import text_prompts
from minieng.wings.fast_paths import triton_attention

PATHS = {  # label: the EngineConfig fields that select the path
    "eager": dict(enforce_eager=True),
    "default": {},
    "compiled": dict(compile=True),
    "triton": dict(attention_backend="triton"),
}


def kernels_per_step(engine: LLMEngine, prompts: list[list[int]]) -> int | None:
    """CUDA kernels one decode step of ``prompts`` launches (a graph replay's kernels included), from
    torch.profiler's device events; None off CUDA."""
    if engine.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile  # lazy: a CUDA-only measurement

    with decoding(engine, prompts, 4), profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.step()
        torch.cuda.synchronize(engine.device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def triton_runs_here(device: torch.device) -> bool:
    """Whether the Triton attention kernel can run on ``device``: Triton installed, and a CUDA device
    or Triton's interpreter."""
    return triton_attention.TRITON_AVAILABLE and (device.type == "cuda" or triton_attention.INTERPRETED)


def decode_paths(path: Path, device: torch.device, peaks: list[Peak], sizes: CheckSizes, load_format: str) -> dict:
    """Each path's decode rows (``speed.decode``) under ``rows[label]``, with ``ran`` (what ran:
    graphs and how many, compiled, the attention), ``compile_s`` and ``kernels_per_step``; a path
    that cannot run here is ``{"skipped": why}``. ``eager_ops``: the ops of one eager batch-1
    decode step, per layer (``gpu_utilization.decode_ops``)."""
    base = dict(
        model=str(path),
        load_format=load_format,
        device=str(device),
        max_num_seqs=max(sizes.batches),
        enable_prefix_caching=False,
        strict_forward_paths=True,  # a fast path that fails must fail the check, not pass as slow steps
        **cpu_pool(device),
    )
    out: dict = {"rows": {}}
    loaded = None
    one = None
    for label, extra in PATHS.items():
        if label == "triton" and not triton_runs_here(device):
            out["rows"][label] = {"skipped": "triton cannot run here"}
            continue
        engine = LLMEngine(EngineConfig(**base, **extra), loaded=loaded)
        loaded = engine.loaded
        one = one or text_prompts(engine.tokenizer, 16, 1)
        warm(engine)
        graphs = engine.runner.fast.graphs
        out["rows"][label] = {
            "ran": ", ".join(
                [f"graphs ({graphs.num_graphs})" if graphs else "eager"]
                + (["compiled"] if engine.runner.fast.regions is not None else [])
                + (["triton attention"] if engine.config.attention_backend == "triton" else ["gather + SDPA"])
            ),
            "compile_s": engine.runner.fast.compile_s,
            "kernels_per_step": kernels_per_step(engine, one),
            "decode": decode(engine, peaks, sizes),
        }
        if label == "eager":
            out["eager_ops"] = decode_ops(engine, one)
        del engine, graphs
        release()
    return out
