"""The draft model of speculative decoding (``speculative_method="draft"``), as the engine config asks.

A smaller model of the same family (``draft_model``), or the target's own weights; on the
target's device and dtype; quantized with ``draft_quantization``. A separate draft is checked
before any weight loads (``resolve_draft``: ``checks.check_model``) and against the target's tokenizer after
(``loader.check_same_tokenizer``): the two must agree on every token id, or verification compares
different tokens.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minieng.config import EngineConfig
from minieng.model.checks import check_model
from minieng.model.llama import LlamaForCausalLM
from minieng.model.loader import LoadedModel, check_same_tokenizer, load_config, load_model
from minieng.model.quantization import quantize_model


def resolve_draft(config: EngineConfig, device: torch.device, dtype: torch.dtype) -> tuple | None:
    """A separate draft model's ``(directory, transformers config, ModelConfig)``
    (``loader.load_config``), refused from its config alone (``checks.check_model``, ``draft=True``:
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
