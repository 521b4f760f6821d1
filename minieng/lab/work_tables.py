"""The tables the course prints from a model's shape alone: computed, not measured.

Each function returns a table's lines (``print("\\n".join(...))``), from ``measure.flops_bytes``'s
formulas: a prefill's FLOPs against the article's 2·P·n, each step's FLOPs, bytes and side of the
ridge, and the KV cache's bytes per token beside the weights.
"""

from __future__ import annotations

from dataclasses import replace

from minieng.config import ModelConfig, published_config
from minieng.measure.flops_bytes import decode_work, prefill_work
from minieng.units import GIB


def format_prefill_work(cfg: ModelConfig, prompt_tokens: list[int], dtype_bytes: int) -> list[str]:
    """Per prompt length, a prefill's GFLOP: the article's 2·P·n, the linear layers, the LM head
    (one row), attention, the total, attention's share and total / 2·P·n."""
    head = cfg.hidden_size * cfg.vocab_size
    tied = "tied to" if cfg.tie_word_embeddings else "beside"
    lines = [
        f"P = {cfg.num_params / 1e6:.1f}M parameters: {(cfg.num_matmul_params - head) / 1e6:.1f}M in the layers' "
        f"products, {head / 1e6:.1f}M in the LM head ({tied} the embedding)",
        "",
        f"{'prompt':>7} {'2·P·n':>9} {'linear':>9} {'LM head':>8} {'attention':>10} {'total':>9}"
        "  attention share  total / 2·P·n",
    ]
    for n in prompt_tokens:
        w = prefill_work(cfg, n, dtype_bytes)
        two_pn = 2 * cfg.num_params * n
        lines.append(
            f"{n:>7} {two_pn / 1e9:>9.1f} {w.matmul_flops / 1e9:>9.1f} {w.lm_head_flops / 1e9:>8.3f} "
            f"{w.attention_flops / 1e9:>10.1f} {w.total_flops / 1e9:>9.1f}  "
            f"{100 * w.attention_flops / w.total_flops:>14.1f}%  {w.total_flops / two_pn:>12.2f}"
        )
    return [*lines, "(GFLOP, computed from the model's shape)"]


def format_step_work(
    cfg: ModelConfig,
    prompt_tokens: list[int],
    decode_batches: list[int],
    context_tokens: int,
    dtype_bytes: int,
    ridge_flop_per_byte: float,
) -> list[str]:
    """A prefill of each length and a decode step of each batch (``context_tokens`` of context):
    GFLOP, MB moved, FLOP per byte, and which side of ``ridge_flop_per_byte`` it falls on."""
    steps = [(f"prefill {n}", prefill_work(cfg, n, dtype_bytes)) for n in prompt_tokens]
    steps += [(f"decode b{b}", decode_work(cfg, b, context_tokens, dtype_bytes)) for b in decode_batches]
    lines = [f"{'step':<22} {'GFLOP':>8} {'MB':>8} {'FLOP/byte':>10}  side of the ridge"]
    for label, w in steps:
        side = "compute" if w.arithmetic_intensity_flop_per_byte > ridge_flop_per_byte else "memory"
        lines.append(
            f"{label:<22} {w.total_flops / 1e9:>8.2f} {w.total_bytes / 1e6:>8.1f} "
            f"{w.arithmetic_intensity_flop_per_byte:>10.2f}  {side}"
        )
    return lines


def format_kv_bytes(models: list[tuple[str, ModelConfig, int]], sequence_tokens: int = 4096) -> list[str]:
    """Per ``(name, config, dtype bytes)``: the KV cache's bytes per token
    (``ModelConfig.kv_bytes_per_token``), one ``sequence_tokens``-token sequence's KV, and the weights."""
    lines = [f"{'model':<36} {'KV bytes/token':>15} {f'one {sequence_tokens:,}-token sequence':>25} {'weights':>9}"]
    for name, cfg, b in models:
        per_token = cfg.kv_bytes_per_token(b)
        lines.append(
            f"{name:<36} {per_token:>15,} {sequence_tokens * per_token / GIB:>21.2f} GiB {cfg.num_params * b / GIB:>5.1f} GiB"
        )
    return lines


def kv_shapes(cfg: ModelConfig, dtype_bytes: int) -> list[tuple[str, ModelConfig, int]]:
    """``format_kv_bytes``'s rows for a lesson's model: itself, itself without grouped-query attention
    (as many KV heads as query heads), and a Llama-3-8B shape in bf16."""
    mha = replace(cfg, num_key_value_heads=cfg.num_attention_heads)
    return [
        (f"this model, {dtype_bytes}-byte", cfg, dtype_bytes),
        (f"this model without GQA, {dtype_bytes}-byte", mha, dtype_bytes),
        ("Llama-3-8B shape, bf16", published_config("Llama-3-8B"), 2),
    ]


def kv_weights_answer(cfg: ModelConfig, dtype_bytes: int) -> str:
    """A worked answer (Markdown) to "how many tokens of KV cache weigh as much as the weights?"
    from the shape: the bytes per token, the weights' bytes, their ratio."""
    per_token = cfg.kv_bytes_per_token(dtype_bytes)
    weights = cfg.num_params * dtype_bytes
    return (
        f"KV bytes per token = 2 x {cfg.num_hidden_layers} layers x {cfg.num_key_value_heads} KV heads x "
        f"{cfg.head_dim} x {dtype_bytes} bytes = **{per_token:,} bytes**. The weights: {cfg.num_params / 1e6:,.0f}M "
        f"parameters x {dtype_bytes} bytes = {weights / GIB:.2f} GiB. So **{weights // per_token:,} tokens** of KV "
        f"weigh as much as the weights: {weights // per_token // 4096:,} sequences of 4,096 tokens."
    )
