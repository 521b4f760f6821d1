"""flops_bytes: hand-checked counts, real shapes, the >100% flag, and FlopCounterMode cross-checks.

FlopCounterMode counts matrix products only (aten.mm, addmm, bmm, ...): not biases, norms,
RoPE, softmax or SiLU. ``flops_bytes.step_work`` counts the same things, so the comparisons below
are like for like: a bias inside ``addmm`` is counted by neither.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from minieng.config import ModelConfig
from minieng.measure import flops_bytes, roofline
from minieng.measure.flops_bytes import StepWork, decode_work, prefill_work, step_work


def model_config(**overrides) -> ModelConfig:
    fields = dict(
        model_type="llama",
        vocab_size=10,
        hidden_size=4,
        intermediate_size=6,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


SMOLLM2_135M = model_config(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
)


# -- by hand --------------------------------------------------------------------------------------


def test_one_layer_by_hand():
    # hidden 4, 2 query heads and 1 KV head of dim 2, intermediate 6, vocab 10:
    #   q: 4x4, k: 4x2, v: 4x2, o: 4x4 -> 48; gate, up, down: 3 * 4x6 -> 72; layer = 120
    #   LM head 4x10 = 40
    # A chunk of 3 new tokens after 2 cached, logits for its last token, 2-byte dtype.
    work = step_work(model_config(), [(3, 2, True)], dtype_bytes=2)
    assert work.matmul_flops == 2 * 120 * 3 == 720
    assert work.lm_head_flops == 2 * 40 * 1 == 80
    # the 3 new tokens attend 3, 4, 5 keys; 4 * heads(2) * head_dim(2) FLOPs per key, 1 layer
    assert work.attention_flops == 4 * 2 * 2 * (3 + 4 + 5) == 192
    # weights: layer 120 + norms (2 layers' worth + final) 3 * 4 + 3 embedding rows * 4 + head 40
    assert work.weight_bytes == (120 + 12 + 12 + 40) * 2 == 368
    # KV per token: K and V * 1 layer * 1 KV head * dim 2 * 2 bytes = 8 bytes
    assert work.kv_read_bytes == 8 * (2 + 3)  # the cached keys and the new ones, read once
    assert work.kv_write_bytes == 8 * 3
    assert work.total_flops == 992 and work.total_bytes == 432
    assert work.arithmetic_intensity_flop_per_byte == pytest.approx(992 / 432)


def test_mid_prompt_chunk_skips_the_lm_head():
    with_logits = step_work(model_config(), [(3, 2, True)], 2)
    without = step_work(model_config(), [(3, 2, False)], 2)
    assert without.lm_head_flops == 0
    assert with_logits.weight_bytes - without.weight_bytes == 40 * 2  # the head matrix is not read


def test_logits_rows_count_for_verification():
    # a target model scoring k + 1 = 4 positions of one sequence (speculative decoding)
    assert step_work(model_config(), [(4, 9, 4)], 2).lm_head_flops == 4 * 2 * 40


def test_tied_and_untied_heads_read_the_same_bytes():
    # untied: the head matrix, plus only the looked-up embedding rows; tied: the same table
    # read whole by the head, plus the same rows looked up. Either way: head + rows.
    tied = step_work(model_config(tie_word_embeddings=True), [(5, 0, True)], 4)
    untied = step_work(model_config(tie_word_embeddings=False), [(5, 0, True)], 4)
    assert tied == untied


def test_kv_bytes_follow_kv_heads_and_attention_follows_query_heads():
    mha = model_config(hidden_size=64, num_attention_heads=8, num_key_value_heads=8, head_dim=8, num_hidden_layers=2)
    gqa = model_config(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=8, num_hidden_layers=2)
    a, b = decode_work(mha, 4, 100, 2), decode_work(gqa, 4, 100, 2)
    assert a.kv_read_bytes == 4 * b.kv_read_bytes == 4 * (2 * 2 * 2 * 8 * 101 * 2) * 4
    assert a.kv_write_bytes == 4 * b.kv_write_bytes
    assert a.attention_flops == b.attention_flops  # every query head still does its dot products
    assert a.weight_bytes > b.weight_bytes  # smaller k_proj and v_proj


def test_kv_dtype_can_differ_from_weights():
    work = step_work(model_config(), [(1, 9, True)], dtype_bytes=0.5, kv_dtype_bytes=2)  # 4-bit weights
    assert work.kv_read_bytes == 8 * 10
    assert work.weight_bytes == (120 + 12 + 4 + 40) * 0.5


def test_smollm2_135m_per_token():
    cfg = SMOLLM2_135M
    assert cfg.num_matmul_params == 134_479_872
    work = decode_work(cfg, batch_size=1, context_len=0, dtype_bytes=4)
    assert work.matmul_flops + work.lm_head_flops == 2 * cfg.num_matmul_params
    assert work.matmul_flops + work.lm_head_flops == pytest.approx(2 * 134.5e6, rel=1e-3)
    # DESIGN.md: streaming the fp32 weights at ~8 GB/s puts batch-1 decode near 67 ms a token
    assert roofline.tpot_floor_s(work.total_bytes, 8e9) == pytest.approx(0.067, rel=0.01)
    # a 1,000-token prompt: linear in tokens, plus the attention triangle
    prefill = prefill_work(cfg, 1000, 4)
    assert prefill.matmul_flops == 1000 * 2 * (cfg.num_matmul_params - 576 * 49152)
    assert prefill.attention_flops == 4 * 30 * 9 * 64 * 1000 * 1001 // 2


def test_a_prefill_token_runs_the_layers_not_the_lm_head():
    """DESIGN.md section 5: the LM head runs for the last position only, so a prompt token's linear
    cost is the layers' parameters: 106.2M of the 135M's 134.5M matmul parameters (the head is 27% more)."""
    cfg = SMOLLM2_135M
    per_token = flops_bytes.prefill_params_per_token(cfg)
    assert per_token == cfg.num_matmul_params - 576 * 49152 == 106_168_320
    assert cfg.num_matmul_params / per_token == pytest.approx(1.27, abs=0.01)
    w = prefill_work(cfg, 1000, 4)
    assert w.matmul_flops == 2 * per_token * 1000 and w.lm_head_flops == 2 * 576 * 49152
    assert flops_bytes.prefill_params_per_token(model_config()) == 120  # the hand-checked layer above


def test_prefix_hit_and_decode_helpers_agree_with_step_work():
    cfg = SMOLLM2_135M
    assert prefill_work(cfg, 100, 2, num_cached_tokens=64) == step_work(cfg, [(36, 64, True)], 2)
    assert decode_work(cfg, 3, 50, 2) == step_work(cfg, [(1, 50, True)] * 3, 2)


def test_steps_sum_per_phase():
    cfg = SMOLLM2_135M
    steps = [decode_work(cfg, 1, c, 2) for c in range(100, 110)]
    total = sum(steps)
    assert total == sum(steps, StepWork())
    assert total.weight_bytes == 10 * steps[0].weight_bytes  # every step re-reads the weights
    assert total.total_flops == pytest.approx(sum(s.total_flops for s in steps))
    # the intensity of a sum is recomputed from its totals, not summed
    assert total.arithmetic_intensity_flop_per_byte == pytest.approx(total.total_flops / total.total_bytes)
    assert StepWork().arithmetic_intensity_flop_per_byte == 0.0


def test_prefill_is_compute_bound_and_decode_memory_bound_on_an_h200():
    cfg, peak, bandwidth = SMOLLM2_135M, 989e12, 4.8e12
    ridge = roofline.ridge_point(peak, bandwidth)
    assert ridge == pytest.approx(206, rel=0.01)
    decode = decode_work(cfg, 1, 500, 2).arithmetic_intensity_flop_per_byte
    prefill = prefill_work(cfg, 2048, 2).arithmetic_intensity_flop_per_byte
    assert decode < 2 < ridge < prefill  # bf16 decode at batch 1: ~1 FLOP per byte
    assert roofline.attainable_flops(decode, peak, bandwidth) == pytest.approx(decode * bandwidth)
    assert roofline.attainable_flops(prefill, peak, bandwidth) == peak
    assert roofline.prefill_floor_s(2e12, peak) == pytest.approx(2e12 / peak)


def test_bad_chunks_are_rejected():
    for chunk in [(0, 5, False), (2, -1, True), (2, 0, 3)]:
        with pytest.raises(ValueError, match="invalid"):
            step_work(model_config(), [chunk], 2)
    with pytest.raises(ValueError):
        step_work(model_config(), [(1, 0, True)], 0)


# -- MFU, MBU and the >100% flag ------------------------------------------------------------------


def test_mfu_and_mbu_are_fractions():
    u = roofline.mfu(1e12, 0.01, 200e12)
    assert u.fraction == pytest.approx(0.5) and u.percent == pytest.approx(50) and not u.suspect
    assert float(roofline.mbu(4e9, 1.0, 8e9)) == pytest.approx(0.5)
    assert str(u) == "MFU 50.0%"


def test_over_100_percent_is_flagged():
    with pytest.warns(roofline.SuspectFigureWarning, match="MBU"):
        u = roofline.mbu(10e9, 1.0, 8e9)
    assert u.suspect and u.fraction == pytest.approx(1.25)
    assert "SUSPECT" in str(u)
    with pytest.warns(roofline.SuspectFigureWarning, match="MFU"):
        assert roofline.mfu(2e12, 0.001, 989e12).suspect


def test_utilization_rejects_zero_time_and_peak():
    with pytest.raises(ValueError):
        roofline.mfu(1e9, 0.0, 1e12)
    with pytest.raises(ValueError):
        roofline.mbu(1e9, 1.0, 0.0)


# -- against FlopCounterMode: transformers' eager attention -----------------------------------------


def tiny_hf(kind: str):
    """A tiny random transformers model on the eager (explicit matmul) attention path."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(
        vocab_size=160,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        max_position_embeddings=256,
        attn_implementation="eager",
    )
    if kind == "llama-mha":
        hf = LlamaConfig(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True, **shape)
        cls = LlamaForCausalLM
    elif kind == "llama-gqa":
        hf = LlamaConfig(num_attention_heads=8, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False, **shape)
        cls = LlamaForCausalLM
    else:  # Qwen2: q/k/v biases, GQA
        hf = Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **shape)
        cls = Qwen2ForCausalLM
    torch.manual_seed(0)
    return cls(hf).eval(), ModelConfig.from_hf(hf)


def matmul_flops_by_kind(model, input_ids, cache=None):
    """(linear FLOPs, attention FLOPs, the cache) of one forward, logits for the last position.

    In these models every linear layer runs as aten.mm (aten.addmm with a bias: FlopCounterMode
    counts its 2mnk and not the bias add), and eager attention's QK^T and PV as aten.bmm.
    """
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        out = model(input_ids, cache=cache, use_cache=True, logits_to_keep=1)
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert set(counts) <= {"aten.mm", "aten.addmm", "aten.bmm"}, counts
    return counts.get("aten.mm", 0) + counts.get("aten.addmm", 0), counts.get("aten.bmm", 0), out.cache


@pytest.mark.parametrize("kind", ["llama-mha", "llama-gqa", "qwen2-bias"])
@pytest.mark.parametrize("num_new, num_context", [(24, 0), (5, 17), (1, 30)], ids=["prefill", "chunk", "decode"])
def test_agrees_with_flop_counter_on_eager_attention(kind, num_new, num_context):
    model, cfg = tiny_hf(kind)
    ids = torch.randint(0, cfg.vocab_size, (1, num_context + num_new))
    cache = None
    if num_context:
        with torch.no_grad():
            cache = model(ids[:, :num_context], use_cache=True, logits_to_keep=1).cache
    linear, attention, _ = matmul_flops_by_kind(model, ids[:, num_context:], cache)

    work = step_work(cfg, [(num_new, num_context, True)], dtype_bytes=4)
    # Eager attention multiplies the full [T, C + T] score rectangle and masks it afterwards;
    # step_work counts only the causal keys. The difference is the masked upper triangle:
    # T(T - 1)/2 query-key pairs, 4 * heads * head_dim FLOPs each, per layer (zero for a decode).
    masked = flops_bytes.masked_attention_flops(cfg, [(num_new, num_context, True)])
    assert masked == 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * num_new * (num_new - 1) // 2
    assert attention > 0, "the eager path should run attention as bmm"
    assert linear == work.matmul_flops + work.lm_head_flops
    assert attention == work.attention_flops + masked
    counted = linear + attention
    assert abs(counted - (work.total_flops + masked)) <= 0.01 * counted
    if num_new == 1:  # a decode has no masked work: the analytic total is the counted total
        assert counted == work.total_flops


def test_all_logits_cost_what_step_work_says():
    # without logits_to_keep, transformers runs the LM head on every position
    model, cfg = tiny_hf("llama-mha")
    ids = torch.randint(0, cfg.vocab_size, (1, 12))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)
    head = counter.get_flop_counts()["LlamaForCausalLM.lm_head"]
    assert sum(head.values()) == step_work(cfg, [(12, 0, 12)], 4).lm_head_flops


# -- printing a percentage ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "percent, text",
    [
        (0.03, "0.030%"),
        (0.3, "0.30%"),
        (3.0, "3.0%"),
        (0.0301, "0.030%"),
        (0.00012, "0.00012%"),
        (4.56, "4.6%"),
        (9.94, "9.9%"),
        (9.96, "10.0%"),
        (0.0996, "0.10%"),
        (43.21, "43.2%"),
        (112.0, "112.0%"),
        (0, "0%"),
        (None, "N/A"),
        (-0.5, "-0.50%"),
    ],
)
def test_format_percent_keeps_two_significant_digits_below_ten(percent, text):
    assert roofline.format_percent(percent) == text


def test_format_percent_tells_a_tenfold_difference_apart_at_any_scale():
    for small in (0.003, 0.03, 0.3, 3.0):
        assert roofline.format_percent(small) != roofline.format_percent(small * 10)
        assert roofline.format_percent(small) != "0.0%"


def test_tiny_utilization_prints_its_digits_and_a_suspect_one_says_so():
    assert str(roofline.mfu(3e-4, 1.0, 1.0)) == "MFU 0.030%"
    with pytest.warns(roofline.SuspectFigureWarning, match="MBU = 150.0%"):
        u = roofline.mbu(1.5, 1.0, 1.0)
    assert str(u).startswith("MBU 150.0% (SUSPECT")


# -- on paper: the n^2 crossover, the decode ridge, what bounds a step ------------------------------


@pytest.mark.parametrize("name, crossover", [("SmolLM2-135M", 6143), ("Llama-3-8B", 53247)])
def test_attention_overtakes_the_linear_layers_at_the_crossover(name, crossover):
    from minieng.config import published_config

    cfg = published_config(name)
    assert flops_bytes.attention_crossover_tokens(cfg) == crossover
    at, before = prefill_work(cfg, crossover, 2), prefill_work(cfg, crossover - 1, 2)
    assert at.attention_flops >= at.matmul_flops and before.attention_flops < before.matmul_flops


def test_decode_ridge_batch_is_where_the_intensity_reaches_the_ridge():
    cfg = SMOLLM2_135M
    for ridge in (3.0, 10.0, 40.0):  # fp32 on CPU-like ridges: the closed form lands on the first batch there
        b = flops_bytes.decode_ridge_batch(cfg, 64, 4, ridge=ridge)
        assert decode_work(cfg, b, 64, 4).arithmetic_intensity_flop_per_byte >= ridge
        assert decode_work(cfg, b - 1, 64, 4).arithmetic_intensity_flop_per_byte < ridge
    assert flops_bytes.decode_ridge_batch(cfg, 64, 4, ridge=0.1) == 1
    # bf16 on an H200 (ridge ~184): each sequence reads ~1.5 MB of KV at 64 tokens of context for
    # 270 MFLOP, so the intensity tends to ~180 and no batch reaches the ridge.
    assert flops_bytes.decode_ridge_batch(cfg, 64, 2, ridge=184) is None
    assert flops_bytes.decode_ridge_batch(cfg, 0, 2, ridge=100) is not None
    with pytest.raises(ValueError):
        flops_bytes.decode_ridge_batch(cfg, 64, 2, ridge=0)


def test_roofline_bound_names_the_binding_resource_or_overhead():
    # 1 GFLOP and 1 GB on a 100 TFLOP/s, 1 TB/s machine: floors of 10 us and 1 ms
    memory = roofline.roofline_bound(1e9, 1e9, 0.0015, 100e12, 1e12)
    assert memory.limit == "memory" and memory.explained == pytest.approx(1 / 1.5)
    assert memory.words().startswith("memory-bound") and "66.7%" in memory.words()
    # a 2-core CPU's batch-1 decode: 541 MB in 44 ms against a 36 GB/s copy (MBU 34%)
    assert roofline.roofline_bound(0.27e9, 541e6, 0.044, 0.2e12, 36e9).limit == "memory"
    assert roofline.roofline_bound(1e9, 1e9, 0.0041, 100e12, 1e12).limit == "overhead"  # 24% explained
    compute = roofline.roofline_bound(1e12, 1e6, 0.012, 100e12, 1e12)
    assert compute.limit == "compute" and compute.floor_s == pytest.approx(0.01)
    # a small model on a large GPU: 270 MB read in 63 us, a step of 2.2 ms
    launch = roofline.roofline_bound(270e6, 270e6, 0.0022, 989e12, 4.3e12)
    assert launch.limit == "overhead" and "limited by overhead" in launch.words() and "2.9%" in launch.words()
    with pytest.raises(ValueError):
        roofline.roofline_bound(1, 1, 0, 1, 1)


def test_phase_utilization_says_what_bounds_each_peak():
    from minieng.core.outputs import StepRecord
    from minieng.measure.peaks import Peak

    steps = [StepRecord(0.0, 0.0022, 0, 0, 1, 0, 1, 0, 1, chunks=[(1, 100, True)])]
    out = roofline.phase_utilization(SMOLLM2_135M, 2, steps, [Peak("H200", 989, 4800, "datasheet")])
    assert out["datasheet"]["limit"] == "overhead"
    assert out["datasheet"]["explained_percent"] == pytest.approx(out["datasheet"]["mbu_percent"])
    assert "overhead" in out["datasheet"]["bound"]


def test_published_shapes_give_their_parameter_counts():
    from minieng.config import PUBLISHED_SHAPES, published_config

    counts = {
        "SmolLM2-135M": 134_515_008,
        "SmolLM2-1.7B": 1_711_376_384,
        "Llama-3-8B": 8_030_261_248,
        "Llama-3-70B": 70_553_706_496,
        "Qwen2.5-7B-Instruct": 7_615_616_512 - 129_024,
        "Qwen2.5-3B-Instruct": 3_085_938_688 - 92_160,
        "Qwen2.5-0.5B-Instruct": 494_032_768 - 27_648,
    }  # less q/k/v biases
    assert set(counts) == set(PUBLISHED_SHAPES)
    for name, params in counts.items():
        assert published_config(name).num_params == params, name
    assert published_config("SmolLM2-135M").num_matmul_params == SMOLLM2_135M.num_matmul_params
    with pytest.raises(ValueError, match="use one of"):
        published_config("GPT-5")
