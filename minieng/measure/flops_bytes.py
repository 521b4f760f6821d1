"""FLOPs and bytes of a step, from first principles (what they become against a peak: ``roofline``).

A step is described as the engine records it (``StepRecord.chunks``): per scheduled sequence,
``(num_new_tokens, num_context_tokens, num_logits_rows)``. Everything here is arithmetic on
``ModelConfig`` shapes: no tensors, no device, no timing. The measured seconds and the peaks
(datasheet or measured ceiling: ``peaks``) come from the caller.

FLOPs (2 per multiply-add; docs/architecture.md, FLOPs and bytes):
- Linear layers: 2 * N per new token (Kaplan et al. 2020, table 1: C_forward ~ 2N), where N is
  the layers' matmul parameters (``ModelConfig.num_matmul_params`` less the LM head). The
  embedding lookup is a gather, free. Biases, norms, RoPE, SiLU and residual adds are
  elementwise, O(hidden) per token against O(hidden^2): not counted (nor by FlopCounterMode).
- LM head: 2 * hidden * vocab per row whose logits are computed (a tied head is a matmul too).
- Attention, per layer and new token attending c keys (itself included): 4 * num_heads *
  head_dim * c: 2 * num_heads * head_dim * c for QK^T and as much for PV (Hoffmann et al. 2022,
  appendix F; Kaplan's table 1 counts the QK^T half only). Query heads, not KV heads: GQA shares
  K/V, not the dot products. Token i (0-based) of a chunk after C cached tokens attends C + i + 1
  keys; summed over the chunk: 4 * H * D * (T * C + T * (T + 1) / 2). This is the useful, causal
  work: a dense kernel that computes the masked upper triangle and throws it away does more.

Bytes: the least traffic a step must move to and from memory (intermediate activations are
assumed to stay on chip and are not counted, which only matters for compute-bound prefill):
- weight_bytes: every layer weight (matmul weights and norm vectors) read once per step, in
  ``dtype_bytes``, or for quantized matmul weights the bytes their kernels read, scales
  included (``MatmulBytes``, from ``quantization.matmul_bytes``). The embedding table is
  *not* read whole: a lookup reads one row per new token. The LM head matrix is read once,
  and only in a step that computes logits (a mid-prompt prefill chunk skips it); when tied, it
  is the embedding table read whole, counted once for the head plus the looked-up rows.
  Biases (Qwen2's q/k/v: < 0.01% of the weights) are not counted.
- kv_read_bytes: per sequence, the K/V of every key it attends, read once:
  kv_bytes_per_token * (num_context_tokens + num_new_tokens). The new tokens' K/V count as read:
  the attention reads them back from the cache after writing them (``model.Attention`` writes,
  then ``paged_attention`` gathers the whole context), as paged kernels such as vLLM's do. For a
  decode that is one token in C + 1; for a fresh prefill it is all the KV traffic there is.
- kv_write_bytes: kv_bytes_per_token * num_new_tokens (K and V, every layer, GQA-aware).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from minieng.config import ModelConfig
from minieng.model.weight_bytes import MatmulBytes


@dataclass(frozen=True)
class StepWork:
    """FLOPs and bytes of one step (or, summed with ``+``/``sum``, of many).

    The totals and the intensity are derived in ``__post_init__``, so a sum recomputes the
    intensity from summed FLOPs and bytes (it does not add intensities). An empty step has
    intensity 0.
    """

    matmul_flops: float = 0
    attention_flops: float = 0
    lm_head_flops: float = 0
    weight_bytes: float = 0
    kv_read_bytes: float = 0
    kv_write_bytes: float = 0
    total_flops: float = field(init=False)
    total_bytes: float = field(init=False)
    arithmetic_intensity_flop_per_byte: float = field(init=False)

    def __post_init__(self) -> None:
        flops = self.matmul_flops + self.attention_flops + self.lm_head_flops
        nbytes = self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes
        object.__setattr__(self, "total_flops", flops)
        object.__setattr__(self, "total_bytes", nbytes)
        object.__setattr__(self, "arithmetic_intensity_flop_per_byte", flops / nbytes if nbytes else 0.0)

    def __add__(self, other: StepWork) -> StepWork:
        if not isinstance(other, StepWork):
            return NotImplemented
        return StepWork(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.init})

    def __radd__(self, other) -> StepWork:
        return self if other == 0 else self.__add__(other)  # so that sum(works) starts from 0


def prefill_params_per_token(model_config: ModelConfig) -> int:
    """The matmul parameters each prompt token of a prefill runs through: the decoder layers'
    (``ModelConfig.num_matmul_params`` less the LM head). The LM head runs only for the rows whose
    logits are needed, in a prefill the last position alone, so it is no per-token cost of the
    prompt: a prefill's linear FLOPs are 2 x this per token, plus 2 x hidden x vocab once."""
    cfg = model_config
    return cfg.num_matmul_params - cfg.hidden_size * cfg.vocab_size


def step_work(
    model_config: ModelConfig,
    chunks: Iterable[tuple[int, int, int]],
    dtype_bytes: float,
    kv_dtype_bytes: float | None = None,
    matmul_bytes: MatmulBytes | None = None,
) -> StepWork:
    """FLOPs and bytes of one step.

    Args:
        chunks: per scheduled sequence ``(num_new_tokens, num_context_tokens, num_logits_rows)``
            as in ``StepRecord.chunks``: tokens run this step, tokens already in the KV cache
            before them, and the rows the LM head ran on (0 for a chunk that stops mid-prompt, 1,
            or k + 1 when a target model verifies k draft tokens; True counts as 1).
        dtype_bytes: bytes per weight element (4 fp32, 2 bf16/fp16, 0.5 for 4-bit weights).
        kv_dtype_bytes: bytes per KV-cache element; defaults to ``dtype_bytes``.
        matmul_bytes: the matrix products' weight bytes when they are not ``dtype_bytes`` per
            parameter (quantized: ``quantization.matmul_bytes``); the embedding rows and norms
            stay at ``dtype_bytes``.
    Raises:
        ValueError: a chunk with no new tokens, a negative context, or more logits rows than
            new tokens; a non-positive dtype size.
    """
    cfg = model_config
    kv_dtype_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    if dtype_bytes <= 0 or kv_dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes={dtype_bytes}, kv_dtype_bytes={kv_dtype_bytes}: both must be > 0")
    head_params = cfg.hidden_size * cfg.vocab_size
    layer_params = prefill_params_per_token(cfg)  # every decoder layer's matmul weights
    kv_per_token = cfg.kv_bytes_per_token(kv_dtype_bytes)  # 2 * layers * num_kv_heads * head_dim * bytes
    attn_per_key = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
    new_tokens = logits_rows = context_keys = attended_keys = 0
    for num_new, num_context, num_logits_rows in chunks:
        rows = int(num_logits_rows)
        if num_new < 1 or num_context < 0 or not 0 <= rows <= num_new:
            raise ValueError(
                f"chunk (num_new_tokens={num_new}, num_context_tokens={num_context}, "
                f"num_logits_rows={num_logits_rows}) is invalid: need num_new_tokens >= 1, "
                "num_context_tokens >= 0 and 0 <= logits rows <= num_new_tokens"
            )
        new_tokens += num_new
        logits_rows += rows
        context_keys += num_context + num_new  # keys read from the cache, new ones included
        attended_keys += num_new * num_context + num_new * (num_new + 1) // 2  # causal sum
    norm_params = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size
    if matmul_bytes is None:
        matmul_bytes = MatmulBytes(layer_params * dtype_bytes, head_params * dtype_bytes)
    weight_bytes = (
        (norm_params + new_tokens * cfg.hidden_size) * dtype_bytes
        + matmul_bytes.layers
        + (matmul_bytes.lm_head if logits_rows else 0)
    )
    return StepWork(
        matmul_flops=2 * layer_params * new_tokens,
        attention_flops=attn_per_key * attended_keys,
        lm_head_flops=2 * head_params * logits_rows,
        weight_bytes=weight_bytes,
        kv_read_bytes=kv_per_token * context_keys,
        kv_write_bytes=kv_per_token * new_tokens,
    )


def prefill_work(
    model_config: ModelConfig,
    prompt_tokens: int,
    dtype_bytes: float,
    num_cached_tokens: int = 0,
    matmul_bytes: MatmulBytes | None = None,
) -> StepWork:
    """One sequence's whole prefill in one step: ``prompt_tokens - num_cached_tokens`` new tokens
    after ``num_cached_tokens`` (a prefix-cache hit), logits for the last position only."""
    return step_work(
        model_config,
        [(prompt_tokens - num_cached_tokens, num_cached_tokens, True)],
        dtype_bytes,
        matmul_bytes=matmul_bytes,
    )


def masked_attention_flops(model_config: ModelConfig, chunks: Iterable[tuple[int, int, int]]) -> int:
    """What a dense attention kernel computes beyond ``step_work``'s causal count on a step's chunks.

    A kernel handed a chunk of T new tokens and its C cached keys computes the whole T x (C + T)
    score rectangle (and PV product), then masks the T (T - 1) / 2 query-key pairs above the
    diagonal: 4 * num_heads * head_dim FLOPs each, per layer. That is how torch's FlopCounterMode
    counts SDPA, and what eager attention (explicit matmuls, then a mask) does. A decode chunk
    (T = 1) masks nothing here; a kernel's padding of the keys (to whole blocks, or a batch's
    longest sequence) is not counted either.
    """
    cfg = model_config
    pairs = sum(n * (n - 1) // 2 for n, _, _ in chunks)
    return 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * pairs


def decode_work(
    model_config: ModelConfig,
    batch_size: int,
    context_len: int,
    dtype_bytes: float,
    matmul_bytes: MatmulBytes | None = None,
) -> StepWork:
    """One decode step of ``batch_size`` sequences, each with ``context_len`` tokens already in the
    KV cache: one new token each (attending ``context_len + 1`` keys), logits for each."""
    return step_work(model_config, [(1, context_len, True)] * batch_size, dtype_bytes, matmul_bytes=matmul_bytes)


def attention_crossover_tokens(model_config: ModelConfig) -> int:
    """The shortest prompt whose prefill (one step, nothing cached) does at least as many attention
    FLOPs as linear-layer FLOPs.

    With L layers, H query heads of dim D and N matmul parameters in the layers (LM head excluded:
    a prefill runs it for one row only), ``step_work`` counts 2 N n for the linear layers and
    4 L H D n (n + 1) / 2 for causal attention, so they meet at n + 1 = N / (L H D): a property
    of the shape alone (no dtype, no device). SmolLM2-135M: about 6,100 tokens; Llama-3-8B: about
    53,000, past its 8,192-token context.
    """
    cfg = model_config
    layer_params = prefill_params_per_token(cfg)
    per_key = cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
    return max(1, math.ceil(layer_params / per_key - 1))


def decode_ridge_batch(
    model_config: ModelConfig,
    context_len: int,
    dtype_bytes: float,
    ridge: float,
    matmul_bytes: MatmulBytes | None = None,
) -> int | None:
    """The smallest decode batch whose arithmetic intensity reaches ``ridge`` (FLOP/byte): where a
    decode step of sequences with ``context_len`` cached tokens each turns compute-bound.

    A step's FLOPs and bytes grow linearly with the batch, flops = b f and bytes = W + b k (W: the
    weights, read once for the batch; k: each sequence's KV and embedding row), so the intensity
    b f / (W + b k) rises towards f / k and never beyond it. Returns None when f / k <= ridge:
    each sequence brings too many bytes of its own (its KV cache) for its FLOPs, and no batch
    turns the step compute-bound (long contexts, or a GPU's high ridge). ``matmul_bytes``: a
    quantized model's weight bytes, as in ``step_work``. Raises ``ValueError`` for ``ridge`` <= 0.
    """
    if ridge <= 0:
        raise ValueError(f"ridge={ridge} FLOP/byte must be > 0")
    one, two = (decode_work(model_config, b, context_len, dtype_bytes, matmul_bytes) for b in (1, 2))
    f = one.total_flops
    k = two.total_bytes - one.total_bytes
    w = one.total_bytes - k
    if f <= ridge * k:
        return None
    return max(1, math.ceil(ridge * w / (f - ridge * k) - 1e-9))
