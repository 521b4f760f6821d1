"""util_experiment: decode runs with NVML beside them (a fake NVML), the op-time split, the profile.

Everything runs on CPU over the tiny random Llama; NVML is the fake driver of ``test_telemetry``.
Nothing asserts a speed: only what is recorded, how shares add up, and N/A where NVML is absent.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fake_nvml import FakeGPU, FakeNVML
from helpers import random_prompts
from torch.autograd import DeviceType

from minieng.lab.gpu_utilization import (
    MATMUL_OPS,
    OUTSIDE_OPS,
    decode_for,
    decode_utilization,
    graphs_verdict,
    is_matmul,
    op_shares,
    op_times,
    profile_decode,
    trace_series,
    utilization_rows,
)
from minieng.measure.nvml import DeviceId, TelemetrySampler
from minieng.measure.peaks import Peak

PEAKS = [Peak("test", 1.0, 10.0, "measured"), Peak("sheet", 2.0, 20.0, "datasheet")]


def prompts(tiny_llama, batch, length=8):
    return random_prompts([length] * batch, tiny_llama[1].model.config.vocab_size, seed=batch)


# -- the op split (pure) ------------------------------------------------------------------------


def test_op_shares_split_the_wall_time_three_ways():
    ops = {"aten::addmm": 500.0, "aten::mm": 100.0, "aten::linear": 20.0, "aten::add": 50.0, "aten::copy_": 30.0}
    s = op_shares(ops, wall_us=1000.0)
    assert s["matmul_us"] == 620 and s["other_ops_us"] == 80 and s["outside_ops_us"] == 300
    assert s["matmul_share"] + s["other_ops_share"] + s["outside_ops_share"] == pytest.approx(1)
    assert s["top_ops"][0] == ["aten::addmm", 500.0, True]
    assert s["top_ops"][1] == [OUTSIDE_OPS, 300.0, False]
    assert {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear"} <= MATMUL_OPS


def test_op_shares_never_report_negative_outside_time_and_cut_to_top():
    ops = {f"aten::op{i}": 10.0 for i in range(20)}
    s = op_shares(ops, wall_us=150.0, top=5)  # profiler totals can exceed the wall clock slightly
    assert s["outside_ops_us"] == 0 and len(s["top_ops"]) == 5 and s["matmul_share"] == 0
    with pytest.raises(ValueError):
        op_shares(ops, wall_us=0)
    with pytest.raises(ValueError):
        op_shares({"aten::mm": -1.0}, wall_us=10)


def test_gpu_kernels_of_gemm_libraries_count_as_matrix_products():
    for name in (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
        "ampere_bf16_s16816gemm_bf16_128x64_ldg8",
        "void gemv2T_kernel_val<int, int, __nv_bfloat16>",
        "nvjet_hsh_128x64_64x4_1x2_h_bz_coopA_NTN",
        "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>",
        "aten::addmm",
    ):
        assert is_matmul(name), name
    for name in (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
        "flash_fwd_kernel",
        "aten::scaled_dot_product_attention",
        "cudaLaunchKernel",
        "Memcpy HtoD (Pageable -> Device)",
    ):
        assert not is_matmul(name), name


def event(key, cpu_us, device_us, device_type=DeviceType.CPU):
    return SimpleNamespace(
        key=key, self_cpu_time_total=cpu_us, self_device_time_total=device_us, device_type=device_type
    )


def test_op_times_split_host_ops_from_gpu_kernels():
    events = [
        event("aten::mm", 30.0, 0.0),
        event("cudaLaunchKernel", 50.0, 0.0),
        event("sm90_xmma_gemm_bf16", 0.0, 400.0, DeviceType.CUDA),
        event("elementwise_kernel", 0.0, 60.0, DeviceType.CUDA),
    ]
    cpu, device = op_times(events)
    assert cpu == {"aten::mm": 30.0, "cudaLaunchKernel": 50.0}
    assert device == {"sm90_xmma_gemm_bf16": 400.0, "elementwise_kernel": 60.0}
    shares = op_shares(device, wall_us=1000.0)
    assert shares["matmul_share"] == pytest.approx(0.4) and shares["outside_ops_share"] == pytest.approx(0.54)
    # an older profiler that attaches kernel time to the op itself
    assert op_times([event("aten::mm", 30.0, 400.0), event("aten::add", 5.0, 60.0)])[1] == {
        "aten::mm": 400.0,
        "aten::add": 60.0,
    }


# -- decode runs --------------------------------------------------------------------------------


def test_decode_for_returns_decode_steps_for_at_least_the_time(tiny_engine, tiny_llama):
    engine = tiny_engine()
    steps = decode_for(engine, prompts(tiny_llama, 3), seconds=0.05)
    assert len(steps) >= 2 and all(s.num_prefill_tokens == 0 and s.num_decode_seqs == 3 for s in steps)
    assert steps[-1].start_s + steps[-1].duration_s - steps[0].start_s >= 0.05 - 1e-3
    decodes = [s for s in engine.step_records if s.num_prefill_tokens == 0]
    assert decodes[2:] == steps  # the first two decode steps are warm-up
    assert not engine.has_unfinished_requests()  # the run's requests were aborted
    engine.block_manager.check_invariants([])


def test_decode_for_sends_the_batch_again_at_max_model_len(tiny_engine, tiny_llama):
    engine = tiny_engine(max_model_len=16)
    steps = decode_for(engine, prompts(tiny_llama, 2), seconds=0.0, min_steps=20)
    assert len(steps) >= 20  # 7 decode steps per round at most: several rounds
    with pytest.raises(ValueError):
        decode_for(engine, prompts(tiny_llama, 1, length=15), seconds=0.01)
    with pytest.raises(ValueError):
        decode_for(engine, [], seconds=0.01)


def test_on_cpu_nvml_is_na_with_a_reason_and_mfu_mbu_are_measured(tiny_engine, tiny_llama):
    r = decode_utilization(tiny_engine(), prompts(tiny_llama, 2), 0.05, PEAKS)
    assert r["batch_size"] == 2 and r["num_steps"] == len(r["steps"]["time_s"]) >= 2
    assert r["nvml"] is None and r["nvml_summary"] is None and "NVIDIA" in r["nvml_unavailable"]
    assert set(r["utilization"]) >= {"measured", "datasheet"} and r["decode_step_ms"] > 0
    assert len(r["steps"]["mfu_percent"]) == r["num_steps"] and r["steps"]["time_s"][0] == 0
    rows = dict((name, value) for name, value, _ in utilization_rows(r))
    assert rows["util.gpu (NVML)"] == "N/A" and rows["SM occupancy (GPM)"] == "N/A"
    assert list(trace_series(r)) == ["MFU % per step (measured peak)", "MBU % per step (measured peak)"]
    assert rows["MFU (measured peak)"].endswith("%") and "0.0%" != rows["MFU (measured peak)"]
    assert (
        "N/A"
        in utilization_rows(decode_utilization(tiny_engine(), prompts(tiny_llama, 1), 0.0, PEAKS, sampler=None))[0][1]
    )


def test_a_gpu_with_gpm_reports_util_occupancy_and_bandwidth(tiny_engine, tiny_llama):
    gpu = FakeGPU(util_gpu=97)
    sampler = TelemetrySampler(DeviceId(uuid=gpu.uuid), interval_s=0.01, nvml=FakeNVML([gpu]))
    r = decode_utilization(tiny_engine(), prompts(tiny_llama, 1), 0.15, PEAKS, sampler=sampler)
    assert r["nvml_unavailable"] is None and r["nvml"]["time_s"]
    assert set(r["nvml"]) >= {"time_s", "util_gpu_percent", "sm_occupancy_percent", "dram_bw_util_percent"}
    assert r["nvml_summary"]["util_gpu_percent_median"] == 97
    rows = dict((name, value) for name, value, _ in utilization_rows(r))
    assert rows["util.gpu (NVML)"].startswith("97.0%") and rows["SM occupancy (GPM)"].startswith("12.5%")
    assert rows["DRAM bandwidth (GPM)"].startswith("80.0%")
    series = trace_series(r)
    assert "util.gpu % (NVML)" in series and "SM occupancy % (GPM)" in series
    times, values = series["util.gpu % (NVML)"]
    assert len(times) == len(values) and set(values) == {97.0}


def test_a_gpu_without_gpm_says_na_never_zero(tiny_engine, tiny_llama):
    gpu = FakeGPU(gpm=False)
    sampler = TelemetrySampler(DeviceId(uuid=gpu.uuid), interval_s=0.01, nvml=FakeNVML([gpu]))
    r = decode_utilization(tiny_engine(), prompts(tiny_llama, 1), 0.1, PEAKS, sampler=sampler)
    rows = dict((name, value) for name, value, _ in utilization_rows(r))
    assert rows["util.gpu (NVML)"].startswith("97.0%")
    assert rows["SM occupancy (GPM)"].startswith("N/A: GPM metrics need a Hopper")
    assert all(v is None for v in r["nvml"]["sm_occupancy_percent"])
    assert "SM occupancy % (GPM)" not in trace_series(r) and "util.gpu % (NVML)" in trace_series(r)


# -- the profile --------------------------------------------------------------------------------


def test_profile_decode_finds_the_matrix_products(tiny_engine, tiny_llama):
    engine = tiny_engine()
    p = profile_decode(engine, prompts(tiny_llama, 2), steps=3)
    cpu = p["cpu"]
    assert p["device"] is None and p["steps"] == 3 and p["step_ms"] > 0
    assert cpu["matmul_us"] > 0 and cpu["other_ops_us"] > 0
    assert 0 < cpu["matmul_share"] < 1 and cpu["matmul_share"] + cpu["other_ops_share"] <= 1 + 1e-6
    assert any(is_mm for _, _, is_mm in cpu["top_ops"])
    assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError):
        profile_decode(engine, prompts(tiny_llama, 1), steps=0)


def test_decode_ops_counts_one_decode_step_and_leaves_the_engine_idle(tiny_engine, tiny_llama):
    from minieng.lab.gpu_utilization import decode_ops

    engine = tiny_engine()
    got = decode_ops(engine, random_prompts([6, 9], tiny_llama[1].model.config.vocab_size, seed=1))
    assert got["batch_size"] == 2 and got["computing_per_layer"] == 14 and got["ops_per_layer"] == 24
    assert got["step_ops"] > 24 * len(engine.model.layers)  # the step's own ops beside the layers'
    assert not engine.has_unfinished_requests() and not engine.requests


def test_graphs_verdict_on_a_gpu_and_not_testable_on_a_cpu():
    assert graphs_verdict(14.0, 2.2, cuda=True) == "holds: CUDA graphs cut TPOT 6.36x"
    assert graphs_verdict(14.0, 13.0, cuda=True).startswith("does not hold here: CUDA graphs cut TPOT only 1.08x")
    assert graphs_verdict(40.0, 40.0, cuda=False).startswith("not testable here: a CPU launches no kernels")
