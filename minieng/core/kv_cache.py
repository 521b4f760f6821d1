"""The paged KV cache: per-layer K and V tensors cut into fixed-size blocks.

Layout: one tensor ``kv`` of ``[layers, num_blocks + 2, block_size, 2 * num_kv_heads, head_dim]``,
a token's K heads then its V heads side by side, so that a layer writes a step's K and V with one
``index_copy_`` and a decode gathers them with one ``index_select`` (vLLM keeps K and V of a block
together too). ``k`` and ``v`` are views of its two halves. A token's K/V row lives at one flat
*slot* (``block_id * block_size + offset``); which blocks a sequence owns is the block manager's
business, not this module's.

Two extra blocks are never handed to a sequence, one read and never written, one written and
never read:

- the *null block* (index ``num_blocks``): padded block-table entries point at it, so every
  padded key a mask hides reads zeros from it. Nothing writes it.
- the *scratch block* (index ``num_blocks + 1``): padded rows of a CUDA-graph batch write their
  K/V there (``scratch_slot``), and no block table points at it. Whatever padding computes (in
  fp16, a NaN from a garbage row is possible) lands where no one reads it.

Every slot a mask hides must hold a finite value (a masked score is -inf, but 0 x NaN is NaN):
the pool starts zeroed, the null block stays so, and the model runner zeroes each block when it
is allocated (``zero_blocks``), so neither a freshly allocated pool, stale values of a freed
block, nor a padding row's output can leak into attention.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minieng.config import ModelConfig
from minieng.units import GIB


def kv_bytes_per_token(model_config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V that one token occupies across all layers (GQA-aware)."""
    return model_config.kv_bytes_per_token(dtype.itemsize)


def num_blocks_for_budget(model_config: ModelConfig, dtype: torch.dtype, block_size: int, budget_gib: float) -> int:
    """How many blocks of ``block_size`` tokens fit in ``budget_gib`` GiB of KV cache."""
    return int(budget_gib * GIB) // (kv_bytes_per_token(model_config, dtype) * block_size)


class LayerKV:
    """One layer's views of the pool, made once: ``blocks`` [num_blocks + 2, block_size,
    2 * kv_heads, head_dim] to gather whole blocks, ``slots`` [slots, 2 * kv_heads, head_dim // 2, 2]
    to write rows in the pair layout ``llama.apply_rope`` returns (head_dim's values as RoPE's
    rotated pairs)."""

    __slots__ = ("blocks", "slots")

    def __init__(self, blocks: torch.Tensor):
        self.blocks = blocks
        self.slots = blocks.view(-1, blocks.shape[2], blocks.shape[3] // 2, 2)


class KVCache:
    """K and V for every layer, allocated once.

    ``kv``: [layers, num_blocks + 2, block_size, 2 * kv_heads, head_dim], K heads first; ``k`` and
    ``v`` are its halves, each [layers, num_blocks + 2, block_size, kv_heads, head_dim]. The last
    two blocks, outside the ``num_blocks`` the block manager hands out, are the null block
    (padding reads) and the scratch block (padding writes).
    """

    def __init__(
        self,
        model_config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        kv_heads = model_config.num_key_value_heads
        shape = (model_config.num_hidden_layers, num_blocks + 2, block_size, 2 * kv_heads, model_config.head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.k, self.v = self.kv[..., :kv_heads, :], self.kv[..., kv_heads:, :]
        # Each layer's views, made once: indexing kv[i] anew costs a dispatch per layer and step.
        self.layers = [LayerKV(blocks) for blocks in self.kv.unbind(0)]
        self.num_blocks = num_blocks
        self.block_size = block_size

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int) -> KVCache:
        """A pool for ``model``'s layers, of the KV heads they hold, in its dtype, on its device."""
        attn, weight = model.layers[0].self_attn, model.embed_tokens.weight
        shape = replace(model.config, num_key_value_heads=attn.num_kv_heads, num_attention_heads=attn.num_heads)
        return cls(shape, num_blocks, block_size, weight.dtype, weight.device)

    @property
    def null_block(self) -> int:
        """The block padded block-table entries point at: all zeros, never allocated, never written."""
        return self.num_blocks

    @property
    def scratch_block(self) -> int:
        """The block padded rows write into: never allocated, never in a block table."""
        return self.num_blocks + 1

    @property
    def scratch_slot(self) -> int:
        """The slot where every padded row writes its K/V (the scratch block's first)."""
        return self.scratch_block * self.block_size

    def zero_blocks(self, blocks: list[int]) -> None:
        """Zero the K/V of ``blocks`` in every layer (blocks just allocated: stale or
        uninitialised values must not reach a masked product)."""
        if blocks:
            self.kv.index_fill_(1, torch.tensor(blocks, dtype=torch.long, device=self.kv.device), 0)

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes


def write_kv(layer: LayerKV, kv: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store a step's new K/V rows in their slots, K and V in one op.

    Args:
        layer: one layer's views of the pool.
        kv: [num_tokens, 2 * kv_heads, head_dim // 2, 2], each token's K heads then V heads (RoPE
            applied to K), in ``apply_rope``'s pair layout.
        slot_mapping: [num_tokens] int64 flat slot of each token.
    """
    layer.slots.index_copy_(0, slot_mapping, kv)
