"""The paged KV cache: per-layer K and V tensors cut into fixed-size blocks.

Layout, per layer: ``k[layer]`` and ``v[layer]`` are ``[num_blocks, block_size, num_kv_heads,
head_dim]``. A token's K/V row lives at one flat *slot* (``block_id * block_size + offset``);
which blocks a sequence owns is the block manager's business, not this module's.
"""

from __future__ import annotations

import torch

from .config import ModelConfig

GIB = 1024**3


def kv_bytes_per_token(model_config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V that one token occupies across all layers (GQA-aware)."""
    return model_config.kv_bytes_per_token(dtype.itemsize)


def num_blocks_for_budget(model_config: ModelConfig, dtype: torch.dtype, block_size: int,
                          budget_gib: float) -> int:
    """How many blocks of ``block_size`` tokens fit in ``budget_gib`` GiB of KV cache."""
    return int(budget_gib * GIB) // (kv_bytes_per_token(model_config, dtype) * block_size)


class KVCache:
    """K and V for every layer, allocated once. ``k``/``v``: [layers, blocks, block_size, kv_heads, head_dim]."""

    def __init__(self, model_config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (model_config.num_hidden_layers, num_blocks, block_size,
                 model_config.num_key_value_heads, model_config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks = num_blocks
        self.block_size = block_size

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[i], self.v[i]


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store new K/V rows in their slots.

    Args:
        k_cache, v_cache: one layer's cache, [num_blocks, block_size, kv_heads, head_dim].
        k, v: [num_tokens, kv_heads, head_dim] for the tokens of this step.
        slot_mapping: [num_tokens] int64 flat slot of each token.
    """
    kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v)
