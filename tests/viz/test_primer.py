"""The primer's two diagrams (notebook 00) are drawn from the shape they are given, not from a fixed picture."""

from __future__ import annotations

import io
import re

import pytest
from matplotlib.figure import Figure

from minieng.config import ModelConfig
from minieng.viz import forward_pass_diagram, two_phases_diagram
from minieng.viz.primer import LAYER_GID, STEP_GID, shape_bytes


def shape(layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, mlp: int, tied: bool = True) -> ModelConfig:
    return ModelConfig(
        model_type="llama",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
        tie_word_embeddings=tied,
    )


SMOL = shape(30, 576, 9, 3, 49152, 1536)  # SmolLM2-135M's shape
WIDE = shape(7, 1024, 16, 16, 32000, 4096, tied=False)  # another: no GQA, an untied head


def texts(fig: Figure) -> str:
    found = [fig._suptitle.get_text()] if fig._suptitle else []
    for ax in fig.axes:
        found += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()] + [t.get_text() for t in ax.texts]
    return "\n".join(found)


def renders(fig: Figure) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.getvalue().startswith(b"\x89PNG") and len(buf.getvalue()) > 2000


@pytest.mark.parametrize("cfg, dtype_bytes", [(SMOL, 4), (SMOL, 2), (WIDE, 2)])
def test_two_phases_shows_the_kv_bytes_per_token_of_the_shape_given(cfg, dtype_bytes):
    fig = two_phases_diagram(cfg, dtype_bytes, prompt_tokens=100, output_tokens=4)
    renders(fig)
    label = re.search(
        r"KV bytes per token = 2 × (\d+) layers × (\d+) KV heads × (\d+) head_dim × (\d+) B = ([\d,]+) B", texts(fig)
    )
    assert label, texts(fig)
    layers, kv, hd, nbytes, total = (int(g.replace(",", "")) for g in label.groups())
    assert (layers, kv, hd, nbytes) == (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype_bytes)
    assert total == 2 * layers * kv * hd * nbytes == cfg.kv_bytes_per_token(dtype_bytes)


def test_two_phases_draws_one_prefill_and_a_decode_step_per_later_token_with_the_clocks():
    fig = two_phases_diagram(SMOL, 2, prompt_tokens=64, output_tokens=6)
    bars = [p for ax in fig.axes for p in ax.patches if p.get_gid() == STEP_GID]
    assert len(bars) == 6  # the prefill, then 5 decode steps
    text = texts(fig)
    for clock in ("TTFT", "TPOT", "ITL", "E2EL"):
        assert clock in text
    assert "prefill: 64 tokens" in text and "decode 5" in text and "decode 6" not in text
    assert "reads 68 tokens'" in text  # the last decode step reads the prompt and the 4 tokens before it
    with pytest.raises(ValueError):
        two_phases_diagram(SMOL, 2, prompt_tokens=64, output_tokens=1)


@pytest.mark.parametrize("cfg", [SMOL, WIDE])
def test_forward_pass_draws_one_box_per_layer_and_the_bytes_each_block_reads(cfg):
    fig = forward_pass_diagram(cfg, 2, name="m", dtype="bfloat16")
    renders(fig)
    boxes = [p for p in fig.axes[0].patches if p.get_gid() == LAYER_GID]
    assert len(boxes) == cfg.num_hidden_layers
    text = texts(fig)
    assert f"× {cfg.num_hidden_layers} decoder layers" in text
    assert f"vocab {cfg.vocab_size:,}" in text and f"{cfg.num_key_value_heads} KV heads" in text
    b = shape_bytes(cfg, 2)
    # Every weight of the layers once, the final norm and the LM head: num_params less the embedding rows.
    embedding = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    assert b.weights_per_pass == pytest.approx(2 * (cfg.num_params - embedding))
    assert b.kv_per_token == cfg.num_hidden_layers * b.kv_per_token_layer
    assert ("tied" in text) == cfg.tie_word_embeddings


def test_the_default_shape_reads_its_published_weight_bytes():
    """SmolLM2-135M in fp32: 134.5M parameters, a tied head: about 538 MB read per forward pass."""
    assert "weights read per pass: 538 MB" in texts(forward_pass_diagram(SMOL, 4))
