"""FLOPs as torch counts them: ``FlopCounterMode`` with the formulas it lacks for the engine's kernels.

``torch.utils.flop_counter.FlopCounterMode`` sees every op a function dispatches and counts the
matrix products from their shapes, 2 m n k each. It knows nothing of the model, so it is an
independent check of the analytic count (``flops_bytes.step_work``). Two kernels the engine runs
have no formula in torch: the CPU's fused SDPA and oneDNN's linear (``llama.linear`` on x86-64
CPUs); ``register_flop_formulas`` adds them. ``counted_flops`` counts one call, per op name;
``LINEAR_OPS`` and ``ATTENTION_OPS`` name the ops of the linear layers and of attention.
``lab.step_flops`` runs an engine's steps under it, beside ``step_work``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry, register_flop_formula, sdpa_flop_count

from minieng.core.llama import ONEDNN_LINEAR

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
