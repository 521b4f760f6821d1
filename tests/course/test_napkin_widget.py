"""The napkin-math panel, built headless: it draws at once, redraws when a control moves, and puts the
reader's stored measurement beside the floor with the gap explained."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minieng.config import published_config
from minieng.course import kit, napkin_widget
from minieng.course.measured_points import MeasuredPoint, gap_words, measured_points, shape_name
from minieng.course.napkin_widget import EXAMPLE_PRICE_PER_DEVICE_HOUR, THIS_MACHINE, napkin, napkin_panel
from minieng.measure.napkin import datasheet_devices, format_seconds, measured_device, napkin_estimate
from minieng.measure.peaks import Peak

pytest.importorskip("ipywidgets")

PEAK = Peak("measured cpu float32", 0.18, 40.0, "measured")
MACHINE = measured_device(PEAK, 24 * 2**30, "float32")
SMOL = published_config("SmolLM2-135M")


def store_batch_sweep(directory, tpot_s_by_batch):
    """A result as notebook 05 stores it: 64-token prompts, 16 output tokens (mean context 72)."""
    params = {"model": "SmolLM2-135M-Instruct", "max_batch": 8, "prompt_tokens": 64, "output_tokens": 16,
              "device": "cpu", "dtype": "torch.float32"}  # fmt: skip
    rows = [{"batch_size": b, "tpot_s": t, "tok_s": b / t} for b, t in tpot_s_by_batch.items()]
    kit.cached("batch_sweep", params, lambda: {"rows": rows}, directory=directory, device="cpu")


def panel(tmp_path, **kwargs):
    args = dict(context_tokens=72, this_machine=MACHINE, machine_type="cpu", results_dir=tmp_path) | kwargs
    return napkin_panel("SmolLM2-135M", THIS_MACHINE, **args)


def test_the_panel_draws_at_build_and_redraws_when_the_batch_slider_moves(tmp_path):
    p = panel(tmp_path)
    first = p.table.value
    one = napkin_estimate(SMOL, MACHINE, "fp32", 1, 512, 72)
    assert format_seconds(one.tpot_floor_s) in first and "TPOT floor (batch 1, context 72)" in first
    assert "nothing stored" in first  # no result in the folder yet

    p.controls["batch_size"].value = 8  # what a reader's drag ends in
    eight = napkin_estimate(SMOL, MACHINE, "fp32", 8, 512, 72)
    after = p.table.value
    assert after != first
    assert "TPOT floor (batch 8, context 72)" in after and format_seconds(eight.tpot_floor_s) in after
    assert f"decode {eight.decode_tok_s_at_floor:.3g}" in after  # 8 sequences: about 8x the tokens per step
    assert eight.decode_tok_s_at_floor > 7 * one.decode_tok_s_at_floor


def test_the_price_box_changes_the_cost_and_refuses_words(tmp_path):
    p = panel(tmp_path)
    assert "an example: type your price" in p.table.value  # the default is labelled, never a quote
    p.controls["price"].value = "3.6"
    est = napkin_estimate(SMOL, MACHINE, "fp32", 1, 512, 72, price_per_device_hour=3.6)
    assert f"${est.decode_cost_per_mtok:,.2f}" in p.table.value and "an example" not in p.table.value
    p.controls["price"].value = f"{EXAMPLE_PRICE_PER_DEVICE_HOUR:g}"  # the same figure, typed: the reader's now
    assert "an example" not in p.table.value
    p.controls["price"].value = "cheap"
    assert "is not a price" in p.table.value


def test_the_measured_point_sits_on_top_of_the_floor_with_its_gap(tmp_path):
    store_batch_sweep(tmp_path, {1: 0.060, 8: 0.090})
    p = panel(tmp_path)
    text = p.table.value
    floor = napkin_estimate(SMOL, MACHINE, "fp32", 1, 512, 72).tpot_floor_s  # 13.7 ms at 40 GB/s
    assert "measured TPOT (notebook 05)" in text and "60 ms at batch 1, context 72" in text
    assert f"{0.060 / floor:.2f}x its floor" in text and "launches" in text
    p.controls["batch_size"].value = 8
    assert "90 ms at batch 8" in p.table.value
    p.controls["batch_size"].value = 2  # none stored at batch 2
    assert "measured TPOT" not in p.table.value and "nothing stored" in p.table.value


def test_a_stored_ttft_sits_beside_the_ttft_floor(tmp_path):
    """Notebook 01's result: TTFT per prompt length, and a batch-1 decode after a 64-token prompt."""
    params = {"model": "SmolLM2-135M-Instruct", "prompt_tokens": [16, 512], "decode_tokens": 6, "repeats": 1,
              "device": "cpu", "dtype": "torch.float32"}  # fmt: skip
    result = {
        "prefill": [
            {"prompt_tokens": 16, "ttft_s": 0.05, "tok_s": 320},
            {"prompt_tokens": 512, "ttft_s": 0.9, "tok_s": 569},
        ],
        "decode": {"tpot_s": 0.04, "tok_s": 25},
    }
    kit.cached("two_phases", params, lambda: result, directory=tmp_path, device="cpu")
    text = panel(tmp_path).table.value  # a 512-token prompt on the panel: the stored 512-token TTFT
    assert "measured TTFT (notebook 01)" in text and "900 ms at batch 1, 512-token prompts" in text
    assert "measured TPOT (notebook 01)" in text and "context 67" in text  # 64 + 6 / 2


def test_notebook_03s_batch_1_decode_is_the_point_its_own_calculator_shows(tmp_path):
    """Notebook 03 stores its batch-1 decode (``decode_b1``) before its calculator: a fresh results
    folder still has the reader's point (context: 64 + 12 steps / 2)."""
    params = {"model": "SmolLM2-135M-Instruct", "decode_prompt_tokens": 64, "decode_tokens": 12,
              "device": "cpu", "dtype": "torch.float32"}  # fmt: skip
    kit.cached("decode_b1", params, lambda: {"num_steps": 12, "seconds": 0.36}, directory=tmp_path, device="cpu")
    [point] = measured_points(tmp_path)
    assert (point.phase, point.batch_size, point.tokens, point.notebook) == ("decode", 1, 70, "03")
    assert point.seconds == pytest.approx(0.03)
    text = panel(tmp_path, context_tokens=64).table.value
    assert "measured TPOT (notebook 03)" in text and "30 ms at batch 1, context 70" in text


def test_a_measurement_is_compared_only_with_the_device_it_was_measured_on(tmp_path):
    store_batch_sweep(tmp_path, {1: 0.060})
    (point,) = measured_points(tmp_path)
    assert (point.phase, point.batch_size, point.tokens, point.shape, point.dtype) == (
        "decode", 1, 72, "SmolLM2-135M", "fp32"
    )  # fmt: skip
    p = panel(tmp_path)
    p.controls["device"].value = "H100 SXM"
    assert p.controls["dtype"].value == "bf16"  # the datasheet's peak is bf16's: the dtype follows
    assert "measured TPOT" not in p.table.value
    p.controls["device"].value = "T4"
    assert p.controls["dtype"].value == "fp16"  # a T4 has no bf16 units


def test_a_model_with_a_shorter_context_clamps_the_sliders(tmp_path):
    p = napkin_panel("Qwen2.5-7B-Instruct", "H200", prompt_tokens=20_000, context_tokens=30_000, results_dir=tmp_path)
    assert p.controls["context_tokens"].max == 32_768
    p.controls["model"].value = "Llama-3-8B"
    assert p.controls["context_tokens"].max == 8192 and p.controls["context_tokens"].value == 8192
    assert p.controls["prompt_tokens"].value == 8192
    assert "Llama-3-8B in bf16 on H200" in p.table.value


def test_gap_words_name_overhead_or_what_the_floor_leaves_out():
    def point(seconds, phase="decode"):
        return MeasuredPoint(phase, 1, 64, seconds, "SmolLM2-135M", "bf16", "02", "", "cuda", "NVIDIA H200", "h")

    assert "kernel launches" in gap_words(point(0.010), 1e-6, 1e-4)  # floor 1% of the step: overhead
    assert "attention gathering the KV cache" in gap_words(point(0.002), 1e-6, 1e-3)  # 50%: memory-bound
    assert "softmax" in gap_words(point(0.002, "prefill"), 1e-3, 1e-4)
    assert "SUSPECT" in gap_words(point(0.0005), 1e-6, 1e-3)


def test_shape_names():
    assert shape_name("SmolLM2-135M-Instruct") == "SmolLM2-135M"  # the embedded default
    assert shape_name("HuggingFaceTB/SmolLM2-1.7B-Instruct") == "SmolLM2-1.7B"
    assert shape_name("Llama-3-8B") == "Llama-3-8B" and shape_name("/some/folder") is None


def test_napkin_without_a_kernel_prints_the_table(tmp_path, capsys):
    store_batch_sweep(tmp_path, {1: 0.060})
    ceilings = SimpleNamespace(device="cpu", peak=PEAK, dtype="float32")
    assert napkin("SmolLM2-135M-Instruct", context_tokens=72, ceilings=ceilings, results_dir=tmp_path) is None
    out = capsys.readouterr().out
    assert "Napkin math: SmolLM2-135M in fp32 on this machine" in out
    assert "TPOT floor" in out and "measured TPOT (notebook 05)" in out
    assert f"${EXAMPLE_PRICE_PER_DEVICE_HOUR:g}/device-hour (an example" in out


def test_every_datasheet_device_is_offered(tmp_path):
    p = panel(tmp_path)
    assert list(p.controls["device"].options) == [THIS_MACHINE] + [d.name for d in datasheet_devices()]
    assert napkin_widget.MAX_BATCH == p.controls["batch_size"].max


def test_a_t4_shows_the_memory_a_program_gets_and_keeps_weight_only_int4(tmp_path):
    """The T4 as nvidia-smi shows it (15 GiB, not the datasheet's 16), with the CUDA context and the runtime's
    share taken off; Qwen2.5-7B in fp16 does not fit it. Moving to int4 keeps int4 (its products run in the T4's
    fp16: no "peak is not this dtype's" note) and says what int4 is here, beside GPTQ and AWQ."""
    p = napkin_panel("Qwen2.5-7B-Instruct", "T4", context_tokens=1024, results_dir=tmp_path)
    text = p.table.value
    assert "15.0 GiB (nvidia-smi)" in text and "13.1 GiB: 90% of what the CUDA context leaves" in text
    assert "do not fit the 13.1 GiB that T4 leaves" in text and "0 tokens" in text
    p.controls["dtype"].value = "int4 weights, bf16 KV"
    p.controls["device"].value = "L4"
    p.controls["device"].value = "T4"
    assert p.controls["dtype"].value == "int4 weights, bf16 KV"
    text = p.table.value
    assert "int4 is minieng&#x27;s scheme: 4-bit weights in groups of 64" in text and "GPTQ or AWQ" in text
    assert "peak is for" not in text and "do not fit" not in text
