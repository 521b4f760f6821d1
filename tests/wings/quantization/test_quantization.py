"""Quantization: the arithmetic's error bounds, each kernel against its dequantized reference, a
quantized engine that generates, the bytes model with its scales, and the pairs that are refused.

Every kernel that runs on a CPU is exercised here (the CUDA kernels' classes run on a CPU too,
through the same ops or their CPU twins), so CI checks them all without a GPU.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same_or_near_tie, make_engine, random_prompts

from minieng import EngineConfig, SamplingParams
from minieng.config import ModelConfig
from minieng.lab.quant_quality import activation_outliers, quality, sequence_logits
from minieng.measure.flops_bytes import decode_work
from minieng.core.llama import Linear
from minieng.wings.quantization.quant_codes import (
    dequantize_int4_grouped,
    dequantize_per_channel_int8,
    quantize_int4_grouped,
    quantize_per_channel_int8,
    quantize_per_token,
)
from minieng.wings.quantization.quant_kernels import (
    FbgemmLinear,
    Int4Linear,
    Int8WeightOnlyLinear,
    W8A8Linear,
    fbgemm_activation_levels,
)
from minieng.wings.quantization.quantization import (
    KERNELS,
    ReferenceLinear,
    apply_quantization,
    check_supported,
    linear_shapes,
    matmul_bytes,
    model_quantization,
    quantize_model,
    reference_model,
)
from minieng.model.weight_bytes import MatmulBytes, weight_bytes

VOCAB = 300  # the tiny Llama's


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def weights(out_features=96, in_features=128, seed=0) -> torch.Tensor:
    """Random weights with a few outliers and one all-zero row (its scale must not divide by 0)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen) * 0.05
    w[3, 7] = 1.5
    w[5] = 0.0
    return w


# -- 1. quantize / dequantize: error bounds ------------------------------------------------------


def test_per_channel_int8_round_trip_is_within_half_a_step():
    w = weights()
    q, scale = quantize_per_channel_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert torch.allclose(scale[1:5], w[1:5].abs().amax(1) / 127)
    err = (dequantize_per_channel_int8(q, scale) - w).abs()
    assert (err <= scale[:, None] / 2 + 1e-7).all()
    assert err[5].max() == 0  # the zero row comes back exactly


@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_grouped_round_trip_is_within_half_a_step(group_size):
    w = weights()
    q, scale, zero = quantize_int4_grouped(w, group_size)
    assert q.dtype == torch.uint8 and q.max() <= 15 and scale.shape == (96, 128 // group_size)
    deq = dequantize_int4_grouped(q, scale, zero, group_size)
    step = scale.repeat_interleave(group_size, dim=1)
    assert ((deq - w).abs() <= step / 2 + 1e-6).all()
    g = w.reshape(96, -1, group_size)  # each group's extremes are codes 0 and 15, exactly
    assert torch.allclose(deq.reshape(96, -1, group_size).amin(-1), g.amin(-1), atol=1e-6)
    assert torch.allclose(deq.reshape(96, -1, group_size).amax(-1), g.amax(-1), atol=1e-6)


def test_int4_refuses_a_group_that_does_not_divide_the_inputs():
    with pytest.raises(ValueError, match="group_size=48 does not divide in_features=128"):
        quantize_int4_grouped(weights(), 48)


def test_per_token_activations_are_within_half_a_step_of_their_own_token():
    x = torch.randn(6, 40)
    x[2] *= 100  # an outlier token does not coarsen the others
    for levels in (63, 127):
        fq = quantize_per_token(x, levels)
        step = x.abs().amax(-1, keepdim=True) / levels
        assert ((fq - x).abs() <= step / 2 + 1e-6).all()
        assert torch.equal(quantize_per_token(x[:2], levels), fq[:2])  # a token's codes ignore its batch-mates


# -- 2. each kernel equals its dequantized reference ---------------------------------------------

X = torch.randn(5, 128, generator=torch.Generator().manual_seed(1)) * 2
BIAS = torch.randn(96, generator=torch.Generator().manual_seed(2))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


# 7-bit codes everywhere; 8-bit ones where this CPU's kernel sums them exactly (AVX-512 VNNI).
LEVELS = [63] + ([127] if fbgemm_activation_levels() == 127 else [])


@pytest.mark.parametrize("levels", LEVELS, ids=lambda n: f"{n} levels")
@pytest.mark.parametrize("bias", [None, BIAS], ids=["no bias", "bias"])
def test_fbgemm_w8a8_equals_its_reference(bias, levels):
    """Same integer codes on both sides (fbgemm's rounding of x / s is the per-token rounding):
    only float32 summation order differs. Tolerance 1e-5 of the largest output."""
    w = weights()
    got = FbgemmLinear(w, bias, digits=1, activation_levels=levels)(X)
    ref = ReferenceLinear(w, bias, "w8a8", 64, activation_levels=levels)(X)
    assert rel_err(got, ref) < 1e-5


@pytest.mark.parametrize("levels", LEVELS, ids=lambda n: f"{n} levels")
def test_fbgemm_two_digits_is_weight_only_int8_within_the_digit_bound(levels):
    """Two digits of L levels per token: each activation is off by at most max|x| / (2 L x 2 L),
    so each output by at most that times the row's sum of |w|: the stated tolerance."""
    w = weights()
    layer = FbgemmLinear(w, BIAS, digits=2, activation_levels=levels)
    got = layer(X)
    q, scale = quantize_per_channel_int8(w)
    w_deq = dequantize_per_channel_int8(q, scale)
    ref = ReferenceLinear(w, BIAS, "int8", 64, activation_levels=None)(X)
    bound = X.abs().amax(-1, keepdim=True) / (2 * levels * 2 * levels) * w_deq.abs().sum(1)
    assert ((got - ref).abs() <= bound + 1e-5 * ref.abs().max()).all()
    one_digit = FbgemmLinear(w, BIAS, digits=1, activation_levels=levels)(X)
    assert (one_digit - ref).abs().max() > 10 * (got - ref).abs().max()  # the second digit is what buys accuracy


def test_fbgemm_levels_are_what_the_kernel_sums_exactly():
    """The probe's answer holds at the extremes: every code at +-L against weights of +-127 (the
    sums that overflow an int16 pair when L = 127 without VNNI) comes back exact, in both signs;
    levels the kernel cannot sum are refused."""
    levels = fbgemm_activation_levels()
    assert levels in (63, 127)
    w = torch.full((4, 64), 0.5)
    w[1] = -0.5
    layer = FbgemmLinear(w, None, digits=1)
    assert layer.activation_levels == levels
    x = torch.stack([torch.full((64,), 3.0), torch.full((64,), -3.0)])
    exact = x @ dequantize_per_channel_int8(*quantize_per_channel_int8(w)).T
    assert torch.allclose(layer(x), exact, rtol=1e-6)
    with pytest.raises(ValueError, match="activation_levels=100"):
        FbgemmLinear(w, None, digits=1, activation_levels=100)


@pytest.mark.parametrize(
    "make,scheme,levels",
    [
        (lambda w, b: Int8WeightOnlyLinear(w, b), "int8", None),
        (lambda w, b: Int4Linear(w, b, 64), "int4", None),
        (lambda w, b: W8A8Linear(w, b), "w8a8", 127),
    ],
    ids=["int8 weight-only (_weight_int8pack_mm)", "int4 (tinygemm, CPU twin)", "w8a8 (_int_mm)"],
)
def test_torch_op_kernels_equal_their_reference(make, scheme, levels):
    """The CUDA schemes' classes, run on a CPU: float32 summation order is the only difference
    (tolerance 1e-5 of the largest output)."""
    w = weights()
    for bias in (None, BIAS):
        assert rel_err(make(w, bias)(X), ReferenceLinear(w, bias, scheme, 64, levels)(X)) < 1e-5


@pytest.mark.parametrize("device_type", ["cpu", "cuda"], ids=["CPU's rules", "CUDA's rules (padded)"])
def test_w8a8_int_mm_pads_rows_and_returns_only_the_real_ones(device_type):
    """Under CUDA's rules (run here on the CPU's ``_int_mm``) up to 16 rows go through a padded
    buffer whose other rows hold an earlier call's codes: a row's output is its own either way."""
    w = weights()
    layer = W8A8Linear(w, None, device_type=device_type)
    for rows in (16, 1, 17, 25, 3):  # 16 first: the buffer's rows stay filled for the smaller calls
        x = torch.randn(rows, 128)
        assert layer(x).shape == (rows, 96)
        assert torch.allclose(layer(x)[:1], layer(x[:1]), atol=1e-6)  # padding never leaks into a row


# -- 3. quantized models and engines -------------------------------------------------------------


def test_quantize_model_copies_modules_and_shares_the_other_tensors(tiny_llama):
    _, loaded = tiny_llama
    model = loaded.model
    q = quantize_model(model, "int8")
    assert q is not model and model_quantization(q) == ("int8", None) and model_quantization(model) is None
    assert q.embed_tokens.weight is model.embed_tokens.weight  # shared, not copied
    assert q.layers[0].input_layernorm.weight is model.layers[0].input_layernorm.weight
    assert not any(isinstance(m, Linear) for m in q.modules()), "a linear layer stayed float"
    assert sum(isinstance(m, FbgemmLinear) for m in q.modules()) == 4 * len(model.layers) + 1  # + the LM head
    assert all(isinstance(m, Linear) for m in (model.lm_head, model.layers[0].mlp.down_proj))  # untouched
    assert quantize_model(q, "int8") is q
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(q, "w8a8")


def test_apply_quantization_names_the_scheme_a_model_runs(tiny_llama):
    """An engine given a model quantize_model made runs that model's scheme; a float model and a
    dequantized reference (float bytes) run as float."""
    model = tiny_llama[1].model
    q, scheme, group = apply_quantization(model, "int8", 64)
    assert model_quantization(q) == ("int8", None) and (scheme, group) == ("int8", 64)
    assert apply_quantization(q, None, 64) == (q, "int8", 64)
    assert apply_quantization(model, None, 64) == (model, None, 64)
    ref = reference_model(model, "int8")
    assert apply_quantization(ref, None, 64) == (ref, None, 64)


@pytest.mark.parametrize("scheme", ["int8", "w8a8"])
def test_quantized_engine_generates_its_reference_models_tokens(tiny_engine, tiny_llama, scheme):
    """A quantized engine's greedy tokens are its dequantized reference model's (or differ at a
    near-tie of the reference's logits), for prompts decoded alone and together."""
    _, loaded = tiny_llama
    ref = reference_model(
        loaded.model, scheme, activation_levels=fbgemm_activation_levels() if scheme == "w8a8" else None
    )
    engine = tiny_engine(quantization=scheme)
    prompts = random_prompts([5, 9, 13], VOCAB, seed=3)
    outs = engine.generate(prompts, greedy(12))
    for p, o in zip(prompts, outs):
        ref_tokens = [*p]
        for _ in range(12):
            ref_tokens.append(int(sequence_logits(ref, ref_tokens)[-1].argmax()))
        assert_same_or_near_tie(
            ref_tokens[len(p) :],
            o.token_ids,
            p,
            lambda ids: sequence_logits(ref, ids)[-1],
            what=f"{scheme} engine vs its reference",
            tol=2e-3,
        )
    assert engine.memory_plan.weight_bytes < make_engine(loaded).memory_plan.weight_bytes / 2


def test_per_token_w8a8_scales_ignore_batch_mates_on_the_tiny_model(tiny_engine):
    """Per-token activation scales: a token's codes depend on its own values, never on its
    batch-mates' (a scale per batch would let one outlier token coarsen the others). What this
    proves is the mechanics, on the tiny random model, whose activations no last-bit difference
    pushes across a rounding boundary in this sample: its tokens are the same alone and beside
    others. It does not hold on the default model: there a token's values carry the float rounding
    of its schedule (attention over another chunk, products of another shape), and W8A8's rounding
    turns a 1e-6 relative difference into logit shifts of whole units
    (``tests/lab/test_quant_quality.py``), so some requests' greedy tokens differ batched and alone
    (notebook 08, section 5, counts them)."""
    engine = tiny_engine(quantization="w8a8")
    prompts = random_prompts([6, 11, 4, 9], VOCAB, seed=5)
    together = [o.token_ids for o in engine.generate(prompts, greedy(10))]
    alone = [engine.generate([p], greedy(10))[0].token_ids for p in prompts]
    assert together == alone


def test_int4_reference_model_generates_on_a_cpu(tiny_engine, tiny_llama):
    """int4's kernel is refused on a CPU, but its dequantized reference runs anywhere (accuracy)."""
    _, loaded = tiny_llama
    ref = reference_model(loaded.model, "int4", 64)
    logits = sequence_logits(ref, [1, 2, 3, 4])
    assert logits.shape == (4, VOCAB) and torch.isfinite(logits).all()
    assert not torch.equal(logits, sequence_logits(loaded.model, [1, 2, 3, 4]))


def test_the_self_draft_uses_the_same_layers(tiny_engine):
    engine = tiny_engine(speculative_method="draft", num_speculative_tokens=2, draft_quantization="w8a8")
    assert model_quantization(engine.drafter.model) == ("w8a8", None)
    assert model_quantization(engine.model) is None  # the target stays float
    out = engine.generate(random_prompts([7], VOCAB, seed=2), greedy(8))[0].token_ids
    assert out == tiny_engine().generate(random_prompts([7], VOCAB, seed=2), greedy(8))[0].token_ids


def test_a_loaded_quantized_model_runs_with_its_own_scheme(tiny_llama):
    """A quantized model handed to an engine (a quantized draft reused on its own) keeps its
    scheme, and the engine's config and bytes say so; asking it for another scheme is refused."""
    _, loaded = tiny_llama
    from dataclasses import replace

    quantized = replace(loaded, model=quantize_model(loaded.model, "w8a8"))
    engine = make_engine(quantized)
    assert engine.model is quantized.model and engine.config.quantization == "w8a8"
    assert engine.matmul_bytes == matmul_bytes(loaded.model.config, "w8a8", 64, 4)
    assert make_engine(quantized, quantization="w8a8").model is quantized.model
    with pytest.raises(ValueError, match="already quantized"):
        make_engine(quantized, quantization="int8")
    reference = replace(loaded, model=reference_model(loaded.model, "int4", 32))  # float weights: float bytes
    assert make_engine(reference).matmul_bytes is None


def test_quality_is_perfect_against_itself_and_measures_a_scheme(tiny_llama):
    _, loaded = tiny_llama
    seqs = random_prompts([20, 20], VOCAB, seed=7)
    res = quality(loaded.model, {"same": loaded.model, "int4": reference_model(loaded.model, "int4", 32)}, seqs, 8)
    assert res["same"]["agreement"] == 1.0 and abs(res["same"]["kl_nats"]) < 1e-6 and res["same"]["positions"] == 24
    assert 0 < res["int4"]["kl_nats"] and res["int4"]["agreement"] <= 1.0


def test_activation_outliers_reads_one_layers_input(tiny_llama):
    _, loaded = tiny_llama
    out = activation_outliers(loaded.model, list(range(1, 30)), layer=1, projection="down_proj")
    assert len(out["token_max"]) == 29 and out["tensor_max"] == max(out["token_max"])
    assert 0 < out["median_levels_per_tensor"] <= 127


# -- 4. the bytes model counts the scales --------------------------------------------------------


def default_shape() -> ModelConfig:
    return ModelConfig(
        "llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )


def test_matmul_bytes_is_what_the_layers_hold(tiny_llama):
    """The analytic bytes equal the sum of every quantized layer's ``weight_bytes`` (codes and
    scales), for each scheme; int4 through its kernel class, which a CPU engine refuses."""
    _, loaded = tiny_llama
    model, cfg = loaded.model, loaded.model.config
    for scheme in ("int8", "w8a8"):
        q = quantize_model(model, scheme)
        layers = sum(
            m.weight_bytes for name, m in q.named_modules() if hasattr(m, "weight_bytes") and name != "lm_head"
        )
        assert matmul_bytes(cfg, scheme, 64, 4) == MatmulBytes(layers, q.lm_head.weight_bytes)
    small = ModelConfig(
        "llama",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    for scheme, make, dtype in [
        ("int4", lambda w: Int4Linear(w, None, 64), torch.float32),
        ("int8", lambda w: Int8WeightOnlyLinear(w, None), torch.bfloat16),  # CUDA's, in bf16
        ("w8a8", lambda w: W8A8Linear(w, None), torch.bfloat16),
    ]:
        held = {
            name: count * make(torch.randn(out, inp, dtype=dtype)).weight_bytes
            for name, (out, inp, count) in linear_shapes(small).items()
        }
        assert matmul_bytes(small, scheme, 64, dtype.itemsize) == MatmulBytes(
            sum(v for n, v in held.items() if n != "lm_head"), held["lm_head"]
        ), scheme


def test_bytes_per_weight_with_scales_for_the_default_shape():
    cfg = default_shape()
    n = cfg.num_matmul_params
    fp32 = matmul_bytes(cfg, None, 64, 4)
    assert fp32.layers + fp32.lm_head == 4 * n
    int8 = matmul_bytes(cfg, "int8", 64, 4)
    assert 1 < (int8.layers + int8.lm_head) / n < 1.01  # one byte, plus a float32 scale per row
    int4 = matmul_bytes(cfg, "int4", 64, 2)  # bf16 scale and zero per 64 weights: 0.5 + 4 / 64
    assert (int4.layers + int4.lm_head) / n == pytest.approx(0.5 + 4 / 64)


def test_decode_bytes_and_memory_plan_follow_the_scheme():
    cfg = default_shape()
    fp32 = decode_work(cfg, 1, 128, 4)
    int8 = decode_work(cfg, 1, 128, 4, matmul_bytes(cfg, "int8", 64, 4))
    assert int8.kv_read_bytes == fp32.kv_read_bytes  # the KV cache stays in the model dtype
    assert int8.weight_bytes == pytest.approx(
        fp32.weight_bytes - 3 * cfg.num_matmul_params + 4 * (30 * (960 + 576 + 3072 + 576) + 49152), rel=1e-12
    )
    q = matmul_bytes(cfg, "int8", 64, 4)
    # resident: the float embedding (tied: the LM head is a copy) and norms, plus the int8 matrices
    embed_norms = (cfg.vocab_size + 61) * cfg.hidden_size * 4
    assert weight_bytes(cfg, 4, q) == embed_norms + q.layers + q.lm_head
    assert weight_bytes(cfg, 4) == cfg.num_params * 4


# -- 5. what runs where --------------------------------------------------------------------------


def test_unsupported_pairs_raise_and_say_what_runs_where():
    with pytest.raises(ValueError, match="does not run on cpu.*What runs where: cpu: int8.*w8a8.*cuda: .*int4"):
        check_supported("int4", torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="needs dtype bfloat16"):
        check_supported("int4", torch.device("cuda"), torch.float16)  # a T4: no bf16
    with pytest.raises(ValueError, match="float32"):
        check_supported("w8a8", torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ValueError, match="does not run on meta"):
        check_supported("int8", torch.device("meta"), torch.float32)
    assert "tinygemm" in KERNELS["int4", "cuda"] and ("int4", "cpu") not in KERNELS


def test_a_kernel_this_torch_lacks_is_refused_with_its_reason(monkeypatch):
    """A CUDA scheme's kernel is run once on a tiny layer before the engine loads (a torch build
    may lack it); its failure becomes a ValueError that says what runs where. Shown on a CPU."""
    import minieng.wings.quantization.quantization as q

    def missing(*args, **kwargs):
        raise NotImplementedError("Could not run 'aten::_weight_int8pack_mm' with arguments from the 'CUDA' backend")

    monkeypatch.setattr(q, "make_linear", missing)
    with pytest.raises(
        ValueError,
        match=r"quantization='int8': .* does not run here.*"
        r"NotImplementedError.*What runs where",
    ):
        q._probe_kernel("int8", torch.device("cpu"), torch.float32)


def test_the_kernel_probe_checks_the_output_not_only_that_it_runs(monkeypatch):
    """The probe compares a kernel with its dequantized reference: this CPU's kernels pass, and a
    kernel that runs but computes something else (here: its weights read transposed, as a wrong
    layout would) is refused before the engine loads."""
    import minieng.wings.quantization.quantization as q

    for scheme in ("int8", "w8a8"):
        q._probe_kernel(scheme, torch.device("cpu"), torch.float32)
    make_linear = q.make_linear

    def misread(scheme, device_type, weight, bias, group_size, reference=False):
        if reference:
            return make_linear(scheme, device_type, weight, bias, group_size, reference=True)
        square = torch.zeros(weight.shape[1], weight.shape[1])
        square[: weight.shape[0]] = weight  # the wrong rows reach the right outputs
        layer = make_linear(scheme, device_type, square.t().contiguous(), bias, group_size)
        return lambda x: layer(x)[:, : weight.shape[0]]

    monkeypatch.setattr(q, "make_linear", misread)
    with pytest.raises(ValueError, match=r"runs here but disagrees with its dequantized reference"):
        q._probe_kernel("int8", torch.device("cpu"), torch.float32)


def test_engine_refuses_before_loading(tiny_llama):
    _, loaded = tiny_llama
    with pytest.raises(ValueError, match="quantization='int4' does not run on cpu"):
        make_engine(loaded, quantization="int4")
    with pytest.raises(ValueError, match="draft_quantization"):
        EngineConfig(speculative_method="draft", num_speculative_tokens=1, draft_quantization="int3")
    with pytest.raises(ValueError, match="quantization_group_size=48"):
        EngineConfig(quantization="int4", quantization_group_size=48)


def test_a_group_size_that_misses_a_layer_is_refused_never_skipped(tiny_llama):
    from minieng.wings.quantization.quantization import check_group_size

    with pytest.raises(
        ValueError,
        match=r"quantization_group_size=128 does not divide the inputs of qkv_proj \(576\), "
        r"o_proj \(576\), gate_up_proj \(576\), lm_head \(576\).*32, 64",
    ):
        check_group_size(default_shape(), 128)
    check_group_size(default_shape(), 64)
    _, loaded = tiny_llama  # hidden 64, intermediate 128: 128 misses the 64-input layers
    with pytest.raises(ValueError, match="does not divide"):
        reference_model(loaded.model, "int4", 128)
    from dataclasses import replace

    with pytest.raises(ValueError, match=r"multiple of 8.*lm_head \(300\)"):  # tinygemm packs 8 outputs at a time
        check_group_size(replace(default_shape(), vocab_size=300), 64)


# -- 4. no product on zero rows (issue 19, item 1) ------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda w, b: FbgemmLinear(w, b, digits=1),
        lambda w, b: FbgemmLinear(w, b, digits=2),
        lambda w, b: Int8WeightOnlyLinear(w, b),
        lambda w, b: Int4Linear(w, b, 64),
        lambda w, b: W8A8Linear(w, b),
    ],
    ids=["fbgemm w8a8", "fbgemm int8", "int8 weight-only", "int4", "w8a8 _int_mm"],
)
def test_quantized_layers_launch_no_kernel_on_zero_rows(make):
    """On CUDA a product on zero rows launches an empty grid (int4: "invalid configuration
    argument"; int8: an unchecked launch that fails in a later kernel). Every quantized layer
    answers zero rows with an empty output and dispatches nothing but that allocation."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    layer = make(weights(), BIAS)
    x = torch.randn(0, 128)
    with Ops() as ops:
        y = layer(x)
    assert y.shape == (0, 96) and y.dtype == x.dtype
    assert all(name.split(".")[0] in ("new_empty", "empty") for name in ops.names), ops.names


def test_steps_that_sample_nothing_run_no_product_on_zero_rows(tiny_engine):
    """A prompt longer than the step's token budget (its first chunks sample nothing) and a draft
    model's catch-up step (run alone, it samples nothing): no linear layer, the LM heads among
    them, is ever called with zero rows, and the tokens are the unchunked engine's."""
    engine = tiny_engine(
        quantization="int8",
        max_num_batched_tokens=12,
        max_num_seqs=4,
        speculative_method="draft",
        num_speculative_tokens=2,
        draft_quantization="int8",
    )
    rows: list[tuple[str, int]] = []
    for name, model in (("target", engine.model), ("draft", engine.drafter.model)):
        for module_name, module in model.named_modules():
            if hasattr(module, "out_features"):
                module.register_forward_pre_hook(
                    lambda mod, args, where=f"{name}.{module_name}": rows.append((where, args[0].shape[0]))
                )
    prompts = random_prompts([29, 5], VOCAB, seed=9)
    outs = engine.generate(prompts, greedy(10))
    heads = [n for where, n in rows if where.endswith("lm_head")]
    assert len(heads) >= 5 and any(where.startswith("draft.") for where, _ in rows)
    assert min(n for _, n in rows) > 0, [where for where, n in rows if n == 0][:5]
    plain = tiny_engine(quantization="int8").generate(prompts, greedy(10))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]


def test_int8_weight_only_compiled_is_gpt_fasts_form_with_the_same_output():
    """Under torch.compile the int8 layer is written as gpt-fast writes it (the cast weights feed
    the product, the scale multiplies its output); its output is the eager kernel's."""
    from minieng.wings.fast_paths.compilation import compiler_missing
    from minieng.wings.quantization.quant_kernels import Int8WeightOnlyLinear

    if compiler_missing(torch.device("cpu")) is not None:
        pytest.skip("torch.compile on a CPU needs a C++ compiler")
    gen = torch.Generator().manual_seed(0)
    layer = Int8WeightOnlyLinear(torch.randn(48, 64, generator=gen), torch.randn(48, generator=gen))
    x = torch.randn(3, 64, generator=gen)
    compiled = torch.compile(layer.forward, dynamic=False)
    assert torch.allclose(compiled(x), layer(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("digits", [1, 2])
def test_fbgemm_compiles_as_one_graph_with_the_eager_output_and_frees_its_weights(digits):
    """Compiled, fbgemm's product is the opaque ``minieng::fbgemm_linear`` (its packed weights are
    not a tensor, which would break the graph at every layer): ``fullgraph=True`` would raise at a
    break. The output is the eager layer's; the packed weights leave the op's table with their layer,
    and a copy registers its own."""
    import copy
    import gc

    from minieng.wings.fast_paths.compilation import compiler_missing
    from minieng.wings.quantization import quant_kernels

    if compiler_missing(torch.device("cpu")) is not None:
        pytest.skip("torch.compile on a CPU needs a C++ compiler")
    layer = FbgemmLinear(weights(), BIAS, digits=digits)
    compiled = torch.compile(layer.forward, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(X), layer(X), rtol=1e-6, atol=1e-6)
    key = int(layer.key)
    assert quant_kernels._PACKED[key] is layer.packed
    clone = copy.deepcopy(layer)  # a key of its own, which outlives the original's
    assert int(clone.key) != key and quant_kernels._PACKED[int(clone.key)] is clone.packed
    del layer, compiled
    gc.collect()
    assert key not in quant_kernels._PACKED
    torch.testing.assert_close(torch.compile(clone.forward, fullgraph=True, dynamic=False)(X), clone(X))
