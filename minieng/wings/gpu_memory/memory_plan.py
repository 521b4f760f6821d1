"""Will it fit? Weights and KV cache against GPU memory and host RAM, before anything is loaded.

Weights: parameters x dtype bytes; a quantized model's matrices count the bytes their kernels
keep (codes and scales, ``quantization.matmul_bytes``), and its LM head is a copy beside the
embedding table even when the two are tied. KV cache: ``ModelConfig.kv_bytes_per_token`` (2 x layers x
KV heads x head_dim x dtype bytes; GQA-aware) x the pool's tokens (blocks x block_size).
Loading passes through host RAM: minieng streams checkpoint tensors one at a time, so a GPU load
needs little RAM, but a GGUF conversion or a CPU run holds the whole model there (Colab's free
tier has ~12 GiB of RAM). ``check`` refuses with concrete advice instead of running out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minieng import device as host  # host.host_memory_bytes, read at call time (tests patch it)
from minieng.config import EngineConfig, ModelConfig, SamplingParams
from minieng.wings.logprobs import ROWS_AT_ONCE, gather_logprobs
from minieng.core.sampling import KeyedRandom, sample
from minieng.core.kv_cache import num_blocks_for_budget
from minieng.core.model_runner import throwaway_forward
from minieng.wings.parallel.tensor_parallel import shard_config
from minieng.model.weight_bytes import MatmulBytes, weight_bytes
from minieng.units import GIB

HEADROOM = 0.9  # leave 10% for activations, the allocator's slack and the CUDA context


@dataclass
class MemoryPlan:
    """Bytes the run needs, and the memory there is (None when unknown)."""

    weight_bytes: int
    kv_bytes_per_token: int
    num_kv_blocks: int
    block_size: int
    device_type: str
    gpu_memory_bytes: int | None
    host_available_bytes: int | None

    @property
    def kv_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    @property
    def kv_bytes(self) -> int:
        return self.kv_tokens * self.kv_bytes_per_token

    @property
    def device_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def host_bytes(self) -> int:
        """RAM needed: everything on a CPU run; the largest matrices in flight on a GPU load."""
        return self.device_bytes if self.device_type == "cpu" else self.weight_bytes // 10

    def problems(self) -> list[str]:
        out = []
        if self.gpu_memory_bytes is not None and self.device_bytes > HEADROOM * self.gpu_memory_bytes:
            out.append(
                f"weights {self.weight_bytes / GIB:.2f} GiB + KV {self.kv_bytes / GIB:.2f} GiB exceed "
                f"{HEADROOM:.0%} of the GPU's {self.gpu_memory_bytes / GIB:.1f} GiB"
            )
        if self.host_available_bytes is not None and self.host_bytes > HEADROOM * self.host_available_bytes:
            out.append(
                f"{self.host_bytes / GIB:.2f} GiB needed in host RAM, {self.host_available_bytes / GIB:.1f} GiB available"
            )
        return out

    def check(self) -> None:
        """Raise ``ValueError`` with advice if the plan does not fit."""
        problems = self.problems()
        if problems:
            raise ValueError(
                "the model does not fit: " + "; ".join(problems) + ". Try: a smaller model; "
                "a 2-byte dtype (dtype='bfloat16' or 'float16') on a GPU; a shorter max_model_len; "
                "a smaller KV budget (kv_cache_memory_gib or num_kv_blocks)."
            )

    def lines(self) -> list[str]:
        fmt = lambda b: "unknown" if b is None else f"{b / GIB:.2f} GiB"  # noqa: E731
        return [
            f"weights           {fmt(self.weight_bytes)}",
            f"KV per token      {self.kv_bytes_per_token / 1024:.1f} KiB",
            f"KV pool           {self.num_kv_blocks} blocks x {self.block_size} = {self.kv_tokens} tokens, {fmt(self.kv_bytes)}",
            f"needs on {self.device_type:<6}  {fmt(self.device_bytes)} (GPU memory {fmt(self.gpu_memory_bytes)})",
            f"needs in host RAM {fmt(self.host_bytes)} ({fmt(self.host_available_bytes)} available)",
        ]


def plan_memory(
    model_config: ModelConfig,
    dtype: torch.dtype,
    num_kv_blocks: int | None,
    block_size: int,
    device: torch.device,
    quantized: MatmulBytes | None = None,
    *,
    kv_cache_memory_gib: float | None = None,
    tensor_parallel_size: int = 1,
) -> MemoryPlan:
    """The memory plan of a model in ``dtype`` with a KV pool of ``num_kv_blocks`` blocks (None:
    as many as ``kv_cache_memory_gib`` GiB hold, ``kv_cache.num_blocks_for_budget``) on ``device``;
    ``quantized``: the matrices' bytes of a quantized model (``weight_bytes``). The KV cache stays
    in ``dtype``. With ``tensor_parallel_size`` p > 1, the plan of rank 0's share (the largest,
    ``tensor_parallel.shard_config``) of the model and of the pool. Raises ``ValueError`` when neither
    ``num_kv_blocks`` nor ``kv_cache_memory_gib`` is given."""
    if num_kv_blocks is None and kv_cache_memory_gib is None:
        raise ValueError("plan_memory needs num_kv_blocks or kv_cache_memory_gib")
    rank_config = shard_config(model_config, tensor_parallel_size)
    weights = weight_bytes(rank_config, dtype.itemsize, quantized)
    if num_kv_blocks is None:
        num_kv_blocks = num_blocks_for_budget(rank_config, dtype, block_size, kv_cache_memory_gib)
    gpu = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    return MemoryPlan(
        weights,
        rank_config.kv_bytes_per_token(dtype.itemsize),
        num_kv_blocks,
        block_size,
        device.type,
        gpu,
        host.host_memory_bytes()[1],
    )


# -- sizing the KV pool from the device (CUDA), as vLLM does ---------------------------------------


def kv_budget_bytes(
    total_bytes: int, gpu_memory_utilization: float, peak_torch_bytes: int, non_torch_bytes: int
) -> int:
    """Bytes left for the KV pool: vLLM's rule (``gpu_memory_utilization``, ``determine_num_available_blocks``).

    total x utilization, less the peak torch allocated in a profile forward (weights plus the
    activations of the largest step) and memory outside torch's allocator (the CUDA context,
    cuBLAS workspaces, other processes). Can be negative: the caller refuses it.
    """
    return int(total_bytes * gpu_memory_utilization) - peak_torch_bytes - non_torch_bytes


def kv_blocks_for_bytes(budget_bytes: int, block_size: int, kv_bytes_per_token: list[int]) -> int:
    """Blocks that fit ``budget_bytes`` when every block holds ``block_size`` tokens in each pool
    (the target's and, with speculative decoding, the draft's: one entry per pool)."""
    return max(0, budget_bytes // (block_size * sum(kv_bytes_per_token)))


def profile_peak_bytes(model, num_tokens: int, block_size: int, logits_rows: int = 1) -> int:
    """Peak bytes torch allocates on the model's CUDA device during one forward of ``num_tokens``
    prompt tokens (the largest step ``max_num_batched_tokens`` allows) with the logits of its last
    ``logits_rows`` rows (at most ``num_tokens``; ``logprobs.max_logits_rows``: every row a step may
    sample or score), weights included, the throwaway KV pool of that forward excluded."""
    device = next(model.parameters()).device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    rows = torch.arange(max(0, num_tokens - logits_rows), num_tokens, device=device)
    logits, cache_bytes = throwaway_forward(model, ids, rows, block_size)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - cache_bytes  # the pool is freed by now
    torch.cuda.reset_peak_memory_stats(device)
    sample_like_a_step(logits)
    torch.cuda.synchronize(device)
    peak = max(peak, torch.cuda.max_memory_allocated(device))
    del logits
    torch.cuda.empty_cache()
    return peak


def sample_like_a_step(logits: torch.Tensor, num_top: int = EngineConfig.max_logprobs) -> None:
    """What a step does with its logits [rows, vocab] after the forward, at its costliest: every
    row sampled with top-k and top-p (``sampling.sample``: the float32 probabilities, top-p's sort,
    the race in float64) and ``ROWS_AT_ONCE`` rows' log-probabilities with ``num_top`` top tokens
    each (``logprobs.gather_logprobs``; the default ``max_logprobs``: the top tokens are [rows,
    num_top], small beside the [rows, vocab] log-softmax), as vLLM's profile runs its sampler on
    dummy logits (``_dummy_sampler_run``). Its allocations are what the memory profile reads."""
    rows = logits.shape[0]
    if rows == 0:
        return
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9)
    rng = KeyedRandom(0, logits.device)
    sample(logits, [params] * rows, [rng] * rows, [0] * rows)
    scored = min(rows, ROWS_AT_ONCE)
    gather_logprobs(logits[:scored], [0] * scored, [num_top] * scored)


def device_kv_blocks(
    models: list,
    num_tokens: int,
    block_size: int,
    gpu_memory_utilization: float,
    reserve_fraction: float = 0.0,
    logits_rows: int = 1,
) -> int:
    """KV blocks for ``models`` (the target, then the draft if any) on their CUDA device.

    Each model gets a pool of the same number of blocks. ``reserve_fraction`` of the device's
    memory is kept out of the pool (the CUDA graphs' scratch, ``cuda_graph``). The profile's
    forward computes ``logits_rows`` rows of logits (``profile_peak_bytes``). Raises
    ``ValueError`` when the weights and activations leave no room.
    """
    device = next(models[0].parameters()).device
    # Every model's weights are resident during each profile; their activations never coexist.
    peak = max(profile_peak_bytes(m, num_tokens, block_size, logits_rows) for m in models)
    free, total = torch.cuda.mem_get_info(device)
    non_torch = total - free - torch.cuda.memory_reserved(device)
    budget = kv_budget_bytes(total, gpu_memory_utilization, peak, max(0, non_torch)) - int(reserve_fraction * total)
    per_token = [m.config.kv_bytes_per_token(next(m.parameters()).dtype.itemsize) for m in models]
    blocks = kv_blocks_for_bytes(budget, block_size, per_token)
    if blocks < 1:
        raise ValueError(
            f"no GPU memory left for the KV cache: {total / GIB:.1f} GiB x gpu_memory_utilization="
            f"{gpu_memory_utilization} leaves {budget / GIB:.2f} GiB after the weights and activations "
            f"({peak / GIB:.2f} GiB) and other allocations ({non_torch / GIB:.2f} GiB); raise "
            "gpu_memory_utilization, lower max_num_batched_tokens, or use a smaller model"
        )
    return blocks
