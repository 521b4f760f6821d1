"""``LLMEngine(compile=True)``: the decoder layers' dense parts compiled with ``torch.compile``.

What a small model's decode step spends outside its matrix products is dispatch: dozens of small
ops per layer (norms, RoPE, residual adds, SiLU), each a trip through Python and the dispatcher
and, on a GPU, a kernel launch. ``torch.compile`` (TorchDynamo captures the ops, TorchInductor
fuses the elementwise ones into a few generated kernels: C++ loops on a CPU, Triton on a GPU)
removes most of them. As in vLLM's piecewise compilation, attention is left out: the paged K/V
write and read stay eager between the two compiled regions of each layer
(``DecoderLayer.before_attention``: norm, qkv product, RoPE; ``after_attention``: output
product, residual, norm, MLP, residual), so the block tables, masks and batch composition that
change every step never reach the compiler.

Regional: each region is compiled once, as a function of the layer (``regions()``), and every
layer of the same kind reuses the compiled code (its weights are inputs, not constants), so the
cold start stays short whatever the depth. Shapes are dynamic (``dynamic=True``): the number of
tokens in a step changes every step and must not recompile; torch specializes a size of 1, so a
decode of one sequence and steps of two or more tokens are two graphs per region, compiled at
start-up (``warm_up``), and none after. On CUDA the compiled regions run inside the captured
decode graphs.
"""

from __future__ import annotations

import os
import shutil
import time

import torch

from minieng.engine.memory_plan import throwaway_forward
from minieng.model.llama import DecoderLayer

_REGIONS = None  # compiled once per process, shared by every engine that compiles


def regions() -> tuple:
    """The compiled ``(before_attention, after_attention)``, each called as ``fn(layer, ...)``."""
    global _REGIONS
    if _REGIONS is None:
        _REGIONS = (
            torch.compile(DecoderLayer.before_attention, dynamic=True),
            torch.compile(DecoderLayer.after_attention, dynamic=True),
        )
    return _REGIONS


def compiler_missing(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot run on ``device`` here, or None: on a CPU, inductor builds C++
    and needs a compiler ($CXX, g++, c++ or clang++); on CUDA, it generates Triton kernels."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton  # lazy: a CUDA-only question

        return None if has_triton() else "no triton for this CUDA torch (pip install triton)"
    candidates = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    if any(c and shutil.which(c) for c in candidates):
        return None
    return "no C++ compiler on PATH (install g++, or set CXX)"


def warm_up(model, device: torch.device, regions_: tuple) -> float:
    """Compile both regions' graphs now (a step of one token and one of two: the two shapes torch
    tells apart), so no request pays for it. Returns the seconds it took."""
    start = time.perf_counter()
    for n in (1, 2):
        ids = torch.zeros(n, dtype=torch.long, device=device)
        throwaway_forward(model, ids, torch.tensor([n - 1], device=device), regions=regions_)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
