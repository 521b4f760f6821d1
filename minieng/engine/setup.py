"""What an engine is built from, in the order its constructor needs it: the context length, the
KV pool's size, the quantized model, the draft model and its drafter, and the CUDA graphs of
the decode step.

The pool is sized one of three ways: ``num_kv_blocks`` exactly; ``kv_cache_memory_gib`` (1 GiB on
a CPU when neither is given); or, on CUDA with neither given, from the device's memory after the
model is loaded (``memory_plan.device_kv_blocks``, vLLM's ``gpu_memory_utilization`` rule). A
``max_model_len`` left to default is then capped to what the pool holds.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace

import torch

from minieng.config import EngineConfig, ModelConfig
from minieng.engine import compilation
from minieng.engine.cuda_graph import DecodeGraphs
from minieng.engine.drafters import DraftModelDrafter, PromptLookupDrafter
from minieng.engine.memory_plan import device_kv_blocks
from minieng.engine.model_runner import ModelRunner
from minieng.engine.workers import Workers, rank_devices
from minieng.model.kv_cache import KVCache, kv_bytes_per_token, num_blocks_for_budget
from minieng.model.loader import LoadedModel, load_model
from minieng.model.parallel import check_tensor_parallel
from minieng.model.quantization import SCHEMES, check_quantization, matmul_bytes, model_quantization, quantize_model
from minieng.units import GIB, cdiv

CPU_KV_CACHE_GIB = 1.0  # the KV budget when none is given and the device is not CUDA
# The share of the GPU's memory kept out of the KV pool for the decode step's gathered K/V (one
# layer's, K and V: ``gather_budget_tokens``), captured or eager. A bucket gathers at most half of
# it (wider buckets are not captured), so its eager warm-up before the capture fits beside it; an
# eager step whose batch would gather more is attended in groups (``attention.decode_group_size``).
GATHER_SCRATCH_FRACTION = 0.02


def check_max_model_len(asked: int | None, model_max: int) -> int:
    """``asked``, or the model's context when None. Raises ``ValueError`` beyond the model's context."""
    if asked is None:
        return model_max
    if asked > model_max:
        raise ValueError(
            f"max_model_len={asked} exceeds the model's context of {model_max} tokens; lower it or leave it None"
        )
    return asked


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
        stacklevel=3,
    )
    return tokens


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
    naming the numbers): more ranks than KV heads, or than devices, or a feature the split does
    not run."""
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


@contextmanager
def closing_workers_on_error(workers: Workers | None):
    """Close ``workers`` if the block raises: an engine that fails to build leaves no process behind."""
    try:
        yield
    except BaseException:
        if workers is not None:
            workers.close()
        raise


def load_ranks(
    config: EngineConfig, device: torch.device, dtype: torch.dtype, max_model_len: int, resolved
) -> tuple[LoadedModel, Workers | None]:
    """This process's model (``loader.load_model``) and, with ``tensor_parallel_size`` p > 1, the
    workers of ranks 1 .. p-1 (``workers.Workers``; the size was checked by
    ``check_tensor_parallel_engine``): they load their shares while this rank loads its own, rank
    0's. Workers that start are closed again if any rank fails to load."""
    workers = Workers(config, device, max_model_len, resolved) if config.tensor_parallel_size > 1 else None
    with closing_workers_on_error(workers):
        loaded = load_model(config, device, dtype, max_model_len, resolved, tp=workers.tp if workers else None)
        if workers:
            workers.wait_loaded()
    return loaded, workers


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


def engine_model(config: EngineConfig, model) -> tuple[EngineConfig, object]:
    """The model the engine runs and the config that describes it: ``model`` quantized with
    ``config.quantization`` (a copy sharing the embedding and norms); or, with None, ``model``
    as it is, and a model ``quantization.quantize_model`` made (a quantized draft reused as a
    model of its own) runs with its scheme, which the returned config then names. Raises
    ``ValueError`` for a model already quantized with another scheme."""
    if config.quantization is not None:
        return config, quantize_model(model, config.quantization, config.quantization_group_size)
    done = model_quantization(model)
    if done is not None and done[0] in SCHEMES:  # not a dequantized reference: its bytes are the kernels'
        config = replace(
            config, quantization=done[0], quantization_group_size=done[1] or config.quantization_group_size
        )
    return config, model


def engine_matmul_bytes(config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype):
    """The matrix products' weight bytes of the engine's scheme (``weight_bytes.MatmulBytes``), or None
    without quantization (dtype bytes per weight)."""
    if config.quantization is None:
        return None
    return matmul_bytes(model_config, config.quantization, config.quantization_group_size, dtype.itemsize)


def load_draft(config: EngineConfig, target: LoadedModel, max_model_len: int):
    """The draft model of ``speculative_method="draft"`` (None for prompt lookup): a smaller
    model of the same family, or the target's own weights, on the target's device and dtype,
    quantized with ``draft_quantization`` (``quantization.quantize_model``, the layers the
    engine's ``quantization`` uses). Raises ``ValueError`` for a draft whose vocabulary or
    tokenizer differs from the target's, or a scheme the device does not run."""
    if config.speculative_method != "draft":
        return None
    if config.draft_model is None:
        draft = target
    else:
        param = next(target.model.parameters())
        draft = load_model(replace(config, model=config.draft_model), param.device, param.dtype, max_model_len)
        check_same_tokenizer(target, draft)
    if config.draft_quantization is not None:
        return quantize_model(draft.model, config.draft_quantization, config.quantization_group_size)
    return draft.model


def make_drafter(config: EngineConfig, draft_model, num_blocks: int, max_model_len: int):
    """The drafter: prompt lookup, or the draft model with its own KV pool of ``num_blocks`` (and
    its own decode graphs on CUDA); None without speculative decoding."""
    if not config.num_speculative_tokens:
        return None
    if draft_model is None:
        return PromptLookupDrafter(config.ngram_max)
    drafter = DraftModelDrafter(draft_model, num_blocks, config.block_size)
    drafter.runner.graphs = decode_graphs(config, draft_model, drafter.kv_cache, max_model_len, query_lens=(1,))
    drafter.runner.max_gather_tokens = gather_budget_tokens(drafter.kv_cache)
    return drafter


def make_runner(config: EngineConfig, model, kv_cache: KVCache, block_manager, max_model_len: int, workers=None):
    """The model runner over ``kv_cache``: with ``compile=True`` the layers' compiled regions and, on
    a CPU, the compiled decode step (the seconds they took in ``runner.compile_s``, None when
    eager), the decode graphs on CUDA, the decodes' gather budget, and the other tensor-parallel
    ranks, whose pools it allocates alike (every rank's pool has as many blocks: the block
    manager's blocks are every rank's)."""
    device = kv_cache.kv.device
    gather_tokens = gather_budget_tokens(kv_cache)
    if workers is not None:
        workers.allocate_kv(kv_cache.num_blocks, gather_tokens)
    regions, compiled_decode, compile_s = compiled_parts(config, model, kv_cache)
    graphs = decode_graphs(config, model, kv_cache, max_model_len, regions=regions)
    runner = ModelRunner(
        model, kv_cache, block_manager, device, graphs, gather_tokens, regions, config.attention_backend, workers
    )
    runner.compiled_decode = compiled_decode
    runner.compile_s = compile_s
    return runner


def compiled_parts(
    config: EngineConfig, model, kv_cache: KVCache
) -> tuple[tuple | None, Callable | None, float | None]:
    """With ``config.compile``: the layers' compiled regions, the compiled decode step (on a CPU;
    None on CUDA, whose decode steps replay CUDA graphs) and the seconds compiling them took at
    start-up (``compilation``); ``(None, None, None)`` otherwise, or, with a warning, where it
    cannot compile."""
    if not config.compile:
        return None, None, None
    device = kv_cache.kv.device
    why = compilation.compiler_missing(device)
    if why is None:
        try:
            regions = compilation.regions()
            compile_s = compilation.warm_up(model, device, regions)
            if device.type == "cuda" or model.tp.size > 1:  # decode_forward is one rank's, on a CPU
                return regions, None, compile_s
            decode = compilation.compile_decode_step()
            return regions, decode, compile_s + compilation.warm_up_decode(decode, model, kv_cache)
        except Exception as e:  # noqa: BLE001 (any compiler failure: the engine still runs, eagerly)
            why = f"torch.compile failed ({type(e).__name__}: {str(e)[:300]})"
    warnings.warn(f"compile=True: {why}; the engine runs eagerly", stacklevel=3)
    return None, None, None


def decode_graphs(
    config: EngineConfig,
    model,
    kv_cache: KVCache,
    max_model_len: int,
    query_lens: tuple[int, ...] | None = None,
    regions=None,
):
    """CUDA graphs of the decode step over ``kv_cache`` (None on a CPU or with ``enforce_eager``).

    ``query_lens``: tokens per sequence of the captured steps; by default 1, and with speculative
    decoding every verification width 2 .. k + 1 (experiments lower k at run time).
    """
    if kv_cache.k.device.type != "cuda" or config.enforce_eager or config.tensor_parallel_size > 1:
        return None  # tensor parallelism runs eager: collectives inside captured graphs are untested here
    if query_lens is None:
        query_lens = tuple(range(1, config.num_speculative_tokens + 2))
    # A bucket gathers batch x width x block_size tokens of K/V per layer (and holds them in the
    # graphs' pool): within the gather budget, so the scratch and the warm-up beside it fit the
    # memory the KV sizing left out.
    try:
        return DecodeGraphs(
            model,
            kv_cache,
            config.max_num_seqs,
            max_model_len,
            gather_budget_tokens(kv_cache),
            query_lens=query_lens,
            regions=regions,
            attention_backend=config.attention_backend,
        )
    except RuntimeError as e:  # out of memory (a subclass), or an op the capture refuses
        warnings.warn(
            f"CUDA graph capture failed ({type(e).__name__}: {e}); decode steps run eagerly. "
            "Lower gpu_memory_utilization or max_num_seqs, or pass enforce_eager=True.",
            stacklevel=3,
        )
        return None


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise ``ValueError`` unless the draft reads and writes the target's token ids."""
    tv, dv = target.model.config.vocab_size, draft.model.config.vocab_size
    if tv != dv:
        raise ValueError(
            f"draft_model vocabulary has {dv} tokens, the target's {tv}: use a draft of the "
            "same family (it must share the target's tokenizer)"
        )
    if (
        target.tokenizer is not None
        and draft.tokenizer is not None
        and target.tokenizer.get_vocab() != draft.tokenizer.get_vocab()
    ):
        raise ValueError("draft_model's tokenizer differs from the target's: use a draft of the same family")
