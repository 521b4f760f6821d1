"""The primer's two pictures (notebook 00), drawn from a model's real shape (a ``ModelConfig``), never pasted in.

- ``forward_pass_diagram``: token ids -> embedding -> the decoder layers (attention reads its weights and the
  KV cache, the MLP its weights) -> final norm -> LM head -> logits, each block annotated with the bytes
  it reads in one forward pass.
- ``two_phases_diagram``: one request on a timeline: prefill writes every prompt token's K and V at once,
  each decode step reads them all and adds one; the KV bytes per token (2 x layers x KV heads x head_dim x
  bytes) computed and shown, and what each clock (TTFT, TPOT, ITL) measures.

Both are arithmetic on the shape: no weights, no device. Each returns a matplotlib ``Figure``.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from minieng.config import ModelConfig
from minieng.viz.style import PHASE_COLORS

LAYER_GID = "decoder-layer"  # the gid of each decoder layer's box in the forward-pass diagram (one per layer)
STEP_GID = "step"  # the gid of each forward pass's bar in the two-phases diagram
WEIGHT_COLOR, KV_COLOR, LIGHT = "#d9e6f5", "#fde2c4", "#f2f2f2"


def nbytes(n: float) -> str:
    """A byte count in decimal units, as the course prints them: "768 B", "46.1 KB", "538 MB", "3.4 GB"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class ShapeBytes:
    """What one forward pass reads, by block, in bytes (``shape_bytes``); per token where it says so."""

    embedding_row: float  # one looked-up row, per token
    attention_weights: float  # q, k, v, o of one layer
    mlp_weights: float  # gate, up, down of one layer
    norm: float  # one RMSNorm's weight vector
    lm_head: float  # hidden x vocab (the embedding table, when tied)
    kv_per_token_layer: float  # one token's K and V in one layer
    kv_per_token: float  # 2 x layers x KV heads x head_dim x bytes
    weights_per_pass: float  # every layer's weights + the final norm + the LM head (embedding rows aside)


def shape_bytes(cfg: ModelConfig, dtype_bytes: float) -> ShapeBytes:
    """The bytes of each block of ``cfg`` in ``dtype_bytes`` per value (4 fp32, 2 bf16/fp16)."""
    h, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    attention = (h * (q + 2 * kv) + q * h) * dtype_bytes
    mlp = 3 * h * cfg.intermediate_size * dtype_bytes
    norm = h * dtype_bytes
    lm_head = h * cfg.vocab_size * dtype_bytes
    return ShapeBytes(
        embedding_row=h * dtype_bytes,
        attention_weights=attention,
        mlp_weights=mlp,
        norm=norm,
        lm_head=lm_head,
        kv_per_token_layer=2 * kv * dtype_bytes,
        kv_per_token=cfg.kv_bytes_per_token(dtype_bytes),
        weights_per_pass=cfg.num_hidden_layers * (attention + mlp + 2 * norm) + norm + lm_head,
    )


def kv_formula(cfg: ModelConfig, dtype_bytes: float) -> str:
    """The KV bytes per token, written out: "2 x 30 layers x 3 KV heads x 64 head_dim x 2 B = 23,040 B"."""
    return (
        f"2 × {cfg.num_hidden_layers} layers × {cfg.num_key_value_heads} KV heads × {cfg.head_dim} head_dim"
        f" × {dtype_bytes:g} B = {cfg.kv_bytes_per_token(dtype_bytes):,.0f} B"
    )


def _box(ax, x, y, w, h, text, color=LIGHT, fontsize=9, **kwargs):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="black", lw=1, **kwargs))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, zorder=5)


def _arrow(ax, start, end, both=False, color="black", **kwargs):
    style = "<|-|>" if both else "-|>"
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, color=color, lw=1, **kwargs))


def _note(ax, x, y, text, color="dimgray"):
    ax.text(x, y, text, ha="center", va="top", fontsize=7.5, color=color)


def forward_pass_diagram(cfg: ModelConfig, dtype_bytes: float, name: str = "the model", dtype: str = "") -> Figure:
    """One forward pass of ``cfg``, block by block, with the bytes each block reads (``shape_bytes``).

    One box is drawn per decoder layer (gid ``LAYER_GID``), stacked behind the first, whose attention and
    MLP are drawn inside it; the layer count is written above the stack.

    Args:
        cfg: the model's shape (layers, hidden, heads, KV heads, head_dim, vocab).
        dtype_bytes: bytes per weight and per KV value in the engine's dtype.
        name, dtype: for the title ("SmolLM2-135M", "float32").
    """
    b = shape_bytes(cfg, dtype_bytes)
    layers = cfg.num_hidden_layers
    fig = Figure(figsize=(12, 5.2), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xlim(0, 12.4)
    ax.set_ylim(0, 5.2)
    ax.axis("off")
    y, h = 2.3, 1.6  # the main row
    _box(ax, 0.1, y + 0.3, 1.0, 1.0, "token ids\n(n tokens)")
    _box(ax, 1.5, y, 1.4, h, f"Embedding\n{cfg.vocab_size:,} × {cfg.hidden_size}", WEIGHT_COLOR)
    _note(ax, 2.2, y - 0.1, f"reads 1 row a token:\n{nbytes(b.embedding_row)} / token")
    # The decoder layers: one box per layer, the last ones behind the first.
    x0, w0, h0, depth = 3.3, 4.0, 2.5, 0.45
    for k in reversed(range(layers)):
        off = depth * k / max(layers - 1, 1)
        ax.add_patch(
            Rectangle((x0 + off, y - 0.45 + off), w0, h0, facecolor="white", edgecolor="gray", lw=0.6, gid=LAYER_GID)
        )
    ax.text(x0 + w0 / 2 + depth / 2, y + h0 + depth - 0.3, f"× {layers} decoder layers", ha="center", fontsize=10)
    _box(ax, x0 + 0.2, y + 0.35, 1.7, 1.2, f"Attention\nq, k, v, o\n{cfg.num_attention_heads} heads", WEIGHT_COLOR)
    _box(ax, x0 + 2.15, y + 0.35, 1.65, 1.2, "MLP\ngate, up, down", WEIGHT_COLOR)
    _arrow(ax, (x0 + 1.9, y + 0.95), (x0 + 2.15, y + 0.95))
    _note(ax, x0 + 1.05, y + 0.3, f"weights {nbytes(b.attention_weights)} a layer")
    _note(ax, x0 + 2.97, y + 0.3, f"weights {nbytes(b.mlp_weights)} a layer")
    # This layer's share of the KV cache, under the attention.
    _box(
        ax,
        x0 - 0.1,
        0.15,
        2.6,
        1.15,
        f"KV cache (this layer)\n2 × {cfg.num_key_value_heads} KV heads × {cfg.head_dim} head_dim"
        f" × {dtype_bytes:g} B\n= {nbytes(b.kv_per_token_layer)} per token of context",
        KV_COLOR,
        fontsize=8,
    )
    _arrow(ax, (x0 + 1.05, 1.3), (x0 + 1.05, y - 0.45), both=True, color="tab:orange")
    ax.text(x0 + 1.15, 1.55, "reads every earlier token's K, V;\nwrites this token's", fontsize=7.5, color="tab:orange")
    _box(ax, 8.1, y, 1.1, h, "Final\nnorm")
    _note(ax, 8.65, y - 0.1, nbytes(b.norm))
    tied = " (tied: the\nembedding table,\nread whole)" if cfg.tie_word_embeddings else ""
    _box(ax, 9.5, y, 1.4, h, f"LM head\n{cfg.hidden_size} × {cfg.vocab_size:,}", WEIGHT_COLOR)
    _note(ax, 10.2, y - 0.1, f"{nbytes(b.lm_head)}{tied}")
    _box(ax, 11.2, y + 0.3, 1.1, 1.0, f"logits\n{cfg.vocab_size:,}\nscores")
    for start, end in [(1.1, 1.5), (2.9, x0), (x0 + w0 + depth, 8.1), (9.2, 9.5), (10.9, 11.2)]:
        _arrow(ax, (start, y + 0.8), (end, y + 0.8))
    dtype_text = f" in {dtype}" if dtype else ""
    ax.set_title(
        f"One forward pass of {name}{dtype_text}: {layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_attention_heads} heads, {cfg.num_key_value_heads} KV heads × head_dim {cfg.head_dim}, "
        f"vocab {cfg.vocab_size:,}\nweights read per pass: {nbytes(b.weights_per_pass)}, whether it carries "
        "one token or a thousand (blue: weights; orange: KV cache)",
        fontsize=10,
    )
    return fig


def two_phases_diagram(
    cfg: ModelConfig, dtype_bytes: float, prompt_tokens: int = 512, output_tokens: int = 5, name: str = "the model"
) -> Figure:
    """One request on a timeline (schematic widths): a prefill of ``prompt_tokens``, then
    ``output_tokens - 1`` decode steps; under it the KV cache each step leaves, in tokens and bytes,
    and the clocks TTFT, ITL, TPOT and E2EL drawn where they are read.

    Each forward pass is a bar with gid ``STEP_GID``; the KV bytes per token (``kv_formula``) is in the title.
    Raises ``ValueError`` for fewer than 1 prompt token or 2 output tokens (TPOT needs two).
    """
    if prompt_tokens < 1 or output_tokens < 2:
        raise ValueError(f"prompt_tokens={prompt_tokens}, output_tokens={output_tokens}: need >= 1 and >= 2")
    per_token = cfg.kv_bytes_per_token(dtype_bytes)
    fig = Figure(figsize=(12, 5.6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[1.25, 1])
    queue, prefill_w, decode_w, gap = 0.4, 3.0, 1.0, 0.25
    starts = [queue] + [queue + prefill_w + gap + k * (decode_w + gap) for k in range(output_tokens - 1)]
    widths = [prefill_w] + [decode_w] * (output_tokens - 1)
    ends = [s + w for s, w in zip(starts, widths)]
    cached = [prompt_tokens + k for k in range(output_tokens)]  # tokens in the cache after each step
    for k, (s, w) in enumerate(zip(starts, widths)):
        phase = "prefill" if k == 0 else "decode"
        top.add_patch(Rectangle((s, 1.0), w, 0.9, facecolor=PHASE_COLORS[phase], alpha=0.8, gid=STEP_GID))
        label = f"prefill: {prompt_tokens:,} tokens,\none forward pass" if k == 0 else f"decode {k}"
        top.text(s + w / 2, 1.45, label, ha="center", va="center", fontsize=8.5, color="white")
        top.plot([s + w], [0.75], marker="v", color="black")
        top.text(s + w, 0.5, f"token {k + 1}", ha="center", fontsize=7.5)
        bottom.bar(s + w / 2, cached[k], width=w, color=PHASE_COLORS[phase], alpha=0.35 if k else 0.8)
        did = f"reads {cached[k] - 1:,} tokens'\nK, V; writes 1" if k else f"writes {prompt_tokens:,} tokens' K, V"
        bottom.text(
            s + w / 2, cached[k] * 1.02, f"{did}\ncache: {nbytes(cached[k] * per_token)}", ha="center", fontsize=7
        )
    # The clocks, from the arrival (t = 0) and the emissions (the ends of the steps).
    _arrow(top, (0, 2.15), (ends[0], 2.15), both=True)
    top.text(ends[0] / 2, 2.25, "TTFT: arrival → first token (queue + prefill)", ha="center", fontsize=8)
    _arrow(top, (ends[0], 0.3), (ends[1], 0.3), both=True, color="tab:blue")
    top.text((ends[0] + ends[1]) / 2, 0.05, "ITL: one gap", ha="center", fontsize=7.5, color="tab:blue")
    _arrow(top, (ends[0], 2.75), (ends[-1], 2.75), both=True, color="tab:blue")
    top.text(
        (ends[0] + ends[-1]) / 2,
        2.85,
        f"TPOT = (E2EL − TTFT) / ({output_tokens} − 1): decode's mean pace",
        ha="center",
        fontsize=8,
        color="tab:blue",
    )
    _arrow(top, (0, 3.35), (ends[-1], 3.35), both=True, color="dimgray")
    top.text(ends[-1] / 2, 3.45, "E2EL: arrival → last token", ha="center", fontsize=8, color="dimgray")
    top.text(0, 1.45, "arrival", ha="right", va="center", fontsize=8)
    top.set_ylim(0, 3.8)
    top.set_yticks([])
    top.spines[["left", "right", "top"]].set_visible(False)
    bottom.set_ylabel("tokens in the KV cache")
    bottom.set_ylim(0, cached[-1] * 1.45)
    bottom.set_xlabel("time (schematic: the widths are drawn, not measured; notebook 01 times both phases)")
    bottom.set_xticks([])
    bottom.set_xlim(-0.6, ends[-1] + 0.3)
    fig.suptitle(
        f"Two phases of one request to {name}: KV bytes per token = {kv_formula(cfg, dtype_bytes)}\n"
        f"prefill writes {prompt_tokens:,} tokens' K and V at once; each decode step reads them all and adds one",
        fontsize=10,
    )
    return fig
