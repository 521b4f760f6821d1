"""How a step's forward ran, and why a faster one was dropped.

A decode step runs the fastest of its forwards that fits it (``ModelRunner.decode``): a CUDA
graph's replay, the compiled CPU decode step, the layers' compiled regions, or the eager forward.
Each fast path is built at start-up and can fail there: a capture out of memory, an op the capture
refuses, Triton's ``CompilationError`` or ``OutOfResources``, a missing compiler. The engine then
runs the slower path, warns, and keeps the reason (``ModelRunner.dropped_paths``); every step
records the path it ran (``StepRecord.forward_path``), so a broken fast path shows as a named
fallback, not only as slow steps. ``EngineConfig.strict_forward_paths`` raises instead (``make
gpu-check`` sets it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# The forwards a step can run, fastest first (``StepRecord.forward_path``).
CUDA_GRAPH, COMPILED_STEP, COMPILED_REGIONS, EAGER = "cuda_graph", "compiled_step", "compiled_regions", "eager"
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
