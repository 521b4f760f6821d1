"""Notebook 04's plumbing (``lab.decode_overhead``): its runs in words, the engines it compares and
the worked answers it reveals; and notebook 08's (``lab.quant_lesson``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minieng.config import published_config
from minieng.lab.decode_overhead import (
    format_modes,
    format_profile,
    matmul_share,
    overhead_answer,
    util_answer,
    util_lines,
    utilization_curve,
)
from minieng.lab.quant_lesson import (
    format_layer_times,
    levels_why,
    nudge_answer,
    quant_lines,
    ranking_answer,
    roofline_answer,
    roofline_points,
)
from minieng.measure.peaks import Peak

NAPKIN = SimpleNamespace(
    tpot_floor_s=0.004,
    tpot_bandwidth_floor_s=0.004,
    tpot_compute_floor_s=0.0001,
    weights_bytes=270e6,
    bandwidth_gbps=68.0,
    peak_tflops=1.0,
)


def run(mfu, mbu, step_ms, util=None, batch=1):
    return {
        "batch_size": batch,
        "decode_step_ms": step_ms,
        "utilization": {"measured": {"mfu_percent": mfu, "mbu_percent": mbu}},
        "nvml_summary": None if util is None else {"util_gpu_percent_median": util},
        "nvml_unavailable": None if util is not None else "no NVIDIA GPU",
    }


def test_util_answer_is_the_napkins_mfu_bound():
    text = util_answer(NAPKIN, 64)
    assert "**2.5%**" in text and "4.00 ms" in text and "near 100%" in text


def test_util_lines_with_and_without_nvml():
    assert util_lines(run(1.0, 30.0, 5.0, util=95.0))[0].endswith("util.gpu / MFU = 95x.")
    assert util_lines(run(1.0, 30.0, 5.0))[0] == "No NVML reading here: no NVIDIA GPU."


def test_overhead_answer_is_the_time_above_the_floor():
    assert "**60.0%**" in overhead_answer(NAPKIN, 10.0)  # 4 ms floor of a 10 ms step
    assert "**0%**" in overhead_answer(NAPKIN, 3.0)  # a step under its floor leaves nothing to remove


def test_format_modes_and_the_profile():
    modes = {
        "enforce_eager=True": run(1, 10, 6.0),
        "default (graphs on CUDA)": run(2, 20, 3.0),
        "compile=True": run(2, 20, 2.0),
    }
    lines = format_modes(modes, cuda=True)
    assert lines[-2].strip() == "TPOT eager / default = 2.00x" and lines[-1] == "TPOT compiled / default = 0.67x"
    assert "only noise" in format_modes(modes, cuda=False)[-2]
    shares = {"matmul_share": 0.7, "other_ops_share": 0.2, "outside_ops_share": 0.1}
    prof = {"steps": 3, "step_ms": 4.0, "cpu": shares, "device": {"matmul_share": 0.5, "other_ops_share": 0.3}}
    assert matmul_share(prof) == 0.5 and matmul_share(prof | {"device": None}) == 0.7
    assert format_profile(prof)[-1].endswith("idle 20.0%") and len(format_profile(prof | {"device": None})) == 2


def test_utilization_curve_draws_util_gpu_only_where_every_run_has_it():
    curve = utilization_curve({4: run(4, 20, 3, batch=4), 1: run(1, 20, 3)})
    assert curve["xs"] == [1, 4] and curve["ys"]["MFU %"] == [1, 4] and "util.gpu % (NVML)" not in curve["ys"]
    assert "util.gpu % (NVML)" in utilization_curve({1: run(1, 20, 3, util=90.0)})["ys"]


def test_format_layer_times():
    lines = format_layer_times({"none": 0.002, "int8": 0.001, "int4": 0.004, "w8a8": None}, "torch.float32")
    assert (
        "faster" in lines[1] and "SLOWER" in lines[2] and lines[3] == " w8a8: no kernel in torch.float32 on this device"
    )


def quant_result():
    def r(scheme, tpot, pred, ttft, mbu):
        return {
            "scheme": scheme,
            "tpot_b1_ratio": tpot,
            "tpot_b1_ratio_predicted": pred,
            "ttft_ratio": ttft,
            "decode_mbu_percent": mbu,
            "prefill_intensity_flop_per_byte": 100.0,
            "prefill_flop_s": 1e11,
            "decode_intensity_flop_per_byte": 1.0,
            "decode_flop_s": 1e9,
            "agreement": 0.95,
        }

    return {
        "rows": [r("none", 1.0, 1.0, 1.0, 40.0), r("int8", 0.5, 0.27, 0.98, 30.0), r("w8a8", 0.3, 0.27, 0.5, 70.0)],
        "kernel_flop_s": {"w8a8": 2e11},
    }


def test_quant_lines_flag_a_step_slower_than_its_bytes():
    lines = quant_lines(quant_result(), 1)
    assert lines[0].startswith("int8: batch-1 TPOT 0.50x of float's for 0.27x") and "per-op overhead" in lines[1]
    assert lines[2].startswith("w8a8") and len(lines) == 3  # 0.30 / 0.27 is within 1.3x: no overhead line


def test_roofline_points_add_the_w8a8_roof():
    peak = Peak("cpu", 0.1, 20.0, "measured")
    roofs, points = roofline_points(quant_result(), 1, peak)
    assert len(points) == 6 and points[1] == ("decode b1 none", 1.0, 1e9)
    assert roofs[1].peak_tflops == pytest.approx(0.2) and roofs[1].bandwidth_gbps == 20.0


def test_the_worked_answers_read_the_shape():
    cfg = published_config("SmolLM2-135M")
    assert "right *and up*" in roofline_answer(cfg, 4, 512, 80, ridge=5.0)
    assert "past the ridge" in roofline_answer(cfg, 4, 512, 80, ridge=5.0)
    assert "still below the ridge" in roofline_answer(cfg, 4, 512, 80, ridge=1e6)
    per_token = 30 * (6 * 576 + 1536)
    assert f"**{per_token:,}**" in nudge_answer(cfg, 1e-6)
    out = {"tensor_max": 200.0, "median_token_max": 5.0, "median_levels_per_tensor": 3.2}
    assert "**3.2**" in ranking_answer(out, 64) and "40x" in levels_why(out)
