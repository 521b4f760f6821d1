"""minieng's model against transformers: logits within 1e-4 in fp32 (3e-4 for the real model) and
greedy tokens equal.

Tiny random configs cover every supported architecture and the options that change the math
(tied LM head, Llama 3 RoPE scaling, q/k/v/o and MLP biases, head_dim != hidden / heads, Qwen2's
q/k/v bias). Logits are read through the engine's own runner (``ModelRunner.prepare``) with the
LM head applied at every row, so prefill, chunked prefill, batched decodes and a mixed batch are
each compared position by position. The real-model tests repeat the comparison on the embedded
SmolLM2-135M-Instruct with chat prompts.
"""

from __future__ import annotations

import pytest
import torch
from helpers import (
    TINY_KINDS,
    DirectRunner,
    assert_same_or_near_tie,
    chat_ids,
    hf_greedy,
    hf_greedy_batch,
    hf_logits,
    hf_next_logits,
    make_engine,
    random_prompts,
    tiny_hf_config,
    tiny_hf_model,
    tiny_pair,
)

from minieng import ModelConfig, SamplingParams
from minieng.core.llama import LlamaForCausalLM
from minieng.model.loader import LoadedModel, build_model

ATOL = 1e-4
# The real model: 30 fp32 layers whose products run in oneDNN here and in MKL in transformers
# (model.linear), so the sums are accumulated in a different order; its logits reach ~30, and
# 3e-4 is 1e-5 of that. A wrong weight or mask moves logits by whole units.
REAL_ATOL = 3e-4


@pytest.fixture(scope="module", params=TINY_KINDS)
def pair(request):
    return tiny_pair(tiny_hf_config(request.param), seed=1)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"shapes {tuple(a.shape)} != {tuple(b.shape)}"
    return (a - b).abs().max().item()


# -- tiny random models -----------------------------------------------------------------------------


def test_config_is_read_faithfully(pair):
    hf, loaded = pair
    cfg = loaded.hf_config
    ours = loaded.model.config
    assert ours.model_type == cfg.model_type
    assert ours.tie_word_embeddings == cfg.tie_word_embeddings
    assert (loaded.model.lm_head.weight is loaded.model.embed_tokens.weight) == cfg.tie_word_embeddings
    assert ours.head_dim == (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    # Same number of parameters as transformers (a tied head counted once by both).
    hf_params = sum(p.numel() for p in hf.parameters())
    assert sum(p.numel() for p in loaded.model.parameters()) == hf_params


def test_prefill_logits_match_transformers(pair):
    hf, loaded = pair
    engine = make_engine(loaded)
    prompt = random_prompts([37], loaded.model.config.vocab_size, seed=2)[0]
    direct = DirectRunner(engine)
    ours = direct.prefill(direct.new_seq(prompt))
    ref = hf_logits(hf, prompt)
    assert ref.std() > 0.1, "degenerate reference logits would make the comparison vacuous"
    assert max_diff(ours, ref) <= ATOL


def test_chunked_prefill_logits_match_transformers(pair):
    hf, loaded = pair
    engine = make_engine(loaded)
    prompt = random_prompts([37], loaded.model.config.vocab_size, seed=3)[0]
    direct = DirectRunner(engine)
    # Chunks ending inside and on block boundaries (block_size 4), one of a single token.
    ours = direct.prefill(direct.new_seq(prompt), chunks=[5, 1, 7, 3, 13, 8])
    assert max_diff(ours, hf_logits(hf, prompt)) <= ATOL


def test_decode_logits_match_transformers(pair):
    hf, loaded = pair
    engine = make_engine(loaded)
    vocab = loaded.model.config.vocab_size
    prompt, continuation = random_prompts([13, 30], vocab, seed=4)
    ref = hf_logits(hf, prompt + continuation)
    direct = DirectRunner(engine)
    seq = direct.new_seq(prompt)
    assert max_diff(direct.prefill(seq), ref[:13]) <= ATOL
    for j, tok in enumerate(continuation):
        ours = direct.decode([seq], [tok])[0]
        assert max_diff(ours, ref[13 + j]) <= ATOL, f"decode step {j}"


def test_mixed_batch_logits_match_transformers(pair):
    """One step holding two decodes of different context lengths, a prefill chunk continuing a
    partly cached prompt, and a fresh prompt: every row equals transformers' logits."""
    hf, loaded = pair
    engine = make_engine(loaded)
    vocab = loaded.model.config.vocab_size
    pa, pb, pc, pd, extra = random_prompts([9, 23, 30, 6, 8], vocab, seed=5)
    direct = DirectRunner(engine)
    a, b, c, d = (direct.new_seq(p) for p in (pa, pb, pc, pd))
    direct.prefill(a)
    direct.prefill(b)
    direct.decode([a], extra[:1])
    direct.decode([a, b], extra[1:3])  # a and b now hold 11 and 24 tokens
    direct.step([(c, 11)])  # c: 11 of 30 prompt tokens cached
    a.output_token_ids.append(extra[3])
    b.output_token_ids.append(extra[4])
    logits = direct.step([(a, 1), (b, 1), (c, 12), (d, 6)], every_row=True)
    assert logits.shape[0] == 1 + 1 + 12 + 6
    ref_a = hf_logits(hf, a.all_token_ids)[-1]
    ref_b = hf_logits(hf, b.all_token_ids)[-1]
    ref_c = hf_logits(hf, pc)[11:23]
    ref_d = hf_logits(hf, pd)
    assert max_diff(logits[0], ref_a) <= ATOL
    assert max_diff(logits[1], ref_b) <= ATOL
    assert max_diff(logits[2:14], ref_c) <= ATOL
    assert max_diff(logits[14:], ref_d) <= ATOL


def test_greedy_tokens_match_transformers_generate(pair):
    hf, loaded = pair
    engine = make_engine(loaded)
    prompts = random_prompts([5, 17, 40], loaded.model.config.vocab_size, seed=6)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    for prompt, out in zip(prompts, outputs):
        assert len(out.token_ids) == 24
        ref = hf_greedy(hf, prompt, 24)
        assert_same_or_near_tie(ref, out.token_ids, prompt, hf_next_logits(hf), what=f"prompt of {len(prompt)}")


def test_build_model_supports_llama3_rope_scaling():
    """Llama 3.1/3.2 checkpoints use rope_type "llama3": ``build_model`` must build them, with the
    same RoPE tables transformers computes."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = tiny_hf_config("llama3_rope")
    model = build_model(ModelConfig.from_hf(config), torch.float32, torch.device("cpu"), 256)
    inv_freq, scaling = ROPE_INIT_FUNCTIONS["llama3"](config, device="cpu")
    angles = torch.outer(torch.arange(256, dtype=torch.float32), inv_freq.float())
    table = model.rope.freqs_cis  # [positions, head_dim / 2]: one rotation per pair of dimensions
    assert torch.allclose(table.real, angles.cos() * scaling, atol=1e-6)
    assert torch.allclose(table.imag, angles.sin() * scaling, atol=1e-6)


def test_llama3_rope_scaling_logits_match_transformers():
    """The llama3 RoPE math itself, on a model constructed directly (not through build_model)."""
    config = tiny_hf_config("llama3_rope")
    hf = tiny_hf_model(config, seed=1)
    model = LlamaForCausalLM(ModelConfig.from_hf(config), config.max_position_embeddings).eval()
    model.load_weights(hf.state_dict().items())
    engine = make_engine(LoadedModel(model, None, config, set(), None))
    # Positions past original_max_position_embeddings (64), where the scaling matters.
    prompt, continuation = random_prompts([90, 20], config.vocab_size, seed=7)
    ref = hf_logits(hf, prompt + continuation)
    direct = DirectRunner(engine)
    seq = direct.new_seq(prompt)
    assert max_diff(direct.prefill(seq, chunks=[33, 57]), ref[:90]) <= ATOL
    for j, tok in enumerate(continuation):
        assert max_diff(direct.decode([seq], [tok])[0], ref[90 + j]) <= ATOL, f"decode step {j}"
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    assert_same_or_near_tie(hf_greedy(hf, prompt, 16), out.token_ids, prompt, hf_next_logits(hf), what="llama3")


def test_mistral_sliding_window_caps_the_context():
    from transformers import MistralConfig

    config = MistralConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=256,
        sliding_window=32,
    )
    assert ModelConfig.from_hf(config).max_position_embeddings == 32
    config.sliding_window = None
    assert ModelConfig.from_hf(config).max_position_embeddings == 256


def test_unsupported_architecture_is_a_value_error():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="model_type='gpt2'"):
        ModelConfig.from_hf(GPT2Config(n_layer=1))


def test_load_weights_rejects_unknown_and_missing_tensors(tiny_llama):
    hf, loaded = tiny_llama
    state = dict(hf.state_dict())
    with pytest.raises(ValueError, match="no_such"):
        loaded.model.load_weights(list(state.items()) + [("model.layers.0.no_such.weight", torch.zeros(1))])
    missing = [(k, v) for k, v in state.items() if "layers.1.mlp.up_proj" not in k]
    with pytest.raises(ValueError, match="lacks"):
        loaded.model.load_weights(missing)
    wrong = dict(state)
    wrong["model.norm.weight"] = torch.ones(7)
    with pytest.raises(ValueError, match="norm.weight"):
        loaded.model.load_weights(wrong.items())
    loaded.model.load_weights(state.items())  # restore the shared fixture's weights


# -- the embedded default model ---------------------------------------------------------------------

CHAT_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three prime numbers greater than ten and say why each is prime.",
    "Give me a short recipe for pancakes.",
]


@pytest.mark.real_model
def test_real_model_logits_match_transformers(default_model, hf_default, real_engine):
    tok = default_model.tokenizer
    prompt = chat_ids(tok, "Explain what a KV cache is in a language model, briefly.")
    continuation = tok.encode(" A KV cache stores the keys and values of past tokens.")
    ref = hf_logits(hf_default, prompt + continuation)
    direct = DirectRunner(real_engine())
    seq = direct.new_seq(prompt)
    n = len(prompt)
    assert max_diff(direct.prefill(seq), ref[:n]) <= REAL_ATOL
    for j, t in enumerate(continuation):
        assert max_diff(direct.decode([seq], [t])[0], ref[n + j]) <= REAL_ATOL, f"decode step {j}"


@pytest.mark.real_model
def test_real_model_greedy_matches_transformers_generate(default_model, hf_default, real_engine):
    prompts = [chat_ids(default_model.tokenizer, text) for text in CHAT_PROMPTS]
    outputs = real_engine().generate(prompts, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    refs = hf_greedy_batch(hf_default, prompts, 64)  # a divergence is judged on unpadded logits
    for text, prompt, out, ref in zip(CHAT_PROMPTS, prompts, outputs, refs):
        assert len(out.token_ids) == 64 and len(ref) == 64
        assert_same_or_near_tie(ref, out.token_ids, prompt, hf_next_logits(hf_default), what=repr(text))


# -- the linear layers' kernel ----------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_equals_torch_linear(rows, bias):
    """model.linear (oneDNN on x86-64 CPUs in fp32) computes F.linear's product."""
    from minieng.core.llama import linear

    gen = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 96, generator=gen), torch.randn(160, 96, generator=gen)
    b = torch.randn(160, generator=gen) if bias else None
    torch.testing.assert_close(linear(x, w, b), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_linear_flops_are_counted_whatever_the_kernel():
    """FlopCounterMode counts 2 * rows * in * out for llama.linear, as for aten.mm, once the
    instruments registered their formulas (where counting starts, never at import)."""
    from torch.utils.flop_counter import FlopCounterMode

    from minieng.measure.flop_count import register_flop_formulas
    from minieng.core.llama import linear

    register_flop_formulas()
    with FlopCounterMode(display=False) as counter:
        linear(torch.randn(5, 96), torch.randn(160, 96))
    assert counter.get_total_flops() == 2 * 5 * 96 * 160
