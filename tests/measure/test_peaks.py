"""The machine: datasheet matching, the roofline ridge, the dtype policy, device checks, ceilings.

Everything here runs on a CPU: CUDA capabilities are faked with monkeypatch, and the ceilings are
measured on tiny sizes (their values are only checked for sign and bookkeeping, never for speed).
"""

from __future__ import annotations

import pytest
import torch

from minieng.device import DTYPES, dtype_choice, select_device, select_dtype
from minieng.measure import peaks
from minieng.measure.harness import Measurement
from minieng.measure.peaks import Peak, datasheet_peak

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # constructing a device object needs no GPU


# -- datasheet matching ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "torch_name,entry,tflops,gbps",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989, 3350),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756, 2000),
        ("NVIDIA H200", "H200", 989, 4800),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 312, 2039),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB", 312, 1555),
        ("NVIDIA A10", "A10", 125, 600),
        ("NVIDIA L4", "L4", 121, 300),
        ("NVIDIA L40S", "L40S", 362, 864),
        ("Tesla T4", "T4", 65, 320),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 165, 1008),
        ("NVIDIA GeForce RTX 3090", "RTX 3090", 71, 936),
    ],
)
def test_datasheet_matches_torch_device_names(torch_name, entry, tflops, gbps):
    peak = datasheet_peak(torch_name)
    assert peak == Peak(entry, tflops, gbps, "datasheet")


def test_a10_and_a100_do_not_match_each_other():
    assert datasheet_peak("NVIDIA A10").name == "A10"
    assert datasheet_peak("NVIDIA A100-PCIE-40GB").name != "A10"
    assert datasheet_peak("NVIDIA A100-SXM4-80GB").name != "A10"


@pytest.mark.parametrize("torch_name", ["Some Future Accelerator 9000", "AMD Instinct MI300X", "cpu", ""])
def test_unknown_device_has_no_datasheet(torch_name):
    assert datasheet_peak(torch_name) is None


@pytest.mark.parametrize(
    "torch_name,wrong",
    [
        ("NVIDIA L40", "L4"),  # a 48 GB, 864 GB/s card: "L4" is a substring of its name
        ("NVIDIA T400", "T4"),  # a small workstation card: "T4" is a substring of its name
    ],
)
def test_datasheet_does_not_match_on_a_substring_of_another_model_number(torch_name, wrong):
    """A device absent from the table must get no datasheet (DESIGN.md section 5: "an unknown device
    gets measured ceilings only"), not the peaks of a card whose number is a prefix of its own:
    the L4's 300 GB/s against an L40's 864 GB/s would make MBU read ~3x too high."""
    peak = datasheet_peak(torch_name)
    assert peak is None or peak.name != wrong, f"{torch_name!r} matched the {peak.name} datasheet"


def test_ridge_point_is_peak_over_bandwidth():
    h200 = datasheet_peak("NVIDIA H200")
    assert h200.ridge_flop_per_byte == pytest.approx(989e12 / 4800e9)
    made_up = Peak("x", 2.0, 500.0, "measured")
    assert made_up.ridge_flop_per_byte == pytest.approx(2e12 / 500e9)  # 4 FLOP/byte


# -- dtype policy ---------------------------------------------------------------------------------


def test_cpu_gets_float32_with_a_reason():
    name, reason = dtype_choice(CPU)
    assert name == "float32"
    assert "CPU" in reason and "bf16" in reason
    assert select_dtype("auto", CPU) is torch.float32
    assert not peaks.has_native_bf16(CPU)


@pytest.mark.parametrize(
    "capability,expected", [((7, 5), "float16"), ((8, 0), "bfloat16"), ((9, 0), "bfloat16"), ((7, 0), "float16")]
)
def test_cuda_dtype_follows_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    name, reason = dtype_choice(CUDA)
    assert name == expected
    assert f"{capability[0]}.{capability[1]}" in reason
    assert select_dtype("auto", CUDA) is DTYPES[expected]
    assert peaks.has_native_bf16(CUDA) == (expected == "bfloat16")


def test_explicit_dtype_is_taken_as_given():
    assert select_dtype("bfloat16", CPU) is torch.bfloat16
    assert select_dtype("float16", CPU) is torch.float16


# -- device selection and the environment check ---------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_select_cuda_without_a_gpu_is_a_value_error(name):
    with pytest.raises(ValueError, match="no CUDA GPU"):
        select_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_select_device_auto_and_cpu():
    assert select_device("auto") == CPU
    assert select_device("cpu") == CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_check_environment_on_cpu_reports_na_not_zero():
    env = peaks.check_environment()
    assert env.device == "cpu"
    assert env.compute_capability is None and env.gpu_memory_bytes is None
    assert env.native_bf16 is False
    assert env.nvml.startswith("N/A")
    assert env.datasheet is None
    assert env.dtype == "float32" and env.dtype_reason
    assert env.torch_threads == torch.get_num_threads()
    text = "\n".join(env.lines())
    assert "GPU memory        N/A" in text
    assert "compute capability N/A" in text
    assert "measured ceilings only" in text
    if env.host_ram_bytes is not None:  # /proc/meminfo on Linux
        assert env.host_ram_bytes > 0


def test_host_memory_is_positive_or_unknown():
    total, avail = peaks.host_memory_bytes()
    assert total is None or total > 0
    assert avail is None or (avail > 0 and (total is None or avail <= total))


# -- measured ceilings ----------------------------------------------------------------------------


def test_measure_matmul_on_cpu():
    m = peaks.measure_matmul(CPU, torch.float32, n=48, repeats=3)
    assert m.unit == "FLOP/s"
    assert m.runs == 3
    assert all(v > 0 for v in m.values)
    assert m.p10 <= m.median <= m.p90
    assert m.fingerprint["device"] == "cpu"


def test_measure_copy_on_cpu():
    m = peaks.measure_copy(CPU, nbytes=64 * 1024, repeats=4)
    assert m.unit == "B/s"
    assert m.runs == 4
    assert all(v > 0 for v in m.values)


def test_measure_ceilings_returns_a_measured_peak(monkeypatch):
    # The real measurement code on small sizes: the bookkeeping is what is under test here.
    monkeypatch.setattr(peaks, "ceiling_sizes", lambda device, dtype: (64, 1 << 20))
    peak, mm, cp = peaks.measure_ceilings(CPU, torch.float32, repeats=3, rounds=2)
    assert peak.source == "measured"
    assert "cpu" in peak.name and "float32" in peak.name
    assert mm.runs == cp.runs == 2 * 3  # rounds x repeats, pooled
    assert mm.fingerprint["matmul_n"] == 64 and cp.fingerprint["copy_bytes"] == 1 << 20
    assert peak.peak_tflops == pytest.approx(mm.max / 1e12)
    assert peak.bandwidth_gbps == pytest.approx(cp.max / 1e9)
    assert peak.peak_tflops > 0 and peak.bandwidth_gbps > 0


def test_measure_ceilings_takes_the_best_run_of_interleaved_rounds(monkeypatch):
    """Other work on the machine only slows a run: the ceiling is the best run of any round, and
    the rounds alternate matmul and copy, so a burst of load slows some runs of each."""
    order = []
    rounds = iter([([1e12, 2e12], [10e9, 50e9]), ([5e12, 3e12], [20e9, 30e9])])

    def matmul(device, dtype, n=None, repeats=5):
        order.append(("matmul", n))
        flops, copies = next(rounds)
        matmul.copies = copies
        return Measurement(flops, "FLOP/s", {"matmul_n": n})

    def copy(device, nbytes=None, repeats=5):
        order.append(("copy", nbytes))
        return Measurement(matmul.copies, "B/s", {"copy_bytes": nbytes})

    monkeypatch.setattr(peaks, "ceiling_sizes", lambda device, dtype: (2048, 256 << 20))
    monkeypatch.setattr(peaks, "measure_matmul", matmul)
    monkeypatch.setattr(peaks, "measure_copy", copy)
    peak, mm, cp = peaks.measure_ceilings(CPU, torch.float32, repeats=2, rounds=2)
    assert order == [("matmul", 2048), ("copy", 256 << 20)] * 2  # sized once, alternating
    assert mm.values == [1e12, 2e12, 5e12, 3e12] and cp.values == [10e9, 50e9, 20e9, 30e9]
    assert peak.peak_tflops == pytest.approx(5.0)
    assert peak.bandwidth_gbps == pytest.approx(50.0)


# -- the ceilings' buffers on a GPU: sized from its free memory (a T4, simulated) -------------------

T4_TOTAL = 15 * 1024**3


def simulate_free_memory(monkeypatch, free_bytes: int, total_bytes: int = T4_TOTAL) -> None:
    """What ``torch.cuda`` reports on a GPU with ``free_bytes`` free: the figures the sizing reads."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_bytes, total_bytes))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def test_ceiling_sizes_on_a_cpu_are_fixed():
    assert peaks.ceiling_sizes(CPU, torch.float32) == (2048, 256 * 1024**2)


def test_ceiling_sizes_on_an_empty_t4_take_the_full_sizes(monkeypatch):
    simulate_free_memory(monkeypatch, T4_TOTAL - 300 * 1024**2)  # the CUDA context holds ~300 MiB
    n, nbytes = peaks.ceiling_sizes(CUDA, torch.float16)
    assert (n, nbytes) == (8192, 2 * 1024**3)
    assert 3 * n * n * 2 + 2 * nbytes <= peaks.CEILINGS_MEMORY_SHARE * (T4_TOTAL - 300 * 1024**2)


@pytest.mark.parametrize("free_gib", [1.4, 2.5, 6.0])
def test_ceiling_sizes_beside_a_kv_pool_fit_what_is_left(monkeypatch, free_gib):
    """Issue 19, item 2: an engine whose pool took 90% of a T4 leaves ~1.4 GiB; the copy used to
    take 2 x 2 GiB whatever was free. Now matmul and copy fit half of what is free."""
    free = int(free_gib * 1024**3)
    simulate_free_memory(monkeypatch, free)
    n, nbytes = peaks.ceiling_sizes(CUDA, torch.float16)
    assert 3 * n * n * 2 + 2 * nbytes <= peaks.CEILINGS_MEMORY_SHARE * free
    assert n >= peaks.MIN_MATMUL_N and n % 1024 == 0
    assert nbytes >= peaks.MIN_COPY_BYTES


def test_ceiling_sizes_refuse_with_advice_when_the_gpu_is_full(monkeypatch):
    simulate_free_memory(monkeypatch, 200 * 1024**2)
    with pytest.raises(RuntimeError, match="before building an engine") as e:
        peaks.ceiling_sizes(CUDA, torch.float16)
    assert "kv_cache_memory_gib" in str(e.value) and "0.20 GiB free" in str(e.value)


def test_measure_ceilings_on_a_simulated_t4_beside_an_engine_never_asks_for_more_than_is_free(monkeypatch):
    """The whole measurement on a 'GPU' whose allocations are counted: tensors are tiny CPU
    stand-ins, but every allocation's requested bytes are charged against the T4's free memory,
    as the CUDA allocator would. Before the fix the copy asked for 2 GiB twice with 1.4 GiB free."""
    from minieng.measure import harness

    free = int(1.4 * 1024**3)  # a device-sized KV pool took the rest
    simulate_free_memory(monkeypatch, free)
    live, requested, peak = [], {}, [0]  # bytes of each allocation; stand-in tensor -> its bytes
    real_empty, real_empty_like, real_randn = torch.empty, torch.empty_like, torch.randn

    def charge(nbytes, stand_in):
        live.append(nbytes)
        requested[id(stand_in)] = nbytes
        peak[0] = max(peak[0], sum(live))
        if sum(live) > free:
            raise torch.OutOfMemoryError(f"CUDA out of memory: tried to allocate {nbytes / 1024**3:.2f} GiB")
        return stand_in

    def numel(shape):
        count = 1
        for d in shape:
            count *= d
        return count

    def fake_empty(*shape, device=None, dtype=None):
        return charge(numel(shape) * (dtype or torch.float32).itemsize, real_empty(8, dtype=torch.float32))

    def fake_empty_like(t):
        return charge(requested[id(t)], real_empty_like(t))

    def fake_randn(*shape, device=None, dtype=None):
        return charge(numel(shape) * (dtype or torch.float32).itemsize, real_randn(8, 8, dtype=torch.float32))

    def release(*args, **kwargs):
        live.clear()

    monkeypatch.setattr(torch, "empty", fake_empty)
    monkeypatch.setattr(torch, "empty_like", fake_empty_like)
    monkeypatch.setattr(torch, "randn", fake_randn)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", release)
    monkeypatch.setattr(harness, "fingerprint", lambda device="cpu", dtype=None: {"device": "cuda"})
    peaks.measure_ceilings(CUDA, torch.float16, repeats=1, rounds=1)
    assert 0 < peak[0] <= peaks.CEILINGS_MEMORY_SHARE * free
