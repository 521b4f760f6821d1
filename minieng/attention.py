"""Paged attention in pure PyTorch: gather each sequence's K/V blocks, then SDPA.

It runs everywhere (CPU, any CUDA GPU). The batch of a step is flattened to ``num_tokens`` rows,
decodes first. Decodes are attended together: their K/V blocks are gathered (one
``index_select`` over whole blocks per layer, ~3x faster on CPU than indexing single slots)
into a padded ``[batch, max_blocks * block_size, kv_heads, head_dim]`` tensor, and a mask hides
the padding. Prefill chunks are attended one by one, each over its cached context plus itself,
causally.

GQA without copies: a decode query ``[batch, heads, head_dim]`` is viewed as ``[batch, kv_heads,
group, head_dim]`` (query head h reads KV head h // group, as transformers' ``repeat_kv``), so
every KV head meets its ``group`` query heads in one matrix product and K/V are never repeated.

Everything that depends only on the batch (block tables, masks) is built once per step in
``AttentionMetadata`` and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    """One sequence's prefill chunk: query rows ``[q_start, q_start + q_len)`` of the batch.

    ``block_table``: [num_blocks] int64, the blocks holding its keys (cached + new tokens);
    ``context_len``: how many keys it attends; ``mask``: [q_len, context_len] bool (True =
    attend), or None when nothing was cached before the chunk (plain causal attention).
    """

    q_start: int
    q_len: int
    block_table: torch.Tensor
    context_len: int
    mask: torch.Tensor | None


@dataclass
class AttentionMetadata:
    """The batch's layout for attention, shared by every layer of one step.

    Attributes:
        slot_mapping: [num_tokens] int64, the cache slot each new token's K/V is written to.
        num_decodes: the first ``num_decodes`` rows are decodes, one token each.
        decode_block_tables: [num_decodes, max_blocks] int64 (padded with block 0).
        decode_mask: [num_decodes, 1, 1, max_blocks * block_size] bool, False past each context.
        prefills: the prefill chunks, in row order after the decodes.
    """

    slot_mapping: torch.Tensor
    num_decodes: int
    decode_block_tables: torch.Tensor | None
    decode_mask: torch.Tensor | None
    prefills: list[PrefillChunk]


def build_metadata(slot_mapping: list[int], decodes: list[tuple[list[int], int]],
                   prefills: list[tuple[int, list[int], int]], block_size: int,
                   device: torch.device) -> AttentionMetadata:
    """Turn per-sequence block tables into the tensors attention needs.

    Args:
        slot_mapping: flat cache slot of every new token, decodes first.
        decodes: per decode, ``(block_table, context_len)``; its new token is the last key.
        prefills: per prefill chunk, ``(q_len, block_table, context_len)``; its new tokens are
            the last ``q_len`` keys.
    """
    decode_tables = decode_mask = None
    if decodes:
        width = max(len(table) for table, _ in decodes)
        decode_tables = torch.tensor([table + [0] * (width - len(table)) for table, _ in decodes],
                                     dtype=torch.long, device=device)
        lens = torch.tensor([n for _, n in decodes], device=device)
        decode_mask = (torch.arange(width * block_size, device=device)[None, :] < lens[:, None])[:, None, None, :]
    chunks, q_start = [], len(decodes)
    for q_len, table, context_len in prefills:
        mask = None
        if context_len > q_len:  # cached context before the chunk: causal with an offset
            rows = torch.arange(q_len, device=device)[:, None] + (context_len - q_len)
            mask = torch.arange(context_len, device=device)[None, :] <= rows
        chunks.append(PrefillChunk(q_start, q_len, torch.tensor(table, dtype=torch.long, device=device),
                                   context_len, mask))
        q_start += q_len
    return AttentionMetadata(torch.tensor(slot_mapping, dtype=torch.long, device=device),
                             len(decodes), decode_tables, decode_mask, chunks)


def gather_blocks(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """Keys (or values) of the blocks in ``block_table``, in order.

    cache: [num_blocks, block_size, kv_heads, head_dim]; block_table: [..., n] ->
    [..., n * block_size, kv_heads, head_dim].
    """
    blocks = torch.index_select(cache, 0, block_table.reshape(-1))
    return blocks.view(*block_table.shape[:-1], -1, *cache.shape[2:])


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata) -> torch.Tensor:
    """Attention of this step's queries over the cached keys and values.

    Args:
        q: [num_tokens, num_heads, head_dim], RoPE applied.
        k_cache, v_cache: one layer, [num_blocks, block_size, kv_heads, head_dim], with this
            step's K/V already written.
    Returns:
        [num_tokens, num_heads * head_dim].
    """
    num_tokens, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = num_heads // kv_heads
    out = torch.empty_like(q)
    b = meta.num_decodes
    if b:
        qd = q[:b].view(b, kv_heads, group, head_dim)  # [B, kv_heads, group, D]
        k = gather_blocks(k_cache, meta.decode_block_tables).transpose(1, 2)  # [B, kv_heads, max_context, D]
        v = gather_blocks(v_cache, meta.decode_block_tables).transpose(1, 2)
        od = F.scaled_dot_product_attention(qd, k, v, attn_mask=meta.decode_mask)
        out[:b] = od.view(b, num_heads, head_dim)
    for chunk in meta.prefills:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        # SDPA's fused CPU kernel wants 4-D [batch, heads, len, D] and equal head counts: with
        # 3-D inputs or enable_gqa it falls back to the math path, which is much slower than
        # repeating K/V per query head.
        qp = q[rows].transpose(0, 1).unsqueeze(0)  # [1, heads, q_len, D]
        k = gather_blocks(k_cache, chunk.block_table)[: chunk.context_len]
        v = gather_blocks(v_cache, chunk.block_table)[: chunk.context_len]
        k = k.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)  # [1, heads, context, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
        op = F.scaled_dot_product_attention(qp, k, v, attn_mask=chunk.mask, is_causal=chunk.mask is None)
        out[rows] = op[0].transpose(0, 1)
    return out.view(num_tokens, num_heads * head_dim)
