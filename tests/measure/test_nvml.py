"""NVML telemetry against a fake NVML module: no GPU, no driver, no nvidia-ml-py needed.

The fake implements only the calls ``minieng.measure.nvml`` makes, with pynvml's names, and lets a
test set every value and make any call raise, as NVML does on a GPU without the feature.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from fake_nvml import (
    FakeGPU,
    FakeNVML,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    NVMLError_NotSupported,
)

from minieng.measure import nvml
from minieng.measure.nvml import DeviceId, Sample, TelemetrySampler, find_nvml_handle, summarize


def run_sampler(fake, seconds=0.25, interval_s=0.02, **kwargs) -> TelemetrySampler:
    with TelemetrySampler(interval_s=interval_s, nvml=fake, **kwargs) as sampler:
        time.sleep(seconds)
    return sampler


def test_fake_mirrors_real_pynvml():
    """Every name the fake provides exists in nvidia-ml-py, constants with the same values."""
    pynvml = pytest.importorskip("pynvml")
    for name in dir(FakeNVML):
        if name.startswith(("nvml", "NVML", "c_nvml")):
            assert hasattr(pynvml, name), name
        if name.startswith("NVML_"):
            assert getattr(pynvml, name) == getattr(FakeNVML, name), name


def test_gpm_query_with_real_ctypes_structures():
    pynvml = pytest.importorskip("pynvml")

    class Hybrid(FakeNVML):  # the fake's device, nvidia-ml-py's GPM structures
        c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t

        def nvmlGpmSampleAlloc(self):
            return pynvml.c_nvmlGpmSample_t()

        def nvmlGpmSampleGet(self, h, sample):
            return sample

        def nvmlGpmMetricsGet(self, query):
            assert query.version == pynvml.NVML_GPM_METRICS_GET_VERSION and query.numMetrics == 3
            for i, value in enumerate([11.0, 22.0, 33.0]):
                query.metrics[i].value = value
            query.metrics[1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return query

    sampler = run_sampler(Hybrid(), seconds=0.1)
    s = sampler.samples[-1]
    assert (s.sm_occupancy_percent, s.dram_bw_util_percent, s.tensor_util_percent) == (11.0, None, 33.0)
    assert list(sampler.na_reasons) == ["dram_bw_util_percent"]


# -- sampling --------------------------------------------------------------------------------


def test_sampler_records_every_field_at_the_interval():
    fake = FakeNVML()
    sampler = run_sampler(fake, seconds=0.3, interval_s=0.02)
    samples = sampler.samples
    assert sampler.available and sampler.unavailable_reason is None
    # ~15 expected; loose bounds so a slow CI machine does not fail (the schedule never runs ahead)
    assert 3 <= len(samples) <= 0.3 / 0.02 + 2
    times = [s.time_s for s in samples]
    assert times == sorted(times)
    assert 0.01 <= statistics.median(b - a for a, b in zip(times, times[1:])) <= 0.1
    s = samples[-1]
    assert (s.util_gpu_percent, s.util_memory_percent, s.power_w) == (97.0, 41.0, 350.0)
    assert (s.sm_clock_mhz, s.memory_used_bytes, s.temperature_c, s.throttle_reasons) == (1980, 12 * 1024**3, 55, 4)
    assert (s.sm_occupancy_percent, s.dram_bw_util_percent, s.tensor_util_percent) == (12.5, 80.0, 3.0)
    # GPM needs two samples: the first has none; each later one spans consecutive samples
    assert samples[0].sm_occupancy_percent is None
    assert fake.gpm_queries == [(i, i + 1) for i in range(1, len(samples))]
    assert sampler.na_reasons == {}
    assert fake.initialized == 0, "nvmlInit and nvmlShutdown must pair up"


def test_sampler_clock_is_the_engine_clock():
    before = time.perf_counter()
    sampler = run_sampler(FakeNVML(), seconds=0.05)
    assert before <= sampler.samples[0].time_s <= time.perf_counter()


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        TelemetrySampler(interval_s=0)


# -- device matching -------------------------------------------------------------------------


class _CUuuid:
    """torch's uuid object: str() gives the UUID without NVML's 'GPU-' prefix."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


def two_gpus():
    return [
        FakeGPU(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000", pci=(0, 0x17, 0), power_mw=100_000),
        FakeGPU(uuid=b"GPU-BBBBBBBB-0000-0000-0000-000000000000", pci=(0, 0x65, 0), power_mw=200_000),
    ]


def test_torch_index_0_is_nvml_index_1_matched_by_uuid(monkeypatch):
    # CUDA_VISIBLE_DEVICES=1: torch's cuda:0 is NVML's device 1 (whose UUID NVML gives as bytes)
    props = SimpleNamespace(
        uuid=_CUuuid("bbbbbbbb-0000-0000-0000-000000000000"), pci_domain_id=0, pci_bus_id=0x99, pci_device_id=0
    )  # PCI deliberately wrong
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    fake = FakeNVML(two_gpus())
    sampler = run_sampler(fake, seconds=0.05, device=0)
    assert sampler.available
    assert sampler.samples[0].power_w == 200.0


def test_match_by_pci_when_uuid_differs():
    # a MIG instance's UUID differs from its parent GPU's; the PCI bus id still matches
    gpus = two_gpus()
    assert find_nvml_handle(FakeNVML(gpus), DeviceId("mig-1234", (0, 0x65, 0))) is gpus[1]
    assert find_nvml_handle(FakeNVML(gpus), DeviceId(None, (0, 0x17, 0))) is gpus[0]
    assert find_nvml_handle(FakeNVML(gpus), DeviceId("GPU-AAAAAAAA-0000-0000-0000-000000000000")) is gpus[0]


def test_no_matching_device_is_unavailable():
    fake = FakeNVML(two_gpus())
    sampler = run_sampler(fake, seconds=0.02, device=DeviceId("cccc", (0, 1, 0)))
    assert not sampler.available and "no NVML device matches" in sampler.unavailable_reason
    assert sampler.samples == [] and fake.initialized == 0


def test_torch_index_without_torch_cuda_is_unavailable(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fake = FakeNVML()
    sampler = run_sampler(fake, seconds=0.02, device=0)
    assert "torch sees no CUDA GPU" in sampler.unavailable_reason and fake.initialized == 0
    # device=None on a CPU-only torch build watches NVML's first GPU
    assert run_sampler(fake, seconds=0.02).samples[0].util_gpu_percent == 97.0


def test_torch_device_id_reads_uuid_and_pci(monkeypatch):
    props = SimpleNamespace(uuid=_CUuuid("ABCD-1"), pci_domain_id=0, pci_bus_id=0x65, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    assert nvml.torch_device_id(0) == DeviceId("abcd-1", (0, 0x65, 0))


# -- N/A paths -------------------------------------------------------------------------------


def test_pynvml_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert "nvidia-ml-py" in nvml.unavailable_reason()
    assert not nvml.available()
    sampler = run_sampler(None, seconds=0.02)
    assert not sampler.available and "nvidia-ml-py" in sampler.unavailable_reason
    assert sampler.samples == []


@pytest.mark.parametrize(
    "error, words",
    [
        (NVMLError_LibraryNotFound, "no NVIDIA driver"),
        (NVMLError_DriverNotLoaded, "driver is not loaded"),
        (NVMLError, "nvmlInit failed"),
    ],
)
def test_init_errors(error, words):
    fake = FakeNVML(init_error=error)
    assert words in nvml.unavailable_reason(fake)
    sampler = run_sampler(fake, seconds=0.02)
    assert not sampler.available and words in sampler.unavailable_reason
    assert sampler.samples == [] and sampler.stop() == []


def test_zero_devices():
    fake = FakeNVML(gpus=[])
    assert nvml.unavailable_reason(fake) == "NVML sees no GPU"
    sampler = run_sampler(fake, seconds=0.02)
    assert sampler.unavailable_reason == "NVML sees no GPU" and sampler.samples == []
    assert fake.initialized == 0


def test_available_with_a_gpu():
    fake = FakeNVML()
    assert nvml.unavailable_reason(fake) is None and nvml.available(fake)
    assert fake.initialized == 0


def test_mig_mode_reports_utilization_as_na():
    fake = FakeNVML([FakeGPU(mig=True)])
    sampler = run_sampler(fake, seconds=0.05)
    assert sampler.available and sampler.samples
    for s in sampler.samples:
        assert s.util_gpu_percent is None and s.util_memory_percent is None
        assert s.sm_occupancy_percent is None and s.tensor_util_percent is None
        assert s.power_w == 350.0 and s.memory_used_bytes == 12 * 1024**3
    assert "MIG" in sampler.na_reasons["util_gpu_percent"]
    assert "nvmlDeviceGetUtilizationRates" not in fake.calls
    assert "nvmlGpmSampleAlloc" not in fake.calls


def test_unsupported_field_is_none_not_zero_and_others_still_recorded():
    fake = FakeNVML([FakeGPU(errors={"nvmlDeviceGetPowerUsage": NVMLError_NotSupported})])
    sampler = run_sampler(fake, seconds=0.1)
    assert len(sampler.samples) >= 2
    for s in sampler.samples:
        assert s.power_w is None
        assert s.util_gpu_percent == 97.0 and s.sm_clock_mhz == 1980 and s.temperature_c == 55
    assert sampler.na_reasons == {"power_w": "NVMLError_NotSupported: Not Supported"}
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1, "an N/A field is not asked again every tick"


def test_mig_query_not_supported_means_no_mig():
    fake = FakeNVML([FakeGPU(errors={"nvmlDeviceGetMigMode": NVMLError_NotSupported})])
    sampler = run_sampler(fake, seconds=0.02)
    assert sampler.samples[0].util_gpu_percent == 97.0


@pytest.mark.parametrize(
    "gpu",
    [FakeGPU(gpm=False), FakeGPU(errors={"nvmlGpmQueryDeviceSupport": NVMLError_NotSupported})],
    ids=["not-supported-flag", "query-raises"],
)
def test_gpm_unsupported_before_hopper(gpu):
    fake = FakeNVML([gpu])
    sampler = run_sampler(fake, seconds=0.1)
    assert sampler.available and len(sampler.samples) >= 2
    for s in sampler.samples:
        assert (s.sm_occupancy_percent, s.dram_bw_util_percent, s.tensor_util_percent) == (None, None, None)
        assert s.util_gpu_percent == 97.0
    assert set(sampler.na_reasons) == set(nvml.GPM_FIELDS)
    assert "nvmlGpmSampleAlloc" not in fake.calls


def test_one_gpm_metric_failing_leaves_the_others():
    fake = FakeNVML([FakeGPU(gpm_metric_errors={10: 3})])  # DRAM BW util: NVML_ERROR_NOT_SUPPORTED
    s = run_sampler(fake, seconds=0.1).samples[-1]
    assert s.dram_bw_util_percent is None
    assert s.sm_occupancy_percent == 12.5 and s.tensor_util_percent == 3.0


def test_real_machine_without_driver_reports_unavailable():
    if nvml.available():
        pytest.skip("NVML works on this machine")
    reason = nvml.unavailable_reason()
    assert isinstance(reason, str) and reason
    with TelemetrySampler() as sampler:
        time.sleep(0.02)
    assert not sampler.available and sampler.unavailable_reason == reason
    assert sampler.samples == []
    assert nvml.nvml_status() == f"N/A: {reason}"
    assert set(nvml.read_clocks().values()) == {None}


def test_module_does_not_need_pynvml_at_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    spec = importlib.util.spec_from_file_location("nvml_copy", nvml.__file__)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "nvml_copy", module)  # dataclasses look their module up
    spec.loader.exec_module(module)  # would raise ImportError if pynvml were imported at import
    assert "nvidia-ml-py" in module.unavailable_reason()


# -- one-shot readings: environment report, measurement fingerprint ---------------------------


def test_nvml_status_says_what_the_gpu_reports():
    fake = FakeNVML()
    assert nvml.nvml_status(nvml=fake) == "NVIDIA H200, driver 570.86.15; GPM metrics available"
    assert "Hopper" in nvml.nvml_status(nvml=FakeNVML([FakeGPU(gpm=False)]))
    assert "MIG" in nvml.nvml_status(nvml=FakeNVML([FakeGPU(mig=True)]))
    assert nvml.nvml_status(nvml=FakeNVML(init_error=NVMLError_DriverNotLoaded)).startswith("N/A: ")
    assert nvml.nvml_status(DeviceId("nope"), nvml=fake).startswith("N/A: no NVML device matches")
    assert fake.initialized == 0


def test_read_clocks():
    assert nvml.read_clocks(nvml=FakeNVML()) == {
        "driver_version": "570.86.15",
        "sm_clock_mhz": 1980,
        "temperature_c": 55,
        "throttle_reasons": 4,
    }
    gpu = FakeGPU(errors={"nvmlDeviceGetTemperature": NVMLError_NotSupported})
    assert nvml.read_clocks(nvml=FakeNVML([gpu]))["temperature_c"] is None
    no_driver = nvml.read_clocks(nvml=FakeNVML(init_error=NVMLError_LibraryNotFound))
    assert set(no_driver) == {"driver_version", "sm_clock_mhz", "temperature_c", "throttle_reasons"}
    assert set(no_driver.values()) == {None}


def test_failed_gpm_allocation_leaves_only_gpm_na():
    class NoGpmMemory(FakeNVML):
        def nvmlGpmSampleAlloc(self):
            raise NVMLError()

    sampler = run_sampler(NoGpmMemory(), seconds=0.05)
    assert sampler.available and sampler.samples[-1].util_gpu_percent == 97.0
    assert sampler.samples[-1].sm_occupancy_percent is None
    assert set(sampler.na_reasons) == set(nvml.GPM_FIELDS)


# -- traces and steps ------------------------------------------------------------------------


def trace(times, **values) -> list[Sample]:
    blank = dict.fromkeys(nvml.VALUE_FIELDS)
    return [Sample(t, **{**blank, **{k: v[i] for k, v in values.items()}}) for i, t in enumerate(times)]


def test_summarize_ignores_none():
    samples = trace(
        [0.0, 1.0, 2.0, 3.0],
        util_gpu_percent=[100.0, None, 90.0, 95.0],
        power_w=[None] * 4,
        throttle_reasons=[0, 4, None, 1],
    )
    out = summarize(samples)
    assert out["num_samples"] == 4 and out["duration_s"] == 3.0 and out["reliable"]
    assert out["util_gpu_percent_median"] == 95.0
    assert out["power_w_median"] is None, "all N/A stays N/A, never 0"
    assert out["throttle_reasons_any"] == 5
    short = summarize(trace([0.0, 0.5], util_gpu_percent=[99.0, 99.0]))
    assert not short["reliable"], "runs under ~2 s give meaningless util"
    assert summarize([])["num_samples"] == 0 and summarize([])["util_gpu_percent_median"] is None
