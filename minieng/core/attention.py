"""Paged attention in pure PyTorch: gather each sequence's K/V blocks, then SDPA. Runs everywhere.

A step is flattened to ``num_tokens`` rows, decodes first. Decodes are attended together: their
blocks are gathered (one ``index_select`` of whole blocks a layer, K and V side by side) into a
padded ``[batch, width * block_size, ...]`` tensor, and a mask hides the padding. Prefill chunks
(and decodes of several tokens) are attended one by one, causally, over their cached context.
GQA without copies: a decode query is viewed as ``[batch, kv_heads, group, head_dim]``.

Masked slots must hold finite values (-inf times NaN is NaN): padded block-table entries point
at the null block and every block is zeroed when allocated (``KVCache``). On CUDA the SDPA
backends are pinned and decode widths padded to powers of two, so new shapes plan nothing, and a
batch whose gathered K/V would exceed ``max_gather_tokens`` is attended in groups. What each
choice measured: docs/architecture.md, "How the core attends".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right


@dataclass
class PrefillChunk:
    """One sequence's multi-token chunk: query rows ``[q_start, q_start + q_len)`` of the batch.

    ``block_table``: [num_blocks] int64, the blocks holding its keys (cached + new tokens);
    ``context_len``: how many keys it attends (its new tokens are the last ``q_len``).
    """

    q_start: int
    q_len: int
    block_table: torch.Tensor
    context_len: int


@dataclass
class AttentionMetadata:
    """The batch's layout for attention, shared by every layer of one step.

    Attributes:
        slot_mapping: [num_tokens] int64, the cache slot each new token's K/V is written to.
        num_decodes: the first ``num_decodes * decode_query_len`` rows are decodes, sequence by
            sequence: ``decode_query_len`` tokens each (1, or k + 1 with k speculative tokens).
        decode_block_tables: [num_decodes, max_blocks] int64, padded with the null block.
        decode_mask: [num_decodes, 1, decode_query_len, max_blocks * block_size] additive, in
            the model's dtype (``decode_mask``); None where ``decode_attention`` attends one query
            (it masks by context length).
        prefills: the multi-token chunks, in row order after the decodes.
        decode_query_len: query tokens per decode sequence.
        decode_group_size: decodes gathered and attended at once; None: all of them. Smaller
            when the whole batch's gathered K/V would exceed the step's gather budget.
        decode_block_ids: ``decode_block_tables`` flattened [num_decodes * max_blocks], once per
            step (every layer gathers through it).
        decode_context_lens: [num_decodes] int64, the keys each decode attends.
        decode_attention: None (gather, then SDPA), or a function ``(q [decodes, heads, head_dim],
            cache, meta) -> [decodes, heads * head_dim]`` that attends one-query decodes another
            way (a fast path's kernel that reads the pool in place).
    """

    slot_mapping: torch.Tensor
    num_decodes: int
    decode_block_tables: torch.Tensor | None
    decode_mask: torch.Tensor | None
    prefills: list[PrefillChunk]
    decode_query_len: int = 1
    decode_group_size: int | None = None
    decode_block_ids: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None
    decode_attention: Callable | None = None

    def __post_init__(self) -> None:
        if self.decode_block_tables is not None and self.decode_block_ids is None:
            self.decode_block_ids = self.decode_block_tables.reshape(-1)


def decode_mask(
    context_lens: torch.Tensor, num_slots: int, query_len: int = 1, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """[batch, 1, query_len, num_slots] additive, in ``dtype`` (the model's): 0 where query i of a
    sequence whose ``query_len`` new tokens end its context of ``context_lens`` tokens sees a slot
    (``0 .. context_len - query_len + i``: causal, aligned to the lower right; with one query, the
    whole context), -inf where it does not.

    Additive once per step: SDPA turns a bool mask into an additive one at every call, a few
    kernels in every layer. Built from a tensor on the device, so a replayed capture recomputes it.
    """
    device = context_lens.device
    limit = context_lens[:, None] - query_len + 1 + torch.arange(query_len, device=device)[None, :]  # [B, q]
    seen = (torch.arange(num_slots, device=device)[None, None, :] < limit[:, :, None])[:, None]
    hidden = torch.full((), float("-inf"), dtype=dtype, device=device)
    return torch.where(seen, torch.zeros((), dtype=dtype, device=device), hidden)


def block_table_tensor(tables: list[list[int]], width: int, null_block: int) -> torch.Tensor:
    """[len(tables), width] int64 on the CPU: each table, padded with ``null_block``.

    A handful of tensor operations whatever the batch (no Python loop over padded rows).
    """
    lens = torch.tensor([len(t) for t in tables], dtype=torch.long)
    out = torch.full((len(tables), width), null_block, dtype=torch.long)
    out[torch.arange(width)[None, :] < lens[:, None]] = torch.tensor([b for t in tables for b in t], dtype=torch.long)
    return out


def decode_group_size(num_decodes: int, width_tokens: int, max_gather_tokens: int | None) -> int | None:
    """Decodes to gather at once so that ``group x width_tokens`` keys stay within
    ``max_gather_tokens`` (at least one sequence); None when the whole batch fits, or no budget."""
    if max_gather_tokens is None or num_decodes * width_tokens <= max_gather_tokens:
        return None
    return max(1, max_gather_tokens // width_tokens)


def build_metadata(
    slot_mapping: list[int],
    decodes: list[tuple[list[int], int]],
    prefills: list[tuple[int, list[int], int]],
    block_size: int,
    null_block: int,
    device: torch.device,
    decode_query_len: int = 1,
    max_gather_tokens: int | None = None,
    min_width: int = 1,
    dtype: torch.dtype = torch.float32,
    decode_attention: Callable | None = None,
) -> AttentionMetadata:
    """Turn per-sequence block tables into the tensors attention needs.

    Args:
        slot_mapping: flat cache slot of every new token, decodes first.
        decodes: per decode, ``(block_table, context_len)``; its ``decode_query_len`` new tokens
            are the last keys.
        prefills: per prefill chunk, ``(q_len, block_table, context_len)``; its new tokens are
            the last ``q_len`` keys.
        null_block: the block that pads decode block tables (``KVCache.null_block``).
        max_gather_tokens: the most keys (per layer, K and V each) the decodes may gather at
            once; None: no limit.
        min_width: the narrowest decode block table, in blocks (padding is masked).
        dtype: the model's, for the decodes' additive mask.
        decode_attention: ``AttentionMetadata.decode_attention`` (no mask is built for its queries).
    """
    decode_tables = mask = group = None
    if decodes:
        width = max(min_width, *(len(table) for table, _ in decodes))
        if device.type == "cuda":  # fewer distinct shapes for the attention kernels (padding is masked)
            width = 1 << (width - 1).bit_length()
        decode_tables = block_table_tensor([t for t, _ in decodes], width, null_block).to(device)
        lens = torch.tensor([n for _, n in decodes], device=device)
        if decode_attention is None or decode_query_len > 1:  # it masks by context length itself
            mask = decode_mask(lens, width * block_size, decode_query_len, dtype)
        group = decode_group_size(len(decodes), width * block_size, max_gather_tokens)
    chunks, q_start = [], len(decodes) * decode_query_len
    for q_len, table, context_len in prefills:
        chunks.append(PrefillChunk(q_start, q_len, torch.tensor(table, dtype=torch.long, device=device), context_len))
        q_start += q_len
    return AttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=device),
        num_decodes=len(decodes),
        decode_block_tables=decode_tables,
        decode_mask=mask,
        prefills=chunks,
        decode_query_len=decode_query_len,
        decode_group_size=group,
        decode_context_lens=lens if decodes else None,
        decode_attention=decode_attention,
    )


def sdpa_backends(device: torch.device):
    """A context that pins SDPA to backends without per-shape planning on CUDA; a no-op elsewhere.

    Flash first (bf16/fp16, no mask), then memory-efficient (masks, ``causal_lower_right``, fp32),
    then the math path as the last resort (e.g. a head_dim the fused kernels refuse).
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def offset_causal_mask(q_len: int, context_len: int, device: torch.device):
    """The mask of a chunk of ``q_len`` queries that are the last of ``context_len`` keys: query i
    sees keys ``0 .. context_len - q_len + i``.

    On CUDA, torch's ``causal_lower_right`` bias: SDPA runs it in the flash kernel (bf16/fp16) or
    the memory-efficient one (fp32), without materializing a mask or planning per shape. Elsewhere a [q_len, context_len] bool
    tensor: the CPU kernels materialize the bias anyway, and a tensor subclass cannot be created
    under a dispatch mode such as ``FlopCounterMode``, which the FLOP cross-checks run on a CPU.
    """
    if device.type == "cuda":
        return causal_lower_right(q_len, context_len)
    rows = torch.arange(q_len, device=device)[:, None] + (context_len - q_len)
    return torch.arange(context_len, device=device)[None, :] <= rows


def gather_blocks(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """Keys and values of the blocks in ``block_table`` [n], in order.

    cache: one layer's pool [num_blocks, block_size, 2 * kv_heads, head_dim] -> [n * block_size,
    2 * kv_heads, head_dim], K heads first.
    """
    return torch.index_select(cache, 0, block_table).view(-1, *cache.shape[2:])


def gather_decode_kv(cache: torch.Tensor, block_ids: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V of ``batch`` decodes in one gather: ``block_ids`` [batch * width] (their block
    tables, flattened) -> k, v [batch, kv_heads, width * block_size, head_dim] each (views)."""
    kv = torch.index_select(cache, 0, block_ids).view(batch, -1, *cache.shape[2:]).transpose(1, 2)
    return kv.split(cache.shape[2] // 2, dim=1)


def _decode_attention(
    qd: torch.Tensor, cache: torch.Tensor, block_ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Decodes' queries qd [B, kv_heads, rows, D] over the K/V of their blocks ``block_ids``
    [B * width]; ``mask`` [B, 1, rows, width * block_size]."""
    k, v = gather_decode_kv(cache, block_ids, qd.shape[0])
    return F.scaled_dot_product_attention(qd, k, v, attn_mask=mask)


def paged_attention(q: torch.Tensor, cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """Attention of this step's queries over the cached keys and values.

    Args:
        q: [num_tokens, num_heads, head_dim / 2, 2], RoPE applied (``llama.apply_rope``'s pairs:
            a view of [num_tokens, num_heads, head_dim]).
        cache: one layer's pool [num_blocks, block_size, 2 * kv_heads, head_dim] (K heads, then
            V heads), with this step's K/V already written.
    Returns:
        [num_tokens, num_heads * head_dim].
    """
    num_tokens, num_heads = q.shape[:2]
    kv_heads, head_dim = cache.shape[2] // 2, cache.shape[3]
    group = num_heads // kv_heads
    b, n = meta.num_decodes, meta.decode_query_len
    decoded = None
    if b:
        qd = q if b * n == num_tokens else q[: b * n]
        if n == 1:  # [B, heads, D] -> [B, kv_heads, group, D]: each KV head meets its group (a view)
            qd = qd.view(b, kv_heads, group, head_dim)
        else:  # rows sequence by sequence -> [B, kv_heads, group * n, D], group-major
            qd = qd.reshape(b, n, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, -1, head_dim)
        mask = meta.decode_mask  # [B, 1, n, L]: rows of query position; one per (head, position) below
        if n > 1 and group > 1:
            mask = mask.repeat(1, 1, group, 1)  # [B, 1, group * n, L], group-major as qd
        g, ids = meta.decode_group_size, meta.decode_block_ids
        if meta.decode_attention is not None and n == 1:  # K/V read another way: no gather, no budget
            od = meta.decode_attention(qd.view(b, num_heads, head_dim), cache, meta)
        elif g is None:
            od = _decode_attention(qd, cache, ids, mask)  # [B, kv_heads, group * n, D]
        else:  # the batch's gathered K/V would exceed the step's budget: g sequences at a time
            width = ids.shape[0] // b
            od = torch.cat(
                [
                    _decode_attention(qd[i : i + g], cache, ids[i * width : (i + g) * width], mask[i : i + g])
                    for i in range(0, b, g)
                ]
            )
        # reshape, not view: some backends (fp32 on CUDA) return a non-contiguous output.
        if n == 1:
            decoded = od.reshape(b, num_heads * head_dim)
        else:
            decoded = (
                od.reshape(b, kv_heads, group, n, head_dim).permute(0, 3, 1, 2, 4).reshape(b * n, num_heads * head_dim)
            )
        if not meta.prefills:  # a decode-only step: no output buffer to fill
            return decoded
    q = q.reshape(num_tokens, num_heads, head_dim)
    out = torch.empty_like(q)
    if decoded is not None:
        out[: b * n] = decoded.view(b * n, num_heads, head_dim)
    for chunk in meta.prefills:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        # SDPA's fused CPU kernel wants 4-D [batch, heads, len, D] and equal head counts: with
        # 3-D inputs or enable_gqa it falls back to the math path, which is much slower than
        # repeating K/V per query head.
        qp = q[rows].transpose(0, 1).unsqueeze(0)  # [1, heads, q_len, D]
        k, v = gather_blocks(cache, chunk.block_table)[: chunk.context_len].split(kv_heads, dim=1)
        k = k.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)  # [1, heads, context, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
        if chunk.context_len == chunk.q_len:  # nothing cached before the chunk: plain causal
            op = F.scaled_dot_product_attention(qp, k, v, is_causal=True)
        else:  # causal with an offset: query i sees keys up to context_len - q_len + i
            mask = offset_causal_mask(chunk.q_len, chunk.context_len, q.device)
            op = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask)
        out[rows] = op[0].transpose(0, 1)
    return out.view(num_tokens, num_heads * head_dim)
