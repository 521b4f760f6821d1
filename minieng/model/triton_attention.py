"""Paged attention for decode as one Triton kernel: K/V read where they lie in the pool, no gather.

The reference path (``attention.paged_attention``) first gathers each decode's K/V blocks into a
padded ``[batch, kv_heads, width * block_size, head_dim]`` copy and then runs SDPA over it with a
mask. That copy is as large as the keys and values it attends, is written once and read once,
and grows with the batch's longest context: at long contexts it doubles the bytes a memory-bound
decode moves. PagedAttention (Kwon et al., "Efficient Memory Management for Large Language Model
Serving with PagedAttention", SOSP 2023, the vLLM paper) reads the blocks in place instead: the
kernel is handed the block table and turns each key position into its slot itself.

One program attends one sequence and one KV head (grid ``(batch, kv_heads)``): it loads the
``group = num_heads // kv_heads`` query heads that share that KV head as one ``[BLOCK_H,
head_dim]`` tile (padded to at least 16 rows, the smallest ``tl.dot``), then walks the sequence's
keys ``BLOCK_N`` positions at a time. Position ``n`` lies in block ``block_table[n // block_size]``
at offset ``n % block_size``, so the program loads those ids from the table row and reads K (and
later V) straight from ``cache[block, offset, kv_head]``. Positions at or past ``context_len`` are
masked in the loads themselves: the block table's padding, the null block, and the tails of
partly filled blocks are never read, so whatever they hold (even NaN) cannot reach the output.
Grouping the query heads per KV head (rather than a ``(batch, num_heads)`` grid) reads each K/V
tile once for its whole group, as the reference's GQA view does, and makes the score a matrix
product that runs on tensor cores.

The softmax is computed online, as in FlashAttention (Dao et al., NeurIPS 2022; Milakov and
Gimelshein, "Online normalizer calculation for softmax", 2018): the program keeps, per query
head, the running maximum score ``m``, the running sum ``l`` of ``exp(score - m)`` and the
unnormalised output ``acc``. A new tile of scores ``s`` raises the maximum to ``m' = max(m,
max(s))``, rescales the old sums by ``exp(m - m')``, and adds ``exp(s - m')`` and its product
with V; after the last tile the output is ``acc / l``. Scores never exist for the whole context
at once, only one tile in registers, and everything is accumulated in fp32 (exponentials as
``exp2`` with the scale folded into ``log2(e) / sqrt(head_dim)``).

vLLM's Triton decode kernels (``triton_decode_attention.py``, from LightLLM and SGLang) work the
same way and also split long contexts over several programs per sequence (flash-decoding), which
fills a large GPU at small batch; this kernel does not (one program per sequence and KV head).

Under Triton's interpreter the kernel runs on CPU tensors through NumPy. ``TRITON_INTERPRET=1``
must be set before triton is first imported: triton 3.9 reads it whenever ``@triton.jit`` decorates
a function, and triton's own library (``tl.sum``, ``tl.max``, ``tl.zeros``, ...) is decorated when
triton is imported, so a kernel decorated later under the interpreter still fails inside them.
With triton installed, importing ``torch._dynamo`` imports triton too. ``INTERPRETED`` says
whether both this kernel and triton's library run interpreted. The
interpreter multiplies bf16 tiles as their raw uint16 bits (``tl.dot`` of two bf16 tensors is
garbage there), so the wrapper asks the kernel to upcast its dot operands to fp32 for bf16 when
interpreted (``DOT_FP32``); and it casts fp32 to bf16 by truncating the mantissa, where a GPU
rounds to nearest, so an interpreted bf16 output is stored in fp32 and rounded by torch. fp16 and
fp32 run as they do on a GPU, where the kernel always reads and writes the pool's dtype.
"""

from __future__ import annotations

import math

import torch

try:  # triton is optional: without it the module imports and TRITON_AVAILABLE is False
    import triton
    import triton.language as tl

    TRITON_AVAILABLE = True
except ImportError:
    triton = tl = None
    TRITON_AVAILABLE = False

# Key positions one program attends per step of its loop (any block size works: ids are looked up
# per position). 64 keys x 128 dims of fp16 K or V is 16 KiB; fp32 takes 32 keys for the same
# bytes. With two pipeline stages K and V hold 64 KiB of shared memory, within what an sm_86/89
# GPU (~100 KiB) offers. Sizes chosen on paper, not tuned on a GPU.
BLOCK_N = {torch.float16: 64, torch.bfloat16: 64, torch.float32: 32}
NUM_STAGES = 2
NUM_WARPS = 4
# The smallest M of tl.dot on NVIDIA GPUs: a group of fewer query heads is padded to it.
MIN_DOT_ROWS = 16

if TRITON_AVAILABLE:

    @triton.jit
    def _paged_decode_kernel(
        q_ptr,
        cache_ptr,
        block_tables_ptr,
        context_lens_ptr,
        out_ptr,
        stride_qb,
        stride_qh,
        stride_qd,
        stride_cb,
        stride_cs,
        stride_ch,
        stride_cd,
        stride_tb,
        stride_tn,
        stride_ob,
        stride_oh,
        stride_od,
        qk_scale,  # softmax scale x log2(e): scores are exponentiated with exp2
        max_blocks,  # block table width: positions past max_blocks * BLOCK_SIZE are never read
        KV_HEADS: tl.constexpr,
        GROUP: tl.constexpr,  # query heads per KV head
        BLOCK_SIZE: tl.constexpr,  # tokens per pool block
        HEAD_DIM: tl.constexpr,
        BLOCK_H: tl.constexpr,  # GROUP padded to a power of two >= 16
        BLOCK_N: tl.constexpr,
        DOT_FP32: tl.constexpr,  # upcast dot operands to fp32 (the interpreter's bf16 dot is wrong)
        DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 pools (no TF32 rounding), else "tf32" (the default)
    ):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
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

        context_len = tl.minimum(tl.load(context_lens_ptr + seq), max_blocks * BLOCK_SIZE)
        table_row = block_tables_ptr + seq * stride_tb
        k_base = cache_ptr + kv_head * stride_ch  # a token's K heads come first ...
        v_base = cache_ptr + (KV_HEADS + kv_head) * stride_ch  # ... then its V heads

        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of the (log2-scaled) scores
        l_i = tl.zeros([BLOCK_H], tl.float32)  # running sum of exp2(score - m_i)
        acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)  # running sum of exp2(score - m_i) * v

        for start in range(0, context_len, BLOCK_N):
            pos = start + offs_n
            valid = pos < context_len
            # Where each key lies: its block's id from the table, its offset in the block.
            block = tl.load(table_row + (pos // BLOCK_SIZE) * stride_tn, mask=valid, other=0).to(tl.int64)
            slot = block * stride_cb + (pos % BLOCK_SIZE) * stride_cs  # [BLOCK_N] element offsets
            kv_offs = slot[:, None] + offs_d[None, :] * stride_cd  # [BLOCK_N, HEAD_DIM]

            k = tl.load(k_base + kv_offs, mask=valid[:, None], other=0.0)
            if DOT_FP32:
                k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_H, BLOCK_N]
            s = tl.where(valid[None, :], s, float("-inf"))

            # Online softmax: the first tile always holds a valid key, so m_new is finite and
            # alpha = exp2(-inf - m_new) = 0 wipes the (empty) initial sums.
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)

            v = tl.load(v_base + kv_offs, mask=valid[:, None], other=0.0)
            if DOT_FP32:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        # A context of 0 keys (a padded row) never enters the loop: zeros, not 0 / 0.
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=head_ok[:, None],
        )

    try:  # the interpreter's function class, to tell how the kernel and triton's library were decorated
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - a triton without an interpreter
        InterpretedFunction = ()
    # tl.sum is one of triton's own @triton.jit helpers, decorated when triton was first imported.
    INTERPRETED = isinstance(_paged_decode_kernel, InterpretedFunction) and isinstance(tl.sum, InterpretedFunction)
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


def paged_decode_attention(
    q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor
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

    Returns:
        [batch, num_heads, head_dim] contiguous, q's dtype: ``softmax(q k^T / sqrt(head_dim)) v`` per
        sequence and head, accumulated in fp32.

    Raises:
        ValueError: a tensor of the wrong rank or shape, q and cache of different dtypes or not a
            float type, index tensors not int32/int64, tensors on different devices, num_heads
            not a multiple of kv_heads, or head_dim not a power of two >= 16.
        RuntimeError: triton is not installed, or the tensors are on the CPU and triton does not
            run interpreted (``INTERPRETED``: set ``TRITON_INTERPRET=1`` before triton is first
            imported).
    """
    if not TRITON_AVAILABLE:
        raise RuntimeError("paged_decode_attention needs triton (pip install triton)")
    _check_inputs(q, cache, block_tables, context_lens)
    if q.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "CPU tensors run only under Triton's interpreter: set TRITON_INTERPRET=1 before triton is "
            "first imported (importing torch._dynamo imports it)"
        )
    batch, num_heads, head_dim = q.shape
    block_size, kv_heads = cache.shape[1], cache.shape[2] // 2
    group = num_heads // kv_heads
    # The interpreter casts fp32 to bf16 by truncation (a GPU rounds to nearest): interpreted, a bf16
    # output is written in fp32 and rounded by torch.
    round_in_torch = INTERPRETED and q.dtype == torch.bfloat16
    out = torch.empty((batch, num_heads, head_dim), dtype=torch.float32 if round_in_torch else q.dtype, device=q.device)
    if batch == 0:
        return out.to(q.dtype)
    _paged_decode_kernel[(batch, kv_heads)](
        q,
        cache,
        block_tables,
        context_lens,
        out,
        *q.stride(),
        *cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        math.log2(math.e) / math.sqrt(head_dim),
        block_tables.shape[1],
        KV_HEADS=kv_heads,
        GROUP=group,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_H=max(MIN_DOT_ROWS, triton.next_power_of_2(group)),
        BLOCK_N=BLOCK_N[q.dtype],
        DOT_FP32=INTERPRETED and q.dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    return out.to(q.dtype)
