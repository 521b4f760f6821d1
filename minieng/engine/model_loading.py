"""The models an engine runs: its own (on every tensor-parallel rank), quantized as asked, and the
draft model of speculative decoding, each checked before any weight loads.

``load_engine_models`` is the order an engine needs: refuse what the model cannot run
(``config_checks.check_model``), then what the engine cannot run or the machine cannot hold
(``config_checks.check_engine``); load this rank's model while the workers load theirs, load the
draft (``load_draft``: a smaller model of the same family, or the target's own weights, quantized
with ``draft_quantization``, checked against the target's tokenizer), then quantize
(``quantization.apply_quantization``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from minieng.config import EngineConfig
from minieng.device import select_device, select_dtype
from minieng.engine.config_checks import check_engine, check_model
from minieng.wings.parallel.tensor_parallel import RankShard
from minieng.wings.parallel.workers import Workers, closing_on_error
from minieng.core.llama import LlamaForCausalLM
from minieng.model.loader import LoadedModel, check_same_tokenizer, load_config, load_model
from minieng.wings.quantization.quantization import apply_quantization, matmul_bytes, quantize_model
from minieng.model.weight_bytes import MatmulBytes


@dataclass(frozen=True)
class EngineModels:
    """What ``load_engine_models`` returns.

    ``config``: the engine's config, naming the scheme of a model quantized before it was given.
    ``loaded``: the tokenizer, the EOS ids and the checkpoint; its ``model`` is ``model`` when this
    engine loaded it (nobody else holds the float matrices), the caller's model otherwise.
    ``model``: the model the engine runs (quantized with ``config.quantization``).
    ``draft_model``: the draft of ``speculative_method="draft"``, or None.
    ``workers``: tensor-parallel ranks 1 .. p - 1 (``workers.Workers``), or None.
    ``max_model_len``: asked, or the model's context (not yet fitted to the KV pool).
    ``matmul_bytes``: the matrix products' weight bytes of the scheme, scales included; None
    without quantization (dtype bytes per weight).
    """

    config: EngineConfig
    loaded: LoadedModel
    model: LlamaForCausalLM
    draft_model: LlamaForCausalLM | None
    workers: Workers | None
    max_model_len: int
    matmul_bytes: MatmulBytes | None

    @property
    def with_kv_pools(self) -> list[LlamaForCausalLM]:
        """The models that get a KV pool each, of as many blocks: the target, then the draft if any."""
        return [self.model] + ([self.draft_model] if self.draft_model is not None else [])


def load_engine_models(config: EngineConfig, loaded: LoadedModel | None = None) -> EngineModels:
    """Check, then load (unless ``loaded`` is given) what ``config`` describes, on its device and dtype
    (``device.select_device``/``select_dtype``; a given model's own). Raises ``ValueError`` for what
    cannot run or fit (``config_checks.check_model``, ``check_engine``), before any weight loads;
    ``workers.WorkerError`` for a worker that fails. Workers that started are closed on any failure."""
    if loaded is None:  # device and dtype first: a bad one fails before any download or conversion
        device = select_device(config.device)
        dtype = select_dtype(config.dtype, device)
        resolved = load_config(config.model)
        model_config, max_position = resolved[2], resolved[2].max_position_embeddings
    else:
        param = next(loaded.model.parameters())
        device, dtype = param.device, param.dtype
        model_config, max_position = loaded.model.config, loaded.model.rope.max_position
    check_model(config, model_config, device, dtype)
    draft_resolved = resolve_draft(config, device, dtype)  # a separate draft's refusals too, before any load
    max_model_len = check_engine(config, model_config, max_position, device, dtype, loaded)
    loaded_here = loaded is None
    workers = None
    if loaded_here:
        loaded, workers = load_ranks(config, device, dtype, max_model_len, resolved)
    with closing_on_error(workers):
        draft_model = load_draft(config, loaded, max_model_len, draft_resolved)
        model, scheme, group_size = apply_quantization(
            loaded.model, config.quantization, config.quantization_group_size
        )
    config = replace(config, quantization=scheme, quantization_group_size=group_size)
    bytes_ = None if scheme is None else matmul_bytes(model.config, scheme, group_size, dtype.itemsize)
    if loaded_here:  # nobody else holds the float matrices: let them go
        loaded = replace(loaded, model=model)
    return EngineModels(config, loaded, model, draft_model, workers, max_model_len, bytes_)


def load_ranks(
    config: EngineConfig, device: torch.device, dtype: torch.dtype, max_model_len: int, resolved
) -> tuple[LoadedModel, Workers | None]:
    """This process's model (``loader.load_model``) and, with ``tensor_parallel_size`` p > 1, the
    workers of ranks 1 .. p-1 (``workers.Workers``; the size was checked by
    ``config_checks.check_tensor_parallel_engine``): they load their shares while this rank loads its own, rank
    0's. Workers that start are closed again if any rank fails to load."""
    workers = Workers(config, device, max_model_len, resolved) if config.tensor_parallel_size > 1 else None
    with closing_on_error(workers):
        loaded = load_model(config, device, dtype, max_model_len, resolved, RankShard(workers.tp) if workers else None)
        if workers:
            workers.wait_loaded()
    return loaded, workers


def resolve_draft(config: EngineConfig, device: torch.device, dtype: torch.dtype) -> tuple | None:
    """A separate draft model's ``(directory, transformers config, ModelConfig)``
    (``loader.load_config``), refused from its config alone (``config_checks.check_model``, ``draft=True``:
    ``ValueError``), so an engine refuses it before any weight loads, its target's included. None
    without a separate draft."""
    if config.speculative_method != "draft" or not config.num_speculative_tokens or config.draft_model is None:
        return None
    resolved = load_config(config.draft_model)
    check_model(config, resolved[2], device, dtype, draft=True)
    return resolved


def load_draft(
    config: EngineConfig, target: LoadedModel, max_position: int, resolved: tuple | None = None
) -> LlamaForCausalLM | None:
    """The draft model ``config`` asks for, or None (prompt lookup, or no speculative tokens).

    ``target``: the target as loaded (its device, dtype and tokenizer); ``max_position``: the
    RoPE table's length (the engine's ``max_model_len``); ``resolved``: ``resolve_draft``'s, or
    None to resolve (and check) it here. Raises ``ValueError`` for a draft whose head_dim
    ``attention_backend`` does not take, a scheme the device does not run, or a vocabulary or
    tokenizer that differs from the target's.
    """
    if config.speculative_method != "draft" or not config.num_speculative_tokens:
        return None
    draft = target
    if config.draft_model is not None:
        param = next(target.model.parameters())
        resolved = resolved or resolve_draft(config, param.device, param.dtype)
        draft = load_model(replace(config, model=config.draft_model), param.device, param.dtype, max_position, resolved)
        check_same_tokenizer(target, draft)
    if config.draft_quantization is not None:
        return quantize_model(draft.model, config.draft_quantization, config.quantization_group_size)
    return draft.model
