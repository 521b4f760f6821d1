"""FLOPs as torch counts them: FlopCounterMode over the engine's own steps, beside ``work.step_work``.

``torch.utils.flop_counter.FlopCounterMode`` sees every op a step dispatches and counts the
matrix products from their shapes, 2 m n k each. It knows nothing of the model: it is an
independent check of the analytic count. On the engine's steps:

- linear layers run as ``aten.mm``/``aten.addmm`` (CUDA, other CPUs) or oneDNN's linear on x86-64
  CPUs (``llama.linear``, whose formula ``register_flop_formulas`` adds): the count equals ``step_work``'s
  matmul + LM head FLOPs exactly (a bias inside addmm is counted by neither);
- attention runs as SDPA, counted as the dense score rectangle of the shapes the kernel was
  handed (torch's formula for the CUDA kernels; ``register_flop_formulas`` adds it for the CPU's):
  ``step_work``'s causal count plus the masked triangle of each prefill chunk
  (``work.masked_attention_flops``), plus, for decodes, the padding of the batch's keys to
  whole blocks (a kernel's layout, which the analytic count leaves out).

Norms, RoPE, softmax, SiLU and sampling are not matrix products: neither side counts them.
A step that replays a CUDA graph dispatches no op, so counting needs an eager engine
(``enforce_eager=True``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry, register_flop_formula, sdpa_flop_count

from minieng.config import SamplingParams
from minieng.measure.work import masked_attention_flops, step_work
from minieng.model.llama import ONEDNN_LINEAR

# FlopCounterMode's op names (``str(op)`` of its OpOverloadPackets).
LINEAR_OPS = ("aten.mm", "aten.addmm", "mkldnn._linear_pointwise")
ATTENTION_OPS = (
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._flash_attention_forward",
    "aten._efficient_attention_forward",
)


@functools.cache
def register_flop_formulas() -> None:
    """Teach FlopCounterMode the two kernels it has no formula for, once per process, where counting
    starts (never at import: it changes torch's global registry). The CPU's fused SDPA kernel gets
    torch's own formula for the CUDA kernels (the dense score rectangle), and oneDNN's linear
    (``llama.linear`` on x86-64 CPUs) 2 m n k, as ``aten.mm``."""
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None and cpu_sdpa not in flop_registry:

        @register_flop_formula(cpu_sdpa)
        def _cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return sdpa_flop_count(query_shape, key_shape, value_shape)

    onednn = torch.ops.mkldnn._linear_pointwise if ONEDNN_LINEAR else None
    if onednn is not None and onednn not in flop_registry:

        @register_flop_formula(onednn)
        def _linear_pointwise_flop(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
            return 2 * math.prod(x_shape[:-1]) * w_shape[0] * w_shape[1]


def counted_flops(fn: Callable[[], object]) -> dict[str, int]:
    """FLOPs per op name that ``fn()`` dispatched, as FlopCounterMode counts them (the formulas of
    ``register_flop_formulas`` included)."""
    register_flop_formulas()
    with FlopCounterMode(display=False) as counter:
        fn()
    return {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}


def counted_steps(engine, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[dict]:
    """Send ``prompts`` (greedy, ``max_tokens`` each) and run every step under FlopCounterMode.

    Returns one dict per step: ``chunks`` (the ``StepRecord``'s), ``counted_linear_flops`` and
    ``linear_flops`` (``step_work``'s matmul + LM head), ``counted_attention_flops`` and
    ``attention_flops`` (the causal count), ``masked_attention_flops`` (the prefill chunks'
    masked triangles), and ``other_flops``: what FlopCounterMode counted in any other op.
    Raises ``ValueError`` for an engine that replays CUDA graphs (FlopCounterMode sees none of
    a graph's ops) or when requests are already running (their steps would mix in).
    """
    if engine.runner.graphs is not None:
        raise ValueError(
            "this engine replays CUDA graphs, whose ops FlopCounterMode cannot see: count on "
            "LLMEngine(loaded=engine.loaded, enforce_eager=True, ...)"
        )
    if engine.has_unfinished_requests():
        raise ValueError("the engine has requests running: counted_steps needs it idle")
    params = SamplingParams.fixed_length(max_tokens)
    for prompt in prompts:
        engine.add_request(list(prompt), params)
    rows = []
    while engine.has_unfinished_requests():
        counts = counted_flops(engine.step)
        chunks = engine.step_records[-1].chunks
        work = step_work(engine.model_config, chunks, engine.dtype.itemsize)
        rows.append(
            {
                "chunks": [list(c) for c in chunks],
                "counted_linear_flops": sum(counts.get(op, 0) for op in LINEAR_OPS),
                "linear_flops": work.matmul_flops + work.lm_head_flops,
                "counted_attention_flops": sum(counts.get(op, 0) for op in ATTENTION_OPS),
                "attention_flops": work.attention_flops,
                "masked_attention_flops": masked_attention_flops(engine.model_config, chunks),
                "other_flops": {op: n for op, n in counts.items() if op not in LINEAR_OPS + ATTENTION_OPS},
            }
        )
    return rows
