"""Paged attention in pure PyTorch: gather each sequence's K/V from its blocks, then SDPA.

It runs everywhere (CPU, any CUDA GPU). The batch of a step is flattened to ``num_tokens`` rows,
decodes first. Decodes are attended together: their K/V are gathered into a padded
``[batch, max_context, kv_heads, head_dim]`` tensor and a mask hides the padding. Prefill
chunks are attended one by one, each over its cached context plus itself, causally.

GQA without copies: a decode query ``[batch, heads, head_dim]`` is viewed as ``[batch, kv_heads,
group, head_dim]`` (query head h reads KV head h // group, as transformers' ``repeat_kv``), so
every KV head meets its ``group`` query heads in one matrix product and K/V are never repeated.

Everything that depends only on the batch (slots, masks) is built once per step in
``AttentionMetadata`` and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    """One sequence's prefill chunk: query rows ``[q_start, q_start + q_len)`` of the batch.

    ``context_slots``: [context_len] cache slots of every key it attends (cached + new tokens).
    ``mask``: [q_len, context_len] bool (True = attend), or None when nothing was cached
    (plain causal attention).
    """

    q_start: int
    q_len: int
    context_slots: torch.Tensor
    mask: torch.Tensor | None


@dataclass
class AttentionMetadata:
    """The batch's layout for attention, shared by every layer of one step.

    Attributes:
        slot_mapping: [num_tokens] int64, the cache slot each new token's K/V is written to.
        num_decodes: the first ``num_decodes`` rows are decodes, one token each.
        decode_slots: [num_decodes, max_context] int64 cache slots of each decode's keys (padded).
        decode_mask: [num_decodes, 1, 1, max_context] bool, False on padding.
        prefills: the prefill chunks, in row order after the decodes.
    """

    slot_mapping: torch.Tensor
    num_decodes: int
    decode_slots: torch.Tensor | None
    decode_mask: torch.Tensor | None
    prefills: list[PrefillChunk]


def build_metadata(slot_mapping: list[int], decode_context_slots: list[list[int]],
                   prefill_chunks: list[tuple[int, list[int]]], device: torch.device) -> AttentionMetadata:
    """Turn per-sequence slot lists into the tensors attention needs.

    Args:
        slot_mapping: flat cache slot of every new token, decodes first.
        decode_context_slots: per decode, the slots of all its keys (its new token last).
        prefill_chunks: per prefill chunk, ``(q_len, slots of all its keys)``; its new tokens
            are the last ``q_len`` keys.
    """
    num_decodes = len(decode_context_slots)
    decode_slots = decode_mask = None
    if num_decodes:
        max_len = max(len(s) for s in decode_context_slots)
        lens = torch.tensor([len(s) for s in decode_context_slots], device=device)
        padded = [s + [0] * (max_len - len(s)) for s in decode_context_slots]
        decode_slots = torch.tensor(padded, dtype=torch.long, device=device)
        decode_mask = (torch.arange(max_len, device=device)[None, :] < lens[:, None])[:, None, None, :]
    prefills, q_start = [], num_decodes
    for q_len, slots in prefill_chunks:
        context_len = len(slots)
        mask = None
        if context_len > q_len:  # cached context before the chunk: causal with an offset
            rows = torch.arange(q_len, device=device)[:, None] + (context_len - q_len)
            mask = torch.arange(context_len, device=device)[None, :] <= rows
        prefills.append(PrefillChunk(q_start, q_len, torch.tensor(slots, dtype=torch.long, device=device), mask))
        q_start += q_len
    return AttentionMetadata(torch.tensor(slot_mapping, dtype=torch.long, device=device),
                             num_decodes, decode_slots, decode_mask, prefills)


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
    k_flat = k_cache.view(-1, kv_heads, head_dim)
    v_flat = v_cache.view(-1, kv_heads, head_dim)
    out = torch.empty_like(q)
    b = meta.num_decodes
    if b:
        qd = q[:b].view(b, kv_heads, num_heads // kv_heads, head_dim)  # [B, kv_heads, group, D]
        k = k_flat[meta.decode_slots].transpose(1, 2)  # [B, kv_heads, max_context, D]
        v = v_flat[meta.decode_slots].transpose(1, 2)
        od = F.scaled_dot_product_attention(qd, k, v, attn_mask=meta.decode_mask)
        out[:b] = od.view(b, num_heads, head_dim)
    group = num_heads // kv_heads
    for chunk in meta.prefills:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        qp = q[rows].transpose(0, 1)  # [heads, q_len, D]
        # K/V repeated per query head: SDPA's fused CPU kernel does not take enable_gqa (the
        # math fallback it would use costs more than the copy).
        k = k_flat[chunk.context_slots].repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, context, D]
        v = v_flat[chunk.context_slots].repeat_interleave(group, dim=1).transpose(0, 1)
        op = F.scaled_dot_product_attention(qp, k, v, attn_mask=chunk.mask, is_causal=chunk.mask is None)
        out[rows] = op.transpose(0, 1)
    return out.view(num_tokens, num_heads * head_dim)
