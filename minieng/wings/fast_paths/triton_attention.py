"""Paged attention for decode as two Triton kernels (flash-decoding): K/V read where they lie in the pool.

The reference path (``attention.paged_attention``) first gathers each decode's K/V blocks into a
padded ``[batch, kv_heads, width * block_size, head_dim]`` copy and then runs SDPA over it with a
mask. That copy is as large as the keys and values it attends, is written once and read once,
and grows with the batch's longest context: at long contexts it doubles the bytes a memory-bound
decode moves. PagedAttention (Kwon et al., "Efficient Memory Management for Large Language Model
Serving with PagedAttention", SOSP 2023, the vLLM paper) reads the blocks in place instead: the
kernel is handed the block table and turns each key position into its slot itself.

One program per sequence and KV head leaves a large GPU idle at small batch (batch 1 of a model
with 8 KV heads runs 8 programs). Flash-decoding (Dao, Haziza, Massa and Sizov, "Flash-Decoding
for long-context inference", 2023) also splits each sequence's keys over several programs and
combines their partial softmax sums in a second, small kernel; vLLM's Triton decode kernels
(``vllm/attention/ops/triton_decode_attention.py``, stage 1 and stage 2, from SGLang and LightLLM)
work this way, and so do these two:

- **Stage 1** (``_split_kernel``, grid ``(batch, kv_heads, num_splits)``): one program attends one
  sequence, one KV head and one *split* of the sequence's keys. It loads the ``group = num_heads
  // kv_heads`` query heads that share the KV head as one ``[BLOCK_H, head_dim]`` tile (padded to
  at least 16 rows, the smallest ``tl.dot``), which reads each K/V tile once for the whole group
  (as the reference's GQA view does) and makes the scores a matrix product for tensor cores. The
  context's ``tiles = ceil(context_len / BLOCK_N)`` tiles are dealt to the splits in runs of
  ``run = ceil(tiles / num_splits)``, computed in the kernel from the context length it reads on
  the device: split ``s`` attends positions ``[s * run * BLOCK_N, min((s + 1) * run * BLOCK_N,
  context_len))``, and a split that starts at or past the context (a short context in a grid
  sized for a long one) writes nothing. A split writes its output normalised by its own sum,
  ``o_s = acc_s / l_s``, and its log-sum-exp ``lse_s = m_s + log2(l_s)`` to fp32 scratch
  (``[batch, num_heads, num_splits, head_dim]`` and ``[batch, num_heads, num_splits]``), as
  vLLM's stage 1 writes ``acc / e_sum`` and ``e_max + log(e_sum)``.
- **Stage 2** (``_combine_kernel``, grid ``(batch, num_heads)``): per sequence and query head,
  ``out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M)`` with ``M = max_s lse_s``, over the
  splits that hold keys (``ceil(tiles / run)``: the first stage's count, derived the same way, so
  unwritten scratch is never read). This equals ``sum_s 2^m_s acc_s / sum_s 2^m_s l_s``, the
  softmax over the whole context. A context of 0 keys (a padded row) gives zeros.

Within a split the softmax is computed online, as in FlashAttention (Dao et al., NeurIPS 2022;
Milakov and Gimelshein, "Online normalizer calculation for softmax", 2018): per query head the
running maximum score ``m``, the running sum ``l`` of ``exp(score - m)`` and the unnormalised
output ``acc``. A tile of scores ``s`` raises the maximum to ``m' = max(m, max(s))``, rescales the
old sums by ``exp(m - m')`` and adds ``exp(s - m')`` and its product with V. Scores exist only one
tile at a time, in registers; everything accumulates in fp32 (exponentials as ``exp2`` with the
scale folded into ``log2(e) / sqrt(head_dim)``).

**Addressing.** Position ``n`` lies in block ``block_table[n // block_size]`` at offset ``n %
block_size``: the kernel loads the id of each position's block (a tile of ``BLOCK_N`` positions
spans ``BLOCK_N / block_size`` blocks, so neighbouring positions load the same id, from the same
cache line) and reads K and V at that slot. Loading each block's id once and expanding it to the
tile's positions was tried: on Triton 3.9 it compiles to the same PTX, and on Triton 3.6 (the
GPU image's) it kept the K/V loads out of the pipeliner (``ld.global`` in place of ``cp.async``,
204 registers against 96 at the Llama-3-8B shape, read from the PTX cross-compiled on a CPU).
Positions at or past the split's end are masked in the loads themselves: the table's padding,
the null block, and the tails of partly filled blocks are never read, so whatever they hold (even
NaN) cannot reach the output.

**Split count.** ``num_kv_splits`` is FlashAttention-2's ``num_splits_heuristic``
(``csrc/flash_attn/flash_api.cpp``, called with twice the SM count for 128-thread programs, as
ours are): one split once ``batch x kv_heads`` programs fill 80 % of that; otherwise the fewest
splits whose waves of programs are at least 85 % as full as the best count's, at most 128, the
doubled SM count, and the tiles of the *longest context the table can hold* (its width x
block_size). It depends on the tensors' shapes only, never on the context lengths' values (reading
those would sync the device, and they change between replays of one CUDA graph): a CUDA-graph
bucket (fixed batch and width) captures one split count, and the kernel spreads whatever context
each replay brings over it.

**Pipelining.** The tile loop is a ``tl.range(..., num_stages=NUM_STAGES)``, which Triton's
software pipeliner turns into ``cp.async`` copies of later tiles into shared memory (sm_80 and
later). Two conditions, both read from the PTX (``tests/wings/fast_paths/test_triton_ptx.py`` compiles the
kernels for sm_80 and sm_90 on the CPU and checks it): the loads must be known contiguous and
16-byte aligned along ``head_dim``, which Triton knows when it specializes the pool's last stride
of 1 and its strides divisible by 16 at launch (compiled with those strides as plain integers,
the loads stay per-element ``ld.global`` whatever ``num_stages`` says); and the K/V loads depend
on the block-id load, one level of indirection, for which Triton 3.9's latency assignment
(``lib/Dialect/TritonGPU/Transforms/Pipeliner/AssignLatencies.cpp``) gives each pipelined load a
lead of ``(num_stages - 1) // 2`` iterations (at 2 stages the ids are not pipelined and K/V lead
by one). A lead of one keeps a single K and V buffer, refilled only after the tile in it has
been used, so nothing is in flight while a tile computes; ``NUM_STAGES = 5`` gives a lead of two:
K and V double-buffered, the next tile's copies in flight during this tile's products
(``cp.async.wait_group 1`` in the loop). On sm_90 the products are ``mma.sync``, not ``wgmma``,
which needs 64 rows a warp group where the score tile has 16; fp32 pools multiply in full
precision (``input_precision="ieee"``), on FMA units, not tensor cores. All of this was read
from PTX that Triton 3.9 and 3.6 made on a CPU, none from a GPU's timing.

**Variants.** Triton compiles a variant of a kernel for each specialization of its integer
arguments (equal to 1, divisible by 16, other) and pointers (16-byte aligned or not). The table's
width, its row stride and the split count change from step to step, so they are not specialized
(``do_not_specialize``); nor is the alignment of the block-table and context-length pointers
(views into the CUDA graphs' static buffer, or fresh tensors in eager steps). What is left is
fixed for an engine (the pool's dtype, shape and strides, the query's strides, the index dtype):
``warm_up`` launches both kernels once at start-up, which compiles every variant a run meets
(the tests' ``triton_variants.py`` names a launch's variant on the host, and compiles it to PTX with no GPU).

Nothing here has been timed on a GPU: ``BLOCK_N``, the stages, the warps and the split rule are
chosen on paper.

Under Triton's interpreter the kernels run on CPU tensors through NumPy. ``TRITON_INTERPRET=1``
must be set before triton is first imported: triton 3.9 reads it whenever ``@triton.jit`` decorates
a function, and triton's own library (``tl.sum``, ``tl.max``, ``tl.zeros``, ...) is decorated when
triton is imported, so a kernel decorated later under the interpreter still fails inside them.
With triton installed, importing ``torch._dynamo`` imports triton too. ``INTERPRETED`` says
whether both these kernels and triton's library run interpreted. The
interpreter multiplies bf16 tiles as their raw uint16 bits (``tl.dot`` of two bf16 tensors is
garbage there), so the wrapper asks the kernel to upcast its dot operands to fp32 for bf16 when
interpreted (``DOT_FP32``); and it casts fp32 to bf16 by truncating the mantissa, where a GPU
rounds to nearest, so an interpreted bf16 output is stored in fp32 and rounded by torch. fp16 and
fp32 run as they do on a GPU, where the kernels always read and write the pool's dtype.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

try:  # triton is optional: without it the module imports and TRITON_AVAILABLE is False
    import triton
    import triton.language as tl

    TRITON_AVAILABLE = True
except ImportError:
    triton = tl = None
    TRITON_AVAILABLE = False

# Key positions one program attends per step of its loop: 32 keys x 128 dims of fp16 K or V is
# 8 KiB (fp32: 16 keys for the same bytes). NUM_STAGES = 5 double-buffers K and V (see
# "Pipelining" above): about 38 KiB of shared memory a program at head_dim 128 (fp16/bf16; fp32
# about 42 KiB; Triton 3.9's figures), so two programs fit an sm_86/89 SM (~100 KiB). Sizes
# chosen from the PTX, not tuned on a GPU.
BLOCK_N = {torch.float16: 32, torch.bfloat16: 32, torch.float32: 16}
NUM_STAGES = 5
NUM_WARPS = 4  # 128 threads a program, which FlashAttention-2's split rule assumes (num_kv_splits)
COMBINE_WARPS = 4  # the second stage, as vLLM's ``_fwd_kernel_stage2`` (it has no tile loop to pipeline)
# The smallest M of tl.dot on NVIDIA GPUs: a group of fewer query heads is padded to it.
MIN_DOT_ROWS = 16
# The most splits a sequence's keys are dealt to (FlashAttention-2's max_splits).
MAX_SPLITS = 128
# What the split rule takes for a CPU running the kernels interpreted: a small GPU's worth of SMs,
# so that tests split the keys too (each program runs in Python there: more splits, slower tests).
INTERPRETER_SMS = 4

# Arguments whose value changes from step to step (see "Variants" above): never specialized, so
# that a new value compiles nothing. The pointers whose alignment differs between a CUDA graph's
# static buffer and an eager step's fresh tensors: their alignment is not specialized either.
SPLIT_UNSPECIALIZED = ("stride_tb", "max_blocks", "num_splits")
COMBINE_UNSPECIALIZED = ("max_blocks", "num_splits")
UNALIGNED_POINTERS = ("block_tables_ptr", "context_lens_ptr")

if TRITON_AVAILABLE:

    @triton.jit(do_not_specialize=SPLIT_UNSPECIALIZED, do_not_specialize_on_alignment=UNALIGNED_POINTERS)
    def _split_kernel(
        q_ptr,
        cache_ptr,
        block_tables_ptr,
        context_lens_ptr,
        part_out_ptr,  # [batch, num_heads, num_splits, HEAD_DIM] fp32: each split's acc / l
        part_lse_ptr,  # [batch, num_heads, num_splits] fp32: each split's m + log2(l)
        stride_qb,
        stride_qh,
        stride_qd,
        stride_cb,
        stride_cs,
        stride_ch,
        stride_cd,
        stride_tb,
        stride_tn,
        qk_scale,  # softmax scale x log2(e): scores are exponentiated with exp2
        max_blocks,  # block table width: positions past max_blocks * BLOCK_SIZE are never read
        num_splits,  # programs along the grid's third axis
        KV_HEADS: tl.constexpr,
        GROUP: tl.constexpr,  # query heads per KV head
        BLOCK_SIZE: tl.constexpr,  # tokens per pool block
        HEAD_DIM: tl.constexpr,
        BLOCK_H: tl.constexpr,  # GROUP padded to a power of two >= 16
        BLOCK_N: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        DOT_FP32: tl.constexpr,  # upcast dot operands to fp32 (the interpreter's bf16 dot is wrong)
        DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 pools (no TF32 rounding), else "tf32" (the default)
    ):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_n = tl.arange(0, BLOCK_N)

        # The GROUP query heads that read this KV head: rows kv_head * GROUP + h, padded rows zero.
        head_ok = offs_h < GROUP
        heads = kv_head * GROUP + offs_h
        q = tl.load(
            q_ptr + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
            mask=head_ok[:, None],
            other=0.0,
        )  # [BLOCK_H, HEAD_DIM]
        if DOT_FP32:
            q = q.to(tl.float32)

        # This split's keys: a run of whole tiles, dealt from the context length read here.
        context_len = tl.minimum(tl.load(context_lens_ptr + seq), max_blocks * BLOCK_SIZE)
        run = tl.cdiv(tl.cdiv(context_len, BLOCK_N), num_splits) * BLOCK_N
        split_start = split * run
        split_end = tl.minimum(split_start + run, context_len)

        table_row = block_tables_ptr + seq.to(tl.int64) * stride_tb
        k_base = cache_ptr + kv_head * stride_ch  # a token's K heads come first ...
        v_base = cache_ptr + (KV_HEADS + kv_head) * stride_ch  # ... then its V heads

        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of the (log2-scaled) scores
        l_i = tl.zeros([BLOCK_H], tl.float32)  # running sum of exp2(score - m_i)
        acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)  # running sum of exp2(score - m_i) * v

        for start in tl.range(split_start, split_end, BLOCK_N, num_stages=NUM_STAGES):
            pos = start + offs_n
            valid = pos < split_end
            block = tl.load(table_row + (pos // BLOCK_SIZE) * stride_tn, mask=valid, other=0)  # one id a position
            slot = block.to(tl.int64) * stride_cb + (pos % BLOCK_SIZE) * stride_cs
            kv_offs = slot[:, None] + offs_d[None, :] * stride_cd  # [BLOCK_N, HEAD_DIM]

            k = tl.load(k_base + kv_offs, mask=valid[:, None], other=0.0)
            if DOT_FP32:
                k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_H, BLOCK_N]
            s = tl.where(valid[None, :], s, float("-inf"))

            # Online softmax: a split's first tile always holds a valid key, so m_new is finite
            # and alpha = exp2(-inf - m_new) = 0 wipes the (empty) initial sums.
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)

            v = tl.load(v_base + kv_offs, mask=valid[:, None], other=0.0)
            if DOT_FP32:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        if split_start < split_end:  # a split with no keys (past a short context) writes nothing
            # l_i > 0 in every row: the split's first key scores finite in each (padded rows too).
            rows = (seq.to(tl.int64) * (KV_HEADS * GROUP) + heads) * num_splits + split  # [BLOCK_H]
            tl.store(
                part_out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], acc / l_i[:, None], mask=head_ok[:, None]
            )
            tl.store(part_lse_ptr + rows, m_i + tl.log2(l_i), mask=head_ok)

    @triton.jit(do_not_specialize=COMBINE_UNSPECIALIZED, do_not_specialize_on_alignment=UNALIGNED_POINTERS[1:])
    def _combine_kernel(
        part_out_ptr,
        part_lse_ptr,
        context_lens_ptr,
        out_ptr,
        stride_ob,
        stride_oh,
        stride_od,
        max_blocks,
        num_splits,
        NUM_HEADS: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        seq = tl.program_id(0)
        head = tl.program_id(1)
        offs_d = tl.arange(0, HEAD_DIM)
        # The splits the first stage wrote: the same runs of tiles, from the same context length.
        context_len = tl.minimum(tl.load(context_lens_ptr + seq), max_blocks * BLOCK_SIZE)
        tiles = tl.cdiv(context_len, BLOCK_N)
        used = tl.cdiv(tiles, tl.maximum(tl.cdiv(tiles, num_splits), 1))
        row0 = (seq.to(tl.int64) * NUM_HEADS + head) * num_splits

        m = tl.full([], float("-inf"), tl.float32)  # the largest lse so far
        total = tl.zeros([], tl.float32)  # sum of 2^(lse_s - m)
        acc = tl.zeros([HEAD_DIM], tl.float32)  # sum of 2^(lse_s - m) * o_s
        for s in range(0, used):
            lse = tl.load(part_lse_ptr + row0 + s)
            o = tl.load(part_out_ptr + (row0 + s) * HEAD_DIM + offs_d)
            m_new = tl.maximum(m, lse)
            alpha = tl.exp2(m - m_new)
            weight = tl.exp2(lse - m_new)
            acc = acc * alpha + weight * o
            total = total * alpha + weight
            m = m_new
        out = acc / tl.where(total > 0.0, total, 1.0)  # no split: a context of 0 keys gives zeros
        tl.store(
            out_ptr + seq * stride_ob + head * stride_oh + offs_d * stride_od,
            out.to(out_ptr.dtype.element_ty),
        )

    try:  # the interpreter's function class, to tell how the kernels and triton's library were decorated
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - a triton without an interpreter
        InterpretedFunction = ()
    # tl.sum is one of triton's own @triton.jit helpers, decorated when triton was first imported.
    INTERPRETED = isinstance(_split_kernel, InterpretedFunction) and isinstance(tl.sum, InterpretedFunction)
else:
    INTERPRETED = False

_INDEX_DTYPES = (torch.int32, torch.int64)
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_inputs(q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor) -> None:
    """Raise ValueError unless the four tensors fit together (see ``paged_decode_attention``)."""
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, num_heads, head_dim], got shape {tuple(q.shape)}")
    if cache.dim() != 4 or cache.shape[2] % 2:
        raise ValueError(f"cache must be [num_blocks, block_size, 2 * kv_heads, head_dim], got {tuple(cache.shape)}")
    batch, num_heads, head_dim = q.shape
    kv_heads = cache.shape[2] // 2
    if cache.shape[3] != head_dim:
        raise ValueError(f"q's head_dim {head_dim} differs from the cache's {cache.shape[3]}")
    if head_dim < MIN_DOT_ROWS or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= {MIN_DOT_ROWS}, got {head_dim}")
    if num_heads % kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of kv_heads {kv_heads}")
    if q.dtype not in _FLOAT_DTYPES or cache.dtype != q.dtype:
        raise ValueError(f"q and cache must share one of {_FLOAT_DTYPES}, got {q.dtype} and {cache.dtype}")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or block_tables.dtype not in _INDEX_DTYPES:
        raise ValueError(
            f"block_tables must be [batch={batch}, max_blocks] int32/int64, "
            f"got {tuple(block_tables.shape)} {block_tables.dtype}"
        )
    if context_lens.shape != (batch,) or context_lens.dtype not in _INDEX_DTYPES:
        raise ValueError(
            f"context_lens must be [batch={batch}] int32/int64, got {tuple(context_lens.shape)} {context_lens.dtype}"
        )
    devices = {t.device for t in (q, cache, block_tables, context_lens)}
    if len(devices) > 1:
        raise ValueError(
            f"q, cache, block_tables and context_lens must be on one device, got {sorted(map(str, devices))}"
        )


@functools.lru_cache(maxsize=4096)  # a step's launches ask it per layer: rule once per shape
def num_kv_splits(programs: int, num_tiles: int, num_slots: int, max_splits: int = MAX_SPLITS) -> int:
    """How many splits each sequence's keys are dealt to: FlashAttention-2's ``num_splits_heuristic``
    (``csrc/flash_attn/flash_api.cpp``).

    Args:
        programs: programs without splitting, ``batch x kv_heads``.
        num_tiles: ``BLOCK_N``-key tiles of the longest context the block table can hold
            (``ceil(width * block_size / BLOCK_N)``): more splits would leave some empty.
        num_slots: programs the device runs at once, as FlashAttention-2 counts them: twice the
            SM count for its 128-thread programs (``_device_slots``).
        max_splits: at most this many (FlashAttention-2: 128).

    Returns 1 once ``programs`` fill 80 % of ``num_slots``. Otherwise, among the counts up to
    ``min(max_splits, num_slots, num_tiles)`` that change the tiles a split gets (12 splits of 64
    tiles deal 6 each, as 11 do: 12 is skipped), the fewest whose waves of programs,
    ``programs x splits / num_slots``, fill their last wave at least 85 % as well as the best count.
    Raises ValueError on a count below 1.
    """
    if min(programs, num_slots, max_splits) < 1 or num_tiles < 0:
        raise ValueError(
            f"programs={programs}, num_slots={num_slots} and max_splits={max_splits} must be >= 1, "
            f"num_tiles={num_tiles} >= 0"
        )
    if programs >= 0.8 * num_slots:
        return 1
    limit = min(max_splits, num_slots, num_tiles)

    def eligible(n: int) -> bool:
        return n == 1 or -(-num_tiles // n) != -(-num_tiles // (n - 1))

    def efficiency(n: int) -> float:
        waves = programs * n / num_slots
        return waves / math.ceil(waves)

    counts = [n for n in range(1, limit + 1) if eligible(n)]
    if not counts:
        return 1
    best = max(efficiency(n) for n in counts)
    return next(n for n in counts if efficiency(n) >= 0.85 * best)


@functools.cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _device_slots(device: torch.device) -> int:
    """``num_kv_splits``'s program slots: twice the SM count on CUDA (FlashAttention-2's factor
    for 128-thread programs), twice ``INTERPRETER_SMS`` on a CPU. Borrowed, not measured: at
    Triton 3.9's 80-96 registers and ~38 KiB of shared memory about 5 of these programs fit an
    H200 SM, so the rule may split less than this kernel could use (a sweep on a GPU decides)."""
    if device.type == "cuda":
        return 2 * _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
    return 2 * INTERPRETER_SMS


def _scratch(batch: int, num_heads: int, num_splits: int, head_dim: int, device: torch.device):
    """The first stage's fp32 outputs, uninitialised: [batch, num_heads, num_splits, head_dim] and
    [batch, num_heads, num_splits] (tests fill them with NaN to show unwritten splits go unread)."""
    out = torch.empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=device)
    lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=device)
    return out, lse


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel[grid](*args, **kwargs)``."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.kwargs)


def plan_decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, list[Launch]]:
    """The output tensor and the two launches that fill it, not run (``paged_decode_attention``
    runs them; ``tests/wings/fast_paths/test_triton_ptx.py`` compiles them for a GPU on the CPU).

    Arguments as ``paged_decode_attention``. The output is float32 for an interpreted bf16 run
    (rounded by the caller), else q's dtype. No launches for an empty batch. Raises ValueError
    as ``paged_decode_attention`` does, RuntimeError without triton.
    """
    if not TRITON_AVAILABLE:
        raise RuntimeError("paged_decode_attention needs triton (pip install triton)")
    _check_inputs(q, cache, block_tables, context_lens)
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be an int >= 1 or None (chosen by num_kv_splits), got {num_splits!r}")
    batch, num_heads, head_dim = q.shape
    block_size, kv_heads = cache.shape[1], cache.shape[2] // 2
    group = num_heads // kv_heads
    max_blocks = block_tables.shape[1]
    block_n = BLOCK_N[q.dtype]
    # The interpreter casts fp32 to bf16 by truncation (a GPU rounds to nearest): interpreted, a bf16
    # output is written in fp32 and rounded by torch.
    round_in_torch = INTERPRETED and q.dtype == torch.bfloat16
    out = torch.empty((batch, num_heads, head_dim), dtype=torch.float32 if round_in_torch else q.dtype, device=q.device)
    if batch == 0:
        return out, []
    if num_splits is None:
        num_splits = num_kv_splits(batch * kv_heads, -(-max_blocks * block_size // block_n), _device_slots(q.device))
    part_out, part_lse = _scratch(batch, num_heads, num_splits, head_dim, q.device)
    split = Launch(
        _split_kernel,
        (batch, kv_heads, num_splits),
        (
            q,
            cache,
            block_tables,
            context_lens,
            part_out,
            part_lse,
            *q.stride(),
            *cache.stride(),
            *block_tables.stride(),
            math.log2(math.e) / math.sqrt(head_dim),
            max_blocks,
            num_splits,
        ),
        dict(
            KV_HEADS=kv_heads,
            GROUP=group,
            BLOCK_SIZE=block_size,
            HEAD_DIM=head_dim,
            BLOCK_H=max(MIN_DOT_ROWS, triton.next_power_of_2(group)),
            BLOCK_N=block_n,
            NUM_STAGES=NUM_STAGES,
            DOT_FP32=INTERPRETED and q.dtype == torch.bfloat16,
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            num_warps=NUM_WARPS,
            num_stages=NUM_STAGES,
        ),
    )
    combine = Launch(
        _combine_kernel,
        (batch, num_heads),
        (part_out, part_lse, context_lens, out, *out.stride(), max_blocks, num_splits),
        dict(
            NUM_HEADS=num_heads,
            BLOCK_SIZE=block_size,
            HEAD_DIM=head_dim,
            BLOCK_N=block_n,
            num_warps=COMBINE_WARPS,
            num_stages=1,
        ),
    )
    return out, [split, combine]


def paged_decode_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Decode attention of one query token per sequence over its keys and values in the paged pool.

    Args:
        q: [batch, num_heads, head_dim] float32, float16 or bfloat16, RoPE applied; any strides.
            Query head h reads KV head ``h // (num_heads // kv_heads)`` (GQA).
        cache: one layer's pool [num_blocks, block_size, 2 * kv_heads, head_dim], q's dtype, each
            token's K heads then its V heads; any strides.
        block_tables: [batch, max_blocks] int32 or int64, each sequence's blocks in order; entries
            past a sequence's last block are never read (they may hold any id, e.g. the null block).
        context_lens: [batch] int32 or int64, the keys each sequence attends: positions
            ``0 .. context_len - 1`` (its current token included). Not checked against the table,
            which would cost a device sync: keys past ``max_blocks * block_size`` are ignored, and a
            context of 0 yields zeros.
        num_splits: programs each sequence's keys are split over (flash-decoding); None chooses
            ``num_kv_splits`` from the batch, the KV heads, the table's width and the device. Any
            count gives the same result (splits past a short context stay empty).

    Returns:
        [batch, num_heads, head_dim] contiguous, q's dtype: ``softmax(q k^T / sqrt(head_dim)) v`` per
        sequence and head, accumulated in fp32.

    Raises:
        ValueError: a tensor of the wrong rank or shape, q and cache of different dtypes or not a
            float type, index tensors not int32/int64, tensors on different devices, num_heads
            not a multiple of kv_heads, head_dim not a power of two >= 16, num_splits below 1.
        RuntimeError: triton is not installed, or the tensors are on the CPU and triton does not
            run interpreted (``INTERPRETED``: set ``TRITON_INTERPRET=1`` before triton is first
            imported).
    """
    out, launches = plan_decode(q, cache, block_tables, context_lens, num_splits)
    if q.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "CPU tensors run only under Triton's interpreter: set TRITON_INTERPRET=1 before triton is "
            "first imported (importing torch._dynamo imports it)"
        )
    for launch in launches:
        launch()
    return out.to(q.dtype)


def decode_attention(q: torch.Tensor, cache: torch.Tensor, meta) -> torch.Tensor:
    """``paged_decode_attention`` as ``AttentionMetadata.decode_attention``: q [batch, heads,
    head_dim] over one layer's ``cache`` at the step's block tables and context lengths."""
    return paged_decode_attention(q, cache, meta.decode_block_tables, meta.decode_context_lens)


def warm_up(cache: torch.Tensor, num_heads: int, null_block: int) -> None:
    """Compile, at start-up, the kernel variants an engine's decode steps launch (1-3 s each on a
    GPU, which would otherwise fall on the first decode step).

    Launches both kernels once: one sequence attending one key of ``null_block`` (the pool's
    block that is read and never written) with a contiguous query of ``num_heads`` heads and int64
    indices, as ``attention.build_metadata`` and the CUDA graphs' buffers make them. That is every
    variant a run meets: what changes between steps is not specialized (see "Variants" in the
    module docstring), and ``tests/wings/fast_paths/test_triton_attention.py`` checks a run's launches
    against the warm-up's with Triton's own specialization rules.

    Args:
        cache: one layer of the engine's pool [num_blocks, block_size, 2 * kv_heads, head_dim].
        num_heads: query heads of the attention (this rank's, under tensor parallelism).
        null_block: the pool's null block (``KVCache.null_block``).
    Raises as ``paged_decode_attention``.
    """
    device = cache.device
    q = torch.zeros((1, num_heads, cache.shape[3]), dtype=cache.dtype, device=device)
    tables = torch.full((1, 1), null_block, dtype=torch.long, device=device)
    lens = torch.ones(1, dtype=torch.long, device=device)
    paged_decode_attention(q, cache, tables, lens, num_splits=2)
