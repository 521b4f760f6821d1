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
from minieng.wings.logprobs import max_logits_rows
from minieng.wings.gpu_memory.memory_plan import MemoryPlan, device_kv_blocks, plan_memory
from minieng.core.kv_cache import KVCache
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
    the largest, under tensor parallelism) and of the pool (none yet when the device sizes it)."""
    sized_by_device = device_sizes_pool(config, device)
    plan_memory(
        model_config,
        dtype,
        0 if sized_by_device else config.num_kv_blocks,
        config.block_size,
        device,
        kv_cache_memory_gib=config.kv_cache_memory_gib or CPU_KV_CACHE_GIB,
        tensor_parallel_size=config.tensor_parallel_size,
    ).check()


def size_kv_pool(config: EngineConfig, models: list, max_model_len: int, matmul_bytes=None) -> KVPool:
    """The pool for ``models`` (the target, then the draft if any: each gets a pool of as many
    blocks), loaded on their device: ``num_kv_blocks``, the blocks ``kv_cache_memory_gib`` holds, or
    what the device's memory leaves (``device_sized_kv_blocks``), and ``max_model_len`` fitted to
    it (``fit_max_model_len``). ``matmul_bytes``: a quantized model's matrix bytes, for the plan.
    Raises ``ValueError`` for a pool that cannot hold one sequence of an asked ``max_model_len``."""
    target = models[0]
    param = next(target.parameters())
    num_blocks = config.num_kv_blocks
    if device_sizes_pool(config, param.device):
        num_blocks = device_sized_kv_blocks(config, models, max_model_len)
    plan = plan_memory(
        target.config,
        param.dtype,
        num_blocks,
        config.block_size,
        param.device,
        matmul_bytes,
        kv_cache_memory_gib=config.kv_cache_memory_gib or CPU_KV_CACHE_GIB,
        tensor_parallel_size=config.tensor_parallel_size,
    )
    return KVPool(plan.num_kv_blocks, fit_max_model_len(config, plan, max_model_len), plan)


def device_sizes_pool(config: EngineConfig, device: torch.device) -> bool:
    """Whether the device's memory sizes the KV pool: CUDA, with neither ``num_kv_blocks`` nor
    ``kv_cache_memory_gib`` given (elsewhere ``CPU_KV_CACHE_GIB`` is the budget)."""
    return device.type == "cuda" and config.num_kv_blocks is None and config.kv_cache_memory_gib is None


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
            max_logits_rows(config.max_num_seqs, config.num_speculative_tokens),
        ),
    )


def fit_max_model_len(config: EngineConfig, plan: MemoryPlan, max_model_len: int) -> int:
    """``max_model_len``, capped (with a warning) to what the pool of ``plan`` holds when it was
    left to default. Raises ``ValueError`` when it was asked for explicitly and does not fit."""
    tokens = plan.kv_tokens
    if tokens >= max_model_len:
        return max_model_len
    need_gib = max_model_len * plan.kv_bytes_per_token / GIB
    advice = (
        f"raise kv_cache_memory_gib to at least {need_gib:.3f} (or num_kv_blocks, or gpu_memory_utilization on a GPU)"
    )
    blocks = f"{plan.num_kv_blocks} blocks of {plan.block_size}"
    if config.max_model_len is not None or plan.num_kv_blocks < 1:
        raise ValueError(
            f"the KV pool holds {tokens} tokens ({blocks}), "
            f"fewer than one sequence of max_model_len={max_model_len}: {advice}, or lower max_model_len"
        )
    warnings.warn(
        f"the KV pool holds {tokens} tokens ({blocks}), fewer "
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
