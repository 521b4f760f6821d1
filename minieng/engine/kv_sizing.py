"""How many blocks the KV pool gets, and how long a sequence may then be.

The pool is sized one of three ways: ``num_kv_blocks`` exactly; ``kv_cache_memory_gib`` (1 GiB on
a CPU when neither is given); or, on CUDA with neither given, from the device's memory after the
model is loaded (``memory_plan.device_kv_blocks``, vLLM's ``gpu_memory_utilization`` rule), less
a scratch for the decode step's gathered K/V (``GATHER_SCRATCH_FRACTION``). A ``max_model_len``
left to default is then capped to what the pool holds.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from minieng.config import EngineConfig, ModelConfig
from minieng.engine.memory_plan import MemoryPlan, device_kv_blocks, plan_memory
from minieng.model.kv_cache import KVCache, kv_bytes_per_token, num_blocks_for_budget
from minieng.model.parallel import shard_config
from minieng.units import GIB, cdiv

CPU_KV_CACHE_GIB = 1.0  # the KV budget when none is given and the device is not CUDA
# The share of the GPU's memory kept out of the KV pool for the decode step's gathered K/V (one
# layer's, K and V: ``gather_budget_tokens``), captured or eager. A bucket gathers at most half of
# it (wider buckets are not captured), so its eager warm-up before the capture fits beside it; an
# eager step whose batch would gather more is attended in groups (``attention.decode_group_size``).
GATHER_SCRATCH_FRACTION = 0.02


@dataclass(frozen=True)
class KVPool:
    """The engine's KV pool: ``num_blocks`` blocks, the ``max_model_len`` it serves, and the
    memory ``plan`` of the weights and the pool together."""

    num_blocks: int
    max_model_len: int
    plan: MemoryPlan


def check_fits_before_loading(
    config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> None:
    """Refuse, with advice, a model and a configured pool that cannot fit (``MemoryPlan.check``:
    ``ValueError``), before anything is allocated: this process's share of the model (rank 0's,
    the largest, under tensor parallelism) and of the pool."""
    rank_config = shard_config(model_config, config.tensor_parallel_size)
    num_blocks = configured_kv_blocks(config, rank_config, dtype, device) or 0
    plan_memory(rank_config, dtype, num_blocks, config.block_size, device).check()


def size_kv_pool(config: EngineConfig, models: list, max_model_len: int, matmul_bytes=None) -> KVPool:
    """The pool for ``models`` (the target, then the draft if any: each gets a pool of as many
    blocks), loaded on their device: configured (``configured_kv_blocks``) or sized from the
    device's memory (``device_sized_kv_blocks``), and ``max_model_len`` fitted to it
    (``fit_max_model_len``). ``matmul_bytes``: a quantized model's matrix bytes, for the plan.
    Raises ``ValueError`` for a pool that cannot hold one sequence of an asked ``max_model_len``."""
    target = models[0]
    param = next(target.parameters())
    rank_config = target.local_config  # this rank's shape: under tensor parallelism, rank 0's share (the largest)
    num_blocks = configured_kv_blocks(config, rank_config, param.dtype, param.device)
    if num_blocks is None:  # CUDA with no budget given: what the device's memory leaves
        num_blocks = device_sized_kv_blocks(config, models, max_model_len)
    max_model_len = fit_max_model_len(config, rank_config, param.dtype, max_model_len, num_blocks)
    plan = plan_memory(rank_config, param.dtype, num_blocks, config.block_size, param.device, matmul_bytes)
    return KVPool(num_blocks, max_model_len, plan)


def configured_kv_blocks(
    config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> int | None:
    """The pool's blocks from the config alone, or None when the device must size it (CUDA, no budget)."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if config.kv_cache_memory_gib is None and device.type == "cuda":
        return None
    return num_blocks_for_budget(model_config, dtype, config.block_size, config.kv_cache_memory_gib or CPU_KV_CACHE_GIB)


def device_sized_kv_blocks(config: EngineConfig, models: list, max_model_len: int) -> int:
    """Blocks for ``models``' pools on their CUDA device, never more than ``max_num_seqs``
    sequences of ``max_model_len`` tokens use: a larger pool would only keep more prefix-cache
    blocks, and would leave no room for a second engine (notebooks compare engines side by side)."""
    useful = config.max_num_seqs * cdiv(max_model_len, config.block_size)
    # Eager steps gather too (within ``gather_budget_tokens``): the scratch is kept with or without graphs.
    return min(
        useful,
        device_kv_blocks(
            models,
            config.max_num_batched_tokens,
            config.block_size,
            config.gpu_memory_utilization,
            GATHER_SCRATCH_FRACTION,
        ),
    )


def fit_max_model_len(
    config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype, max_model_len: int, num_blocks: int
) -> int:
    """``max_model_len``, capped (with a warning) to what a pool of ``num_blocks`` holds when it
    was left to default. Raises ``ValueError`` when it was asked for explicitly and does not fit."""
    tokens = num_blocks * config.block_size
    if tokens >= max_model_len:
        return max_model_len
    need_gib = max_model_len * kv_bytes_per_token(model_config, dtype) / GIB
    advice = (
        f"raise kv_cache_memory_gib to at least {need_gib:.3f} (or num_kv_blocks, or gpu_memory_utilization on a GPU)"
    )
    if config.max_model_len is not None or num_blocks < 1:
        raise ValueError(
            f"the KV pool holds {tokens} tokens ({num_blocks} blocks of {config.block_size}), "
            f"fewer than one sequence of max_model_len={max_model_len}: {advice}, or lower max_model_len"
        )
    warnings.warn(
        f"the KV pool holds {tokens} tokens ({num_blocks} blocks of {config.block_size}), fewer "
        f"than the model's context of {max_model_len}: max_model_len is capped to {tokens}. "
        f"For longer sequences, {advice}.",
        stacklevel=4,
    )
    return tokens


def gather_budget_tokens(kv_cache: KVCache) -> int | None:
    """The most keys a decode step may gather per layer (K and V each) on ``kv_cache``'s device:
    None on a CPU (host memory, no plan); on CUDA, ``gather_budget_for`` of the device's memory."""
    if kv_cache.k.device.type != "cuda":
        return None
    per_layer_token_bytes = kv_cache.k[0, 0, 0].nbytes * 2  # K and V of one token in one layer
    total = torch.cuda.get_device_properties(kv_cache.k.device).total_memory
    return gather_budget_for(total, per_layer_token_bytes, kv_cache.num_blocks * kv_cache.block_size)


def gather_budget_for(total_bytes: int, per_layer_token_bytes: int, pool_tokens: int) -> int:
    """Keys (per layer) a decode step may gather on a device of ``total_bytes``: half of the
    scratch kept out of the KV pool (``GATHER_SCRATCH_FRACTION``), and never more than the pool
    holds. Half: a graph's capture runs its forward once eagerly beside the pool of the graphs
    already captured."""
    return min(pool_tokens, int(GATHER_SCRATCH_FRACTION * total_bytes) // (2 * per_layer_token_bytes))
