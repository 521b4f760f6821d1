"""What a model can run as an engine config asks, refused before its weights load.

Each refusal lives beside what it protects (the attention kernel, the tensor-parallel split,
the quantization schemes); ``check_model`` runs them for one model. The engine's own refusals,
and whether the machine holds it, are ``engine/config_checks.py``'s.
"""

from __future__ import annotations

import torch

from minieng.config import EngineConfig, ModelConfig
from minieng.model.attention import check_attention_backend
from minieng.model.parallel import check_tensor_parallel
from minieng.model.quantization import check_quantization


def check_model(
    config: EngineConfig, model_config: ModelConfig, device: torch.device, dtype: torch.dtype, draft: bool = False
) -> None:
    """Refuse what ``model_config`` cannot run as ``config`` asks on ``device`` in ``dtype``
    (``ValueError`` naming the field and the way out): a head_dim the attention kernel does not
    take (``attention.check_attention_backend``), more tensor-parallel ranks than KV heads
    (``parallel.check_tensor_parallel``), a scheme the device does not run or an int4 group size
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
