"""The engine's refusals before anything loads: an engine that cannot run says why, and what to change.

Each check raises ``ValueError`` naming the field and the way out; ``check_engine`` runs those that
need only the config and the model's published shape, before any weight is read: the context
asked, what tensor parallelism does not run with and the devices it needs, then whether the model
and its KV pool fit the memory. What the model itself cannot run (its attention kernel, its split,
its schemes) is ``check_model``'s, checked before these.
"""

from __future__ import annotations

import torch

from minieng.config import EngineConfig, ModelConfig
from minieng.model.loader import LoadedModel
from minieng.wings.fast_paths.forward_paths import check_attention_backend
from minieng.wings.gpu_memory.kv_sizing import check_fits_before_loading
from minieng.wings.parallel.tensor_parallel import check_tensor_parallel
from minieng.wings.parallel.workers import rank_devices
from minieng.wings.quantization.quantization import check_quantization


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
    check_tensor_parallel_engine(config, device, loaded)
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


def check_tensor_parallel_engine(config: EngineConfig, device: torch.device, loaded: LoadedModel | None) -> None:
    """Refuse, before anything loads, a tensor-parallel engine minieng cannot build (``ValueError``
    naming the numbers): more ranks than devices (``workers.rank_devices``), or a feature the split
    does not run. The model's own limit, a KV head per rank, is ``tensor_parallel.check_tensor_parallel``'s."""
    size = config.tensor_parallel_size
    if loaded is not None and getattr(loaded.model, "tp", None) is not None:
        raise ValueError(
            "this loaded model is one rank's share of a tensor-parallel engine: build the engine from model= instead"
        )
    if size == 1:
        return
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


def check_model(
    config: EngineConfig, model_config: ModelConfig, device: torch.device, dtype: torch.dtype, draft: bool = False
) -> None:
    """Refuse what ``model_config`` cannot run as ``config`` asks on ``device`` in ``dtype``
    (``ValueError`` naming the field and the way out): a head_dim the attention kernel does not
    take (``forward_paths.check_attention_backend``), more tensor-parallel ranks than KV heads
    (``tensor_parallel.check_tensor_parallel``), a scheme the device does not run or an int4 group size
    that does not divide the layers (``quantization.check_quantization``).

    The schemes are ``quantization`` and, when the draft runs these same weights, ``draft_quantization``;
    ``draft=True`` checks a separately loaded draft model: its kernel and ``draft_quantization``.
    """
    check_attention_backend(config.attention_backend, model_config.head_dim, device)
    if draft:
        schemes = [config.draft_quantization]
    else:
        check_tensor_parallel(model_config, config.tensor_parallel_size)
        shared = config.speculative_method == "draft" and config.num_speculative_tokens and config.draft_model is None
        schemes = [config.quantization, config.draft_quantization if shared else None]
    for scheme in schemes:
        check_quantization(scheme, config.quantization_group_size, model_config, device, dtype)
