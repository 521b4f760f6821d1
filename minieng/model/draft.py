"""The draft model of speculative decoding (``speculative_method="draft"``), as the engine config asks.

A smaller model of the same family (``draft_model``), or the target's own weights; on the
target's device and dtype; quantized with ``draft_quantization``. A separate draft is checked
before its weights load (``checks.check_model``) and against the target's tokenizer after
(``loader.check_same_tokenizer``): the two must agree on every token id, or verification compares
different tokens.
"""

from __future__ import annotations

from dataclasses import replace

from minieng.config import EngineConfig
from minieng.model.checks import check_model
from minieng.model.llama import LlamaForCausalLM
from minieng.model.loader import LoadedModel, check_same_tokenizer, load_config, load_model
from minieng.model.quantization import quantize_model


def load_draft(config: EngineConfig, target: LoadedModel, max_position: int) -> LlamaForCausalLM | None:
    """The draft model ``config`` asks for, or None (prompt lookup, or no speculative tokens).

    ``target``: the target as loaded (its device, dtype and tokenizer); ``max_position``: the
    RoPE table's length (the engine's ``max_model_len``). Raises ``ValueError`` for a draft whose
    head_dim ``attention_backend`` does not take, a scheme the device does not run, or a
    vocabulary or tokenizer that differs from the target's.
    """
    if config.speculative_method != "draft" or not config.num_speculative_tokens:
        return None
    draft = target
    if config.draft_model is not None:
        param = next(target.model.parameters())
        resolved = load_config(config.draft_model)
        check_model(config, resolved[2], param.device, param.dtype, draft=True)
        draft = load_model(replace(config, model=config.draft_model), param.device, param.dtype, max_position, resolved)
        check_same_tokenizer(target, draft)
    if config.draft_quantization is not None:
        return quantize_model(draft.model, config.draft_quantization, config.quantization_group_size)
    return draft.model
