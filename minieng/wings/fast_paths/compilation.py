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

Regional: each region is compiled once per engine, as a function of the layer (``regions()``),
and every layer of the same kind reuses the compiled code (its weights are inputs, not constants),
so the cold start stays short whatever the depth. Per engine, not per process: Dynamo keeps a code
object's graphs in one cache with a recompile limit (8), and every (model shape, dtype, scheme) adds
graphs; a process whose engines shared the regions would, from the fifth such engine, run regions
eagerly with only a log line. Each engine compiles copies with code objects of its own
(``own_copy``), as its whole decode step. Shapes are dynamic (``dynamic=True``): the number of
tokens in a step changes every step and must not recompile; torch specializes a size of 1, so a
decode of one sequence and steps of two or more tokens are two graphs per region, compiled at
start-up (``warm_up``), and none after. On CUDA the compiled regions run inside the captured
decode graphs, with Inductor's default settings (gpt-fast and SGLang add
``coordinate_descent_tuning``, which tunes every generated kernel at compile time: unmeasured here,
and left off).

Plain decode steps on a CPU (one query per sequence) run a whole compiled step instead
(``compiled_decode``: embedding to logits in one graph, attention an opaque operator): the
regions' graphs are called 60 times a step in a 30-layer model, and each call pays Dynamo's guard
check and wrapper, which cost the default model's batch-1 step more than the fusion saved (the
step ran slower than eager). One graph checks its guards once. On CUDA decode steps replay
captured graphs, where no guard is checked, so they keep the regions. The sizes that change from
step to step, the batch and the block-table width, are marked dynamic (``run_decode``); a width
of 1 never reaches it (``MIN_DECODE_WIDTH``), and a batch of 1 is a graph of its own, so two
graphs are compiled at start-up (``warm_up_decode``).
"""

from __future__ import annotations

import os
import shutil
import time
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minieng.wings.fast_paths.forward_paths import FastPathFailed
from minieng.core.model_runner import throwaway_forward
from minieng.core.attention import AttentionMetadata, build_metadata
from minieng.wings.fast_paths.compiled_decode import decode_forward
from minieng.wings.fast_paths.opaque_ops import use_opaque_linears
from minieng.core.kv_cache import KVCache
from minieng.core.llama import DecoderLayer, LlamaForCausalLM

# The narrowest block table a compiled decode step sees: torch specializes a size of 1, so a
# width of 1 would be a graph of its own. Padding is masked (``attention.decode_mask``).
MIN_DECODE_WIDTH = 2


@dataclass(frozen=True)
class CompiledParts:
    """What ``compile=True`` built for one engine's model: the layers' compiled ``regions``, the
    compiled ``decode`` step (a CPU's; None on CUDA, whose decode steps replay CUDA graphs) and the
    seconds compiling them took at start-up (``compile_s``). All None: the model runs eagerly."""

    regions: tuple | None = None
    decode: Callable | None = None
    compile_s: float | None = None


NOT_COMPILED = CompiledParts()


def compile_model(model: LlamaForCausalLM, kv_cache: KVCache) -> CompiledParts:
    """Compile ``model``'s parts now (``regions``, ``warm_up``; on a CPU the whole decode step too,
    ``compile_decode_step``, warmed up over ``kv_cache``), so no request pays for it. Raises
    ``forward_paths.FastPathFailed`` where it cannot compile (no compiler, or the compiler fails):
    the runner then runs eagerly (``forward_paths.fall_back``)."""
    device = kv_cache.kv.device
    why = compiler_missing(device)
    if why is None:
        try:
            use_opaque_linears(model)
            regions_ = regions()
            compile_s = warm_up(model, device, regions_)
            one_rank_cpu = device.type == "cpu" and getattr(model, "tp", None) is None
            if not one_rank_cpu:  # decode_forward is one rank's, on a CPU
                return CompiledParts(regions_, None, compile_s)
            decode = compile_decode_step()
            return CompiledParts(regions_, decode, compile_s + warm_up_decode(decode, model, kv_cache))
        except Exception as e:  # noqa: BLE001 (any compiler failure: the engine still runs, eagerly)
            why = f"torch.compile failed ({type(e).__name__}: {str(e)[:300]})"
    raise FastPathFailed("compile", why, f"compile=True: {why}; the engine runs eagerly")


def regions() -> tuple:
    """A compiled ``(before_attention, after_attention)`` of the caller's own (one engine's), each
    called as ``fn(layer, ...)``: ``LlamaForCausalLM.forward``'s ``regions``. ``compiled``: the
    ``torch.compile`` functions themselves."""
    before = torch.compile(own_copy(DecoderLayer.before_attention), dynamic=True)
    after = torch.compile(own_copy(DecoderLayer.after_attention), dynamic=True)

    def before_attention(layer, x: torch.Tensor, rope: torch.Tensor):
        # A float32 model's table is complex, which inductor compiles no code for: its real pairs
        # (``llama.apply_rope``).
        return before(layer, x, torch.view_as_real(rope) if rope.is_complex() else rope)

    before_attention.compiled = before
    return before_attention, after


def own_copy(f: types.FunctionType) -> types.FunctionType:
    """``f`` with a code object of its own: Dynamo keeps graphs per code object, so a copy's cache
    (and its recompile limit) is its caller's alone."""
    return types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)


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


def compile_decode_step():
    """A compiled ``decode_forward`` of the caller's own, called as ``fn(model, ...)``
    (``run_decode``); each engine that compiles makes one.

    Dynamo checks no guard on the model's modules and parameters (``guard_filter_fn``:
    ``skip_guard_on_all_nn_modules_unsafe``, torch 2.7 and later), which it would otherwise check
    every step (about 5% of the W8A8 batch-1 forward on a 2-core CPU: docs/measurements.md). That is
    sound only while the function sees one model, whose modules do not change: Dynamo keeps graphs
    per code object, so each engine compiles a copy of the function with a code object of its own
    (graphs of two models in one cache, chosen without those guards, once ran the wrong one: a
    ``KeyError`` on a quantized layer's ``weight``). ``fullgraph=True``: a graph break fails the
    warm-up, and the engine runs eagerly, rather than leaving pieces to caches that other models
    share. Inductor's C++ wrapper (``cpp_wrapper``) is left out: 3% faster, and its first compile
    took 45 s against 6 s (docs/measurements.md)."""
    skip = getattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe", None)
    return torch.compile(own_copy(decode_forward), fullgraph=True, options={"guard_filter_fn": skip} if skip else None)


def fits_decode_step(meta: AttentionMetadata) -> bool:
    """Whether a step is what the compiled decode step runs: decodes only, one query each,
    attended at once by the gather-and-SDPA backend."""
    return (
        meta.num_decodes > 0
        and not meta.prefills
        and meta.decode_query_len == 1
        and meta.decode_group_size is None
        and meta.decode_attention is None
    )


@torch.inference_mode()
def run_decode(
    decode_fn, model: LlamaForCausalLM, kv_cache: KVCache, input_ids: torch.Tensor, positions: torch.Tensor, meta
) -> torch.Tensor:
    """Logits [batch, vocab] float32 of a step that ``fits_decode_step``, through ``decode_fn``
    (``compile_decode_step()``); ``input_ids``, ``positions`` [batch] int64; the step's K/V are
    written into ``kv_cache``. The batch (when above 1) and the width are marked dynamic, so that
    no batch size or context length compiles a graph of its own."""
    rope = torch.view_as_real(model.rope.tables(positions))  # [batch, heads, head_dim / 2, 2]
    tables, mask = meta.decode_block_tables, meta.decode_mask  # [batch, width], [batch, 1, 1, slots]
    if input_ids.shape[0] > 1:
        for t in (input_ids, rope, meta.slot_mapping, tables, mask):
            torch._dynamo.mark_dynamic(t, 0)
    torch._dynamo.mark_dynamic(tables, 1)
    torch._dynamo.mark_dynamic(mask, 3)
    return decode_fn(model, input_ids, rope, kv_cache.kv, meta.slot_mapping, tables, mask)


def warm_up_decode(decode_fn, model: LlamaForCausalLM, kv_cache: KVCache) -> float:
    """Compile the decode step's two graphs now (one sequence; two or more) on padding rows, as
    the CUDA graphs' capture does: they write the scratch slot and read the null block. Width
    ``MIN_DECODE_WIDTH + 1``, so that no size of the warm-up equals another (torch would take
    equal sizes for one, and compile again when they differ). Returns the seconds it took."""
    start = time.perf_counter()
    for batch in (1, 2):
        meta = build_metadata(
            [kv_cache.scratch_slot] * batch,
            [([], 1)] * batch,
            [],
            kv_cache.block_size,
            kv_cache.null_block,
            kv_cache.kv.device,
            min_width=MIN_DECODE_WIDTH + 1,
            dtype=kv_cache.kv.dtype,
        )
        zeros = torch.zeros(batch, dtype=torch.long, device=kv_cache.kv.device)
        run_decode(decode_fn, model, kv_cache, zeros, zeros, meta)
    return time.perf_counter() - start
