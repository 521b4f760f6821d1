"""The napkin-math calculator against arithmetic done by hand from the published shapes.

Every expected figure below is written out from the shape's numbers (docs/architecture.md, FLOPs
and bytes): weights = parameters x bytes, KV per token = 2 x layers x KV heads x head_dim x bytes,
linear FLOPs 2 x N per token, attention 4 x layers x heads x head_dim per key, a decode step's bytes
the weights read once plus each sequence's KV. None is computed by calling the functions under test.
"""

from __future__ import annotations

import math

import pytest

from minieng.config import published_config
from minieng.wings.gpu_memory.memory_plan import HEADROOM
from minieng.measure.napkin import datasheet_devices, measured_device, napkin_estimate, cost_per_mtok
from minieng.measure.peaks import CUDA_CONTEXT_BYTES, DATASHEET, DEVICE_MEMORY_MIB, MEMORY_UTILIZATION, Peak

GIB = 2**30
MIB = 2**20


def device(name):
    return next(d for d in datasheet_devices() if d.name == name)


# -- Llama-3-8B in bf16 on an H100 SXM's datasheet (989 TFLOP/s, 3,350 GB/s; 81,559 MiB to nvidia-smi) ---
# L = 32 layers, hidden 4,096, intermediate 14,336, 32 heads, 8 KV heads, head_dim 128, vocab 128,256, untied.
L8_LAYER_MATMUL = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336)  # 6,979,321,856
L8_HEAD = 4096 * 128256  # 525,336,576 (the LM head; the embedding table is as large)
L8_NORMS = (2 * 32 + 1) * 4096  # 266,240
L8_PARAMS = 6_979_321_856 + 2 * 525_336_576 + 266_240  # 8,030,261,248
L8_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # 131,072 bytes
L8_ATTN_PER_KEY = 4 * 32 * 32 * 128  # 524,288 FLOPs per key attended, over the layers


def test_hand_figures_of_the_shape_itself():
    """The numbers the tests below write out, from the shape's fields."""
    assert L8_LAYER_MATMUL == 6_979_321_856 and L8_HEAD == 525_336_576 and L8_NORMS == 266_240
    assert L8_PARAMS == L8_LAYER_MATMUL + 2 * L8_HEAD + L8_NORMS == published_config("Llama-3-8B").num_params
    assert (L8_KV_PER_TOKEN, L8_ATTN_PER_KEY) == (131_072, 524_288)
    assert (S_LAYER_MATMUL, S_HEAD, S_NORMS, S_ATTN_PER_KEY) == (106_168_320, 28_311_552, 35_136, 69_120)


def test_llama3_8b_bf16_on_h100_sxm():
    est = napkin_estimate(
        published_config("Llama-3-8B"), device("H100 SXM"), "bf16", 1, 512, 128, price_per_device_hour=2.0
    )
    weights = 8_030_261_248 * 2  # 16,060,522,496 bytes: every parameter in bf16
    assert est.weights_bytes == weights
    assert est.kv_bytes_per_token == 131_072
    assert est.kv_bytes == 131_072 * 1 * 128
    # The weights and KV get 90% of nvidia-smi's 81,559 MiB less the CUDA context's 512 MiB: 72,942.3 MiB (76.49 GB).
    budget = 0.9 * (81_559 - 512) * MIB
    assert est.memory_budget_bytes == pytest.approx(budget) and budget == pytest.approx(76_485_545_164.8)
    assert est.kv_capacity_tokens == int((76_485_545_164.8 - 16_060_522_496) // 131_072) == 461_006
    assert est.fits

    # TTFT: one 512-token prompt, nothing cached, logits for its last position.
    prefill_flops = 2 * 6_979_321_856 * 512 + 524_288 * (512 * 513 // 2) + 2 * 525_336_576
    prefill_bytes = (
        (266_240 + 512 * 4096) * 2  # the norms, and the 512 embedding rows looked up
        + (6_979_321_856 + 525_336_576) * 2  # the layers' products and the LM head, read once
        + 131_072 * 512 * 2  # the prompt's KV written, and read back by attention
    )
    assert est.ttft_compute_floor_s == pytest.approx(prefill_flops / 989e12)  # 7.30 ms
    assert est.ttft_bandwidth_floor_s == pytest.approx(prefill_bytes / 3350e9)  # 4.52 ms
    assert est.ttft_bound == "compute" and est.ttft_floor_s == pytest.approx(7.2971e-3, rel=1e-4)

    # TPOT: one sequence, 128 tokens cached, one new token attending 129 keys.
    decode_flops = 2 * 6_979_321_856 + 2 * 525_336_576 + 524_288 * 129  # 15,076,950,016
    decode_bytes = (266_240 + 4096) * 2 + (6_979_321_856 + 525_336_576) * 2 + 131_072 * (129 + 1)
    assert decode_flops == 15_076_950_016
    assert est.tpot_compute_floor_s == pytest.approx(decode_flops / 989e12)  # 15.2 us
    assert est.tpot_bandwidth_floor_s == pytest.approx(decode_bytes / 3350e9)  # 4.49 ms
    assert est.tpot_bound == "memory" and est.tpot_floor_s == pytest.approx(4.4857e-3, rel=1e-4)
    assert est.decode_tok_s_at_floor == pytest.approx(3350e9 / decode_bytes)  # 222.9 tok/s
    assert est.prefill_tok_s_at_floor == pytest.approx(512 / (prefill_flops / 989e12))

    # The ridge: 989e12 / 3350e9 = 295.2 FLOP/byte. Per sequence a decode step brings f FLOPs and k bytes
    # (its embedding row, its KV read and written); the weights W are read once for the batch.
    ridge = 989e12 / 3350e9
    f = 15_076_950_016
    k = 4096 * 2 + 131_072 * (129 + 1)  # 17,047,552
    w = (266_240 + 6_979_321_856 + 525_336_576) * 2  # 15,009,849,344
    assert est.ridge_flop_per_byte == pytest.approx(295.22, abs=0.01)
    assert est.decode_ridge_batch == math.ceil(ridge * w / (f - ridge * k)) == 442
    assert est.ridge_batch_fits  # 442 x 128 tokens x 128 KiB = 7.4 GB beside 16 GB of weights
    ridge_step_s = max(442 * f / 989e12, (w + 442 * k) / 3350e9)
    assert est.decode_tok_s_at_ridge_batch == pytest.approx(442 / ridge_step_s)

    # Costs at a price of 2 per device-hour: 2 / 3600 per second, over the tokens of a second, per million.
    assert est.decode_cost_per_mtok == pytest.approx(2 / 3600 * 1e6 / (3350e9 / decode_bytes))  # 2.49
    assert est.prefill_cost_per_mtok == pytest.approx(2 / 3600 * 1e6 / (512 / (prefill_flops / 989e12)))


def test_llama3_8b_never_compute_bound_at_1024_tokens_of_context_on_h100():
    """f / k: (15,009,316,864 + 524,288 x 1,025) / (8,192 + 131,072 x 1,026) = 115.6 FLOP/byte, under
    the ridge of 295: every sequence's KV cache outweighs its FLOPs, whatever the batch."""
    f = 2 * 6_979_321_856 + 2 * 525_336_576 + 524_288 * 1025
    k = 4096 * 2 + 131_072 * 1026
    assert f / k == pytest.approx(115.6, abs=0.1)
    est = napkin_estimate(published_config("Llama-3-8B"), device("H100 SXM"), "bf16", 1, 512, 1024)
    assert est.decode_ridge_batch is None and est.decode_tok_s_at_ridge_batch is None
    assert est.decode_cost_per_mtok is None  # no price given
    assert "never" in " ".join(v for _, v in est.rows())


def test_llama3_8b_int8_weights_read_one_byte_a_weight_plus_a_scale_per_output_channel():
    """Weight-only int8: every product's weight in a byte, one bf16 scale per output channel; the
    embedding table and the norms stay bf16. Output channels a layer: q 4,096 + k 1,024 + v 1,024 +
    o 4,096 + gate 14,336 + up 14,336 + down 4,096 = 43,008; the LM head's 128,256."""
    est = napkin_estimate(published_config("Llama-3-8B"), device("H100 SXM"), "int8 weights, bf16 KV", 1, 512, 128)
    products = 6_979_321_856 + 525_336_576 + 2 * (32 * 43_008 + 128_256)
    assert est.weights_bytes == products + (525_336_576 + 266_240) * 2  # 8,558,873,088
    assert est.kv_bytes_per_token == 131_072  # the KV cache stays bf16
    decode_bytes = (266_240 + 4096) * 2 + products + 131_072 * 130
    assert est.tpot_bandwidth_floor_s == pytest.approx(decode_bytes / 3350e9)


# -- SmolLM2-135M in fp32 on "this machine", its measured ceilings given as numbers --------------------
# L = 30, hidden 576, intermediate 1,536, 9 heads, 3 KV heads, head_dim 64, vocab 49,152, tied embeddings.
S_LAYER_MATMUL = 30 * (576 * (576 + 2 * 192) + 576 * 576 + 3 * 576 * 1536)  # 106,168,320
S_HEAD = 576 * 49152  # 28,311,552 (tied: the embedding table, counted once)
S_NORMS = (2 * 30 + 1) * 576  # 35,136
S_ATTN_PER_KEY = 4 * 30 * 9 * 64  # 69,120
MACHINE = Peak("measured cpu float32", 0.18, 40.0, "measured")  # 0.18 TFLOP/s matmul, 40 GB/s copy


def test_smollm2_135m_fp32_on_this_machine():
    here = measured_device(MACHINE, 24 * GIB, "float32")
    assert here.source == "measured" and here.peak_dtype == "fp32" and here.covers("fp32")
    est = napkin_estimate(published_config("SmolLM2-135M"), here, "fp32", 4, 128, 256, price_per_device_hour=0.5)
    weights = (106_168_320 + 28_311_552 + 35_136) * 4  # 134,515,008 parameters x 4 bytes
    assert est.weights_bytes == weights == 538_060_032
    assert est.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4 == 46_080
    assert est.kv_bytes == 46_080 * 4 * 256
    # On a CPU there is no CUDA context: 90% of the 24 GiB of RAM for the weights and KV.
    assert est.kv_capacity_tokens == int((0.9 * 25_769_803_776 - 538_060_032) // 46_080) == 491_639

    # TTFT: four 128-token prompts in one step.
    prefill_flops = 4 * (2 * 106_168_320 * 128 + 69_120 * (128 * 129 // 2) + 2 * 28_311_552)
    prefill_bytes = (35_136 + 4 * 128 * 576) * 4 + (106_168_320 + 28_311_552) * 4 + 46_080 * 4 * 128 * 2
    assert est.ttft_compute_floor_s == pytest.approx(prefill_flops / 0.18e12)  # 1.25 s
    assert est.ttft_bandwidth_floor_s == pytest.approx(prefill_bytes / 40e9)
    assert est.ttft_bound == "compute"

    # TPOT: four sequences of 256 cached tokens.
    decode_flops = 4 * (2 * 106_168_320 + 2 * 28_311_552 + 69_120 * 257)
    decode_bytes = (35_136 + 4 * 576) * 4 + (106_168_320 + 28_311_552) * 4 + 46_080 * 4 * (257 + 1)
    assert est.tpot_compute_floor_s == pytest.approx(decode_flops / 0.18e12)  # 6.4 ms
    assert est.tpot_bandwidth_floor_s == pytest.approx(decode_bytes / 40e9)  # 14.9 ms
    assert est.tpot_bound == "memory"
    assert est.decode_tok_s_at_floor == pytest.approx(4 / (decode_bytes / 40e9))

    # Ridge 0.18e12 / 40e9 = 4.5 FLOP/byte; f = 286,723,584, k = 11,890,944, W = 538,060,032.
    f, k, w = 2 * 134_479_872 + 69_120 * 257, 576 * 4 + 46_080 * 258, 538_060_032
    assert (f, k) == (286_723_584, 11_890_944)
    assert est.decode_ridge_batch == math.ceil(4.5 * w / (f - 4.5 * k)) == 11
    assert est.decode_cost_per_mtok == pytest.approx(0.5 / 3600 * 1e6 / (4 / (decode_bytes / 40e9)))


def test_weights_that_do_not_fit_are_said_so():
    """Llama-3-70B in bf16 is 141 GB (70.55B parameters x 2): more than a T4's 16 GiB."""
    est = napkin_estimate(published_config("Llama-3-70B"), device("T4"), "fp16", 1, 128, 128)
    assert est.kv_capacity_tokens == 0 and not est.fits
    assert any("do not fit" in n for n in est.notes)


def test_a_peak_that_is_not_the_dtypes_is_flagged():
    t4 = device("T4")
    assert not t4.covers("bf16") and t4.covers("fp16") and t4.native_dtype() == "fp16"
    # Weight-only schemes dequantize to the device's own dtype: never flagged, on a T4 or a CPU either.
    assert t4.covers("int4 weights, bf16 KV") and t4.covers("int8 weights, bf16 KV")
    est = napkin_estimate(published_config("SmolLM2-135M"), t4, "int4 weights, bf16 KV", 1, 128, 128)
    assert not [n for n in est.notes if "peak is for" in n]
    assert device("H200").covers("int4 weights, bf16 KV") and not device("H200").covers("fp32")
    est = napkin_estimate(published_config("SmolLM2-135M"), device("H200"), "fp32", 1, 128, 128)
    assert any("peak is for bf16/fp16, not fp32" in n for n in est.notes)
    cpu = measured_device(MACHINE, 24 * GIB, "fp32")
    assert not cpu.covers("bf16") and cpu.native_dtype() == "fp32"


def test_every_datasheet_device_has_the_memory_a_program_sees():
    """nvidia-smi's totals, not the product pages' "GB" (a T4 sold as 16 GB shows 15 GiB), where published."""
    assert [d.name for d in datasheet_devices()] == [name for _, name, _, _ in DATASHEET]
    assert set(DEVICE_MEMORY_MIB) == {name for _, name, _, _ in DATASHEET}
    assert {src for _, src in DEVICE_MEMORY_MIB.values()} == {"nvidia-smi", "nominal"}
    assert device("T4").memory_bytes == 15_360 * MIB == 15 * GIB and device("T4").memory_source == "nvidia-smi"
    assert device("A10").memory_bytes == 23_028 * MIB and device("L4").memory_bytes == 23_034 * MIB
    assert device("L40S").memory_bytes == 46_068 * MIB and device("A100 40GB").memory_bytes == 40 * GIB
    assert device("H200").memory_bytes == 143_771 * MIB and device("H200").bandwidth_gbps == 4800
    for d in datasheet_devices():  # below the product page's figure read as GB, and with the context taken off
        assert d.context_bytes == CUDA_CONTEXT_BYTES and d.budget_bytes < d.memory_bytes - CUDA_CONTEXT_BYTES
    assert device("H100 PCIe").memory_source == "nominal"
    assert MEMORY_UTILIZATION == HEADROOM  # the calculator's budget is the share the engine plans in


def test_qwen2_5_7b_fp16_does_not_fit_a_t4():
    """15.23 GB of weights (7.62B parameters x 2) against what a T4 leaves a program: nvidia-smi's 15,360 MiB
    less the CUDA context (512 MiB), of which the engine plans the weights and KV in 90%: 13.05 GiB. The
    datasheet's 16 GiB once said it fit with 33,986 tokens of KV; it ran out of memory."""
    est = napkin_estimate(published_config("Qwen2.5-7B-Instruct"), device("T4"), "fp16", 1, 512, 1024)
    assert est.weights_bytes == 15_230_974_976 and est.memory_budget_bytes == pytest.approx(0.9 * 14_848 * MIB)
    assert not est.fits and est.kv_capacity_tokens == 0
    assert any("do not fit" in n for n in est.notes)
    quantized = napkin_estimate(
        published_config("Qwen2.5-7B-Instruct"), device("T4"), "int4 weights, bf16 KV", 1, 512, 1024
    )
    assert quantized.fits  # int4 does: 5.07 GB


def test_the_ridge_batch_fits_only_with_the_kv_of_the_whole_batch():
    """Llama-3-8B fp16 on a T4 at context 128: the ridge batch (263 sequences) would hold 263 x 128 x 128 KiB =
    4.4 GB of KV, and the weights alone (16.1 GB) already overflow the T4."""
    est = napkin_estimate(published_config("Llama-3-8B"), device("T4"), "fp16", 1, 512, 128)
    assert est.decode_ridge_batch == 263 and est.ridge_batch_fits is False
    assert "does NOT fit" in dict(est.rows())["decode turns compute-bound at"]
    # Beside weights that fit: Llama-3-8B bf16 on an L4 holds one sequence of 128 tokens, not its ridge batch's.
    l4 = napkin_estimate(published_config("Llama-3-8B"), device("L4"), "bf16", 1, 512, 128)
    room = 0.9 * (23_034 - 512) * MIB - 16_060_522_496  # 5.19 GB beside the weights
    assert l4.fits and l4.decode_ridge_batch * 128 * 131_072 > room and l4.ridge_batch_fits is False
    h100 = napkin_estimate(published_config("Llama-3-8B"), device("H100 SXM"), "bf16", 1, 512, 128)
    assert h100.ridge_batch_fits and h100.decode_ridge_batch * 128 * 131_072 <= h100.memory_budget_bytes


def test_int4_is_miniengs_scheme_beside_gptq_and_awq():
    """minieng's int4: groups of 64 with a 16-bit scale and zero, the LM head quantized. GPTQ/AWQ: groups of 128,
    the LM head in 16 bits. Llama-3-8B: matrices 6,979,321,856 + head 525,336,576 weights."""
    est = napkin_estimate(published_config("Llama-3-8B"), device("H100 SXM"), "int4 weights, bf16 KV", 1, 512, 128)
    (note,) = [n for n in est.notes if n.startswith("int4 is minieng's scheme")]
    ours = (6_979_321_856 + 525_336_576) * (0.5 + 4 / 64) + (525_336_576 + 266_240) * 2  # codes, scale+zero, embedding
    theirs = 6_979_321_856 * (0.5 + 4 / 128) + 525_336_576 * 2 + (525_336_576 + 266_240) * 2
    assert est.weights_bytes == int(ours)
    assert "groups of 64" in note and f"({ours / 1e9:.3g} GB)" in note
    assert "groups of 128, the LM head in 16 bits" in note and f"holds {theirs / 1e9:.3g} GB" in note
    assert not [n for n in est.notes if "peak is for" in n]  # weight-only int4 computes in the device's dtype


def test_cost_per_mtok():
    assert cost_per_mtok(1000.0, 3.6) == pytest.approx(1.0)  # 3.6 an hour = 0.001 a second, 1,000 tok/s
    assert cost_per_mtok(1000.0, None) is None


@pytest.mark.parametrize(
    "kwargs",
    [dict(dtype="int3"), dict(batch_size=0), dict(prompt_tokens=0), dict(context_tokens=-1), dict(price=-1.0)],
)
def test_bad_settings_are_refused(kwargs):
    args = dict(dtype="bf16", batch_size=1, prompt_tokens=1, context_tokens=0, price=None) | kwargs
    with pytest.raises(ValueError):
        napkin_estimate(
            published_config("SmolLM2-135M"),
            device("L4"),
            args["dtype"],
            args["batch_size"],
            args["prompt_tokens"],
            args["context_tokens"],
            args["price"],
        )
