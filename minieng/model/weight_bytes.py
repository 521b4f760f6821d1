"""Bytes of a model's weights, torch-free: what the matrix products read per step (``MatmulBytes``: the
decoder layers' and the LM head's, integer codes and scales for a quantized model) and what stays
resident (``weight_bytes``). The engine's memory plan, the quantization bytes model and the
instruments' work counting all read these.
"""

from __future__ import annotations

from dataclasses import dataclass

from minieng.config import ModelConfig


@dataclass(frozen=True)
class MatmulBytes:
    """Bytes of the matrix products' weights, read once per step: ``layers`` (every decoder
    layer's q/k/v, o, gate/up and down) and ``lm_head`` (read only in a step that computes
    logits). For quantized weights, the integer codes and their scales."""

    layers: float
    lm_head: float


def weight_bytes(model_config: ModelConfig, dtype_bytes: int, quantized: MatmulBytes | None = None) -> int:
    """Bytes of the resident weights: every parameter in ``dtype_bytes``; or, for a model whose
    matrices are quantized (``quantized``: their bytes, scales included), the norms and the
    embedding table in ``dtype_bytes`` plus the quantized matrices, the LM head among them."""
    if quantized is None:
        return model_config.num_params * dtype_bytes
    c = model_config
    embedding_and_norms = (
        c.num_params - c.num_matmul_params + (c.vocab_size * c.hidden_size if c.tie_word_embeddings else 0)
    )
    return int(embedding_and_norms * dtype_bytes + quantized.layers + quantized.lm_head)
