"""Refusals before anything loads: an engine that cannot run says why, and what to change.

Each check raises ``ValueError`` naming the field and the way out; ``check_engine`` runs those that
need only the config and the model's published shape, before any weight is read.
"""

from __future__ import annotations

import torch

from minieng.config import EngineConfig, ModelConfig
from minieng.engine.kv_sizing import check_fits_before_loading
from minieng.engine.workers import rank_devices
from minieng.model.loader import LoadedModel
from minieng.model.parallel import check_tensor_parallel
from minieng.model.quantization import check_quantization


def check_engine(
    config: EngineConfig,
    model_config: ModelConfig,
    max_position: int,
    device: torch.device,
    dtype: torch.dtype,
    loaded: LoadedModel | None,
) -> int:
    """Run every check that needs no weight (``loaded``: a model the caller already loaded, or
    None: then also whether the model and a configured KV pool fit, ``kv_sizing.check_fits_before_loading``)
    and return the ``max_model_len`` asked, or the model's context (``max_position``)."""
    max_model_len = check_max_model_len(config.max_model_len, max_position)
    check_attention_backend(config, model_config, device)
    check_tensor_parallel_engine(config, model_config, device, loaded)
    check_engine_quantization(config, model_config, device, dtype)
    if loaded is None:  # a model to load here: will it and its pool fit? (last: memory is the one to tune)
        check_fits_before_loading(config, model_config, dtype, device)
    return max_model_len


def check_max_model_len(asked: int | None, model_max: int) -> int:
    """``asked``, or the model's context when None. Raises ``ValueError`` beyond the model's context."""
    if asked is None:
        return model_max
    if asked > model_max:
        raise ValueError(
            f"max_model_len={asked} exceeds the model's context of {model_max} tokens; lower it or leave it None"
        )
    return asked


def check_attention_backend(config: EngineConfig, model_config: ModelConfig, device: torch.device) -> None:
    """Refuse ``attention_backend="triton"`` where its kernel cannot run (``ValueError`` saying why):
    no triton, a CPU without Triton's interpreter, or a head_dim the kernel does not take."""
    if config.attention_backend != "triton":
        return
    from minieng.model import triton_attention as ta  # lazy: triton is optional and slow to import

    d = model_config.head_dim
    why = (
        "triton is not installed (pip install triton)"
        if not ta.TRITON_AVAILABLE
        else "a CPU runs Triton kernels only under its interpreter (TRITON_INTERPRET=1 before triton is imported)"
        if device.type == "cpu" and not ta.INTERPRETED
        else f"the kernel takes a head_dim that is a power of two >= 16, not {d}"
        if d < 16 or d & (d - 1)
        else None
    )
    if why:
        raise ValueError(f"attention_backend='triton': {why}; use attention_backend='sdpa'")


def check_tensor_parallel_engine(
    config: EngineConfig, model_config: ModelConfig, device: torch.device, loaded: LoadedModel | None
) -> None:
    """Refuse, before anything loads, a tensor-parallel engine minieng cannot build (``ValueError``
    naming the numbers): more ranks than KV heads (``parallel.check_tensor_parallel``), or than
    devices, or a feature the split does not run."""
    size = config.tensor_parallel_size
    if loaded is not None and loaded.model.tp.size > 1:
        raise ValueError(
            "this loaded model is one rank's share of a tensor-parallel engine: build the engine from model= instead"
        )
    if size == 1:
        return
    check_tensor_parallel(model_config, size)
    rank_devices(device, size)
    unsupported = {
        "compile=True": config.compile,
        f"quantization={config.quantization!r}": config.quantization is not None,
        "speculative_method='draft' (use 'ngram')": config.speculative_method == "draft"
        and config.num_speculative_tokens > 0,
        "an already loaded model (each rank loads its own slices: pass model=)": loaded is not None,
    }
    refused = [name for name, asked in unsupported.items() if asked]
    if refused:
        raise ValueError(f"tensor_parallel_size={size} does not run with {', '.join(refused)}")
    if device.type == "cuda" and config.kv_cache_memory_gib is None and config.num_kv_blocks is None:
        raise ValueError(
            f"tensor_parallel_size={size} on CUDA needs the KV pool's size (kv_cache_memory_gib per rank, or "
            "num_kv_blocks): sizing it from a profiled forward of one rank alone is not supported"
        )


def check_engine_quantization(
    config: EngineConfig, model_config: ModelConfig, device: torch.device, dtype: torch.dtype
) -> None:
    """Refuse, before any weight loads, a scheme the device does not run or an int4 group size
    that does not divide the model's layers (``ValueError`` listing what runs where). A
    separate draft model's group sizes are checked when it is quantized."""
    if config.quantization is None and config.draft_quantization is None:
        return
    check_quantization(config.quantization, config.quantization_group_size, model_config, device, dtype)
    if config.speculative_method == "draft" and config.num_speculative_tokens and config.draft_model is None:
        check_quantization(config.draft_quantization, config.quantization_group_size, model_config, device, dtype)
