"""How a step's forward ran, and why a faster one was dropped.

A step runs the fastest forward that fits it (``strategy.FastPaths``): for a decode step a CUDA
graph's replay, or the compiled CPU decode step; for any step the layers' compiled regions; else
the runner's own eager forward.
Each fast path is built at start-up and can fail there: a capture out of memory, an op the capture
refuses, Triton's ``CompilationError`` or ``OutOfResources``, a missing compiler. The engine then
runs the slower path, warns, and keeps the reason (``FastPaths.dropped_paths``); every step
records the path it ran (``StepRecord.forward_path``), so a broken fast path shows as a named
fallback, not only as slow steps. ``EngineConfig.strict_forward_paths`` raises instead (``make
gpu-check`` sets it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

import torch

from minieng.core.model_runner import EAGER

T = TypeVar("T")

# The forwards a step can run, fastest first (``StepRecord.forward_path``).
CUDA_GRAPH, COMPILED_STEP, COMPILED_REGIONS = "cuda_graph", "compiled_step", "compiled_regions"
FORWARD_PATHS = (CUDA_GRAPH, COMPILED_STEP, COMPILED_REGIONS, EAGER)


class FastPathFailed(RuntimeError):
    """A fast path (``path``: "compile" or "cuda_graph") that could not be built, and ``reason``."""

    def __init__(self, path: str, reason: str, message: str):
        super().__init__(message)
        self.path, self.reason = path, reason


def fall_back(build: Callable[[], T], slower: T, strict: bool, dropped: dict[str, str]) -> T:
    """``build()``, or, when it raises ``FastPathFailed``, ``slower``: with a warning, and the reason
    kept in ``dropped`` (path -> reason). ``strict`` raises the failure instead."""
    try:
        return build()
    except FastPathFailed as e:
        if strict:
            raise
        warnings.warn(str(e), stacklevel=4)
        dropped[e.path] = e.reason
        return slower


# The oldest GPU generation the Triton decode kernel runs on: sm_80 (Ampere) and later have the
# tensor-core mma that its tl.dot lowers to.
MIN_TRITON_CAPABILITY = (8, 0)


def check_attention_backend(backend: str, head_dim: int, device: torch.device) -> None:
    """Refuse ``backend="triton"`` where its kernel cannot run, or runs badly (``ValueError`` saying
    why and naming the way out): no triton, a CPU without Triton's interpreter, a ``head_dim`` the
    kernel does not take, a GPU older than sm_80 (``MIN_TRITON_CAPABILITY``: Colab's T4 is sm_75).
    ``"sdpa"`` runs everywhere."""
    if backend != "triton":
        return
    from minieng.wings.fast_paths import triton_attention as ta  # lazy: triton is optional and slow to import

    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    why = (
        "triton is not installed (pip install triton)"
        if not ta.TRITON_AVAILABLE
        else "a CPU runs Triton kernels only under its interpreter (TRITON_INTERPRET=1 before triton is imported)"
        if device.type == "cpu" and not ta.INTERPRETED
        else f"the kernel takes a head_dim that is a power of two >= 16, not {head_dim}"
        if head_dim < 16 or head_dim & (head_dim - 1)
        else f"this GPU is sm_{capability[0]}{capability[1]}: below sm_80 Triton lowers the kernel's tl.dot to "
        "FMA instructions, without tensor cores"
        if capability is not None and capability < MIN_TRITON_CAPABILITY
        else None
    )
    if why:
        raise ValueError(f"attention_backend='triton': {why}; use attention_backend='sdpa'")
