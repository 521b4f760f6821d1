"""The compiled CPU decode step: a plain decode step as one function of tensors, for ``torch.compile`` to take whole.

``LlamaForCausalLM.forward`` takes ``AttentionMetadata``, whose prefill chunks are Python lists,
and attends batches the compiler should not see (chunked prefills, groups of decodes, drafts).
A step of one query per sequence needs far less: the token ids, their RoPE table, the slots its
K/V go to, the block tables and the mask. ``decode_forward`` is that step, embedding to logits,
over those tensors only, so it compiles as one graph whose guards are checked once a step
(compiled per layer region, the same work pays that check and the call's wrapper 60 times a step
in a 30-layer model, which cost the default model's step more than the fusion saved).

Attention stays opaque to the compiler, as in vLLM's piecewise compilation: ``paged_decode``
(the K/V write and the decodes' gather-and-SDPA of ``attention.py``) is an operator of its own
that mutates the pool (``opaque_ops``: the compiler sees only its output's shape). Everything
around it (norms, RoPE, residuals, SiLU, a quantized layer's activation scales) is
fused by the compiler; the matrix products are ``llama.linear``'s and the quantized kernels'.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minieng.core.attention import gather_decode_kv
from minieng.core.kv_cache import LayerKV, write_kv
from minieng.core.llama import LlamaForCausalLM
from minieng.wings.fast_paths.opaque_ops import opaque_op


def _paged_decode(q, kv, pool, layer, slot_mapping, block_tables, mask):
    """Layer ``layer``'s attention for ``batch`` decodes of one query each.

    Writes ``kv`` [batch, 2 * kv_heads, head_dim / 2, 2] (RoPE applied to K, ``apply_rope``'s
    pairs) into the slots ``slot_mapping`` [batch] of ``pool`` [layers, blocks, block_size,
    2 * kv_heads, head_dim], then attends ``q`` [batch, heads, head_dim / 2, 2] over the blocks
    of ``block_tables`` [batch, width] under ``mask`` [batch, 1, 1, width * block_size] (additive
    float, or bool). Returns [batch, heads * head_dim].
    """
    layer_kv = LayerKV(pool[layer])  # views of [blocks, block_size, 2 * kv_heads, head_dim]
    write_kv(layer_kv, kv, slot_mapping)
    return plain_decode_attention(q, layer_kv.blocks, block_tables.view(-1), mask)


def plain_decode_attention(
    q: torch.Tensor, cache: torch.Tensor, block_ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``attention.paged_attention``'s plain decode case as a function of tensors alone: q [batch,
    heads, head_dim / 2, 2] over one layer's ``cache`` [num_blocks, block_size, 2 * kv_heads,
    head_dim] at the blocks ``block_ids`` [batch * width], under ``mask`` [batch, 1, 1, width *
    block_size]. Returns [batch, heads * head_dim]."""
    batch, heads = q.shape[:2]
    kv_heads, head_dim = cache.shape[2] // 2, cache.shape[3]
    qd = q.view(batch, kv_heads, heads // kv_heads, head_dim)  # GQA as a view, as paged_attention
    k, v = gather_decode_kv(cache, block_ids, batch)
    return F.scaled_dot_product_attention(qd, k, v, attn_mask=mask).reshape(batch, heads * head_dim)


def _paged_decode_fake(q, kv, pool, layer, slot_mapping, block_tables, mask):
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2] * q.shape[3])


paged_decode = opaque_op(
    "paged_decode(Tensor q, Tensor kv, Tensor(a!) pool, int layer, Tensor slot_mapping, Tensor block_tables, "
    "Tensor mask) -> Tensor",
    _paged_decode,
    _paged_decode_fake,
)


def decode_forward(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,
    rope: torch.Tensor,
    pool: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """One decode step of ``batch`` sequences, one token each: logits [batch, vocab] float32.

    Args:
        input_ids: [batch] int64, each sequence's newest token.
        rope: [batch, q + k + v heads, head_dim / 2, 2], ``view_as_real`` of
            ``RotaryEmbedding.tables`` at the tokens' positions.
        pool: the KV cache's tensor (``KVCache.kv``), written in place.
        slot_mapping, block_tables: as ``paged_decode`` takes them; mask: additive
            [batch, 1, 1, width * block_size] in the model's dtype (``attention.decode_mask``).
    The same arithmetic as ``LlamaForCausalLM.forward`` on a decode step of one rank.
    """
    x = model.embed_tokens(input_ids)  # [batch, hidden]
    for i, layer in enumerate(model.layers):
        q, kv = layer.before_attention(x, rope)
        x = layer.after_attention(x, paged_decode(q, kv, pool, i, slot_mapping, block_tables, mask))
    return model.lm_head(model.norm(x)).float()
