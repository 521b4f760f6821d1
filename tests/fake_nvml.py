"""A fake NVML (nvidia-ml-py's module surface) for tests on machines without an NVIDIA driver:
GPUs with settable readings, GPM metrics and errors. Shared by tests/measure/test_nvml.py,
tests/measure/test_energy.py and tests/lab/test_gpu_utilization.py (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    message = "Unknown Error"

    def __str__(self):
        return self.message


class NVMLError_LibraryNotFound(NVMLError):
    message = "NVML Shared Library Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    message = "Driver Not Loaded"


class NVMLError_NotSupported(NVMLError):
    message = "Not Supported"


@dataclass
class FakeGPU:
    uuid: str | bytes = "GPU-11111111-2222-3333-4444-555555555555"
    pci: tuple[int, int, int] = (0, 0x17, 0)
    util_gpu: int = 97
    util_memory: int = 41
    power_mw: int = 350_000
    sm_clock_mhz: int = 1980
    memory_used_bytes: int = 12 * 1024**3
    temperature_c: int = 55
    throttle_reasons: int = 0x4
    mig: bool = False
    gpm: bool = True  # Hopper or newer
    gpm_values: dict = field(default_factory=lambda: {3: 12.5, 10: 80.0, 5: 3.0})
    gpm_metric_errors: dict = field(default_factory=dict)  # metricId -> NVML return code
    errors: dict = field(default_factory=dict)  # NVML function name -> exception class
    # The total-energy counter (mJ): it grows by power_mw x seconds between reads, wrapping to 0
    # after energy_wrap_mj. Change the power with set_power_mw so the counter accrues the old one first.
    energy_mj: float = 0.0
    energy_wrap_mj: int = 2**64
    energy_reads: list = field(default_factory=list)  # every value the counter returned
    _energy_t: float | None = None  # perf_counter of the last accrual

    def accrue_energy(self) -> None:
        now = time.perf_counter()
        if self._energy_t is not None:
            self.energy_mj = (self.energy_mj + self.power_mw * (now - self._energy_t)) % self.energy_wrap_mj
        self._energy_t = now

    def set_power_mw(self, power_mw: int) -> None:
        self.accrue_energy()
        self.power_mw = power_mw


class FakeNVML:
    """A stand-in for the ``pynvml`` module. Handles are the FakeGPU objects themselves."""

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_SUCCESS = 0
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self, gpus=None, init_error=None):
        self.gpus = [FakeGPU()] if gpus is None else gpus
        self.init_error = init_error
        self.initialized = 0  # nvmlInit minus nvmlShutdown calls
        self.calls: dict[str, int] = {}
        self.gpm_seq = 0
        self.gpm_queries = []

    def _call(self, name, handle=None):
        self.calls[name] = self.calls.get(name, 0) + 1
        if handle is not None and name in handle.errors:
            raise handle.errors[name]()

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error()
        self.initialized += 1

    def nvmlShutdown(self):
        self.initialized -= 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlSystemGetDriverVersion(self):
        return "570.86.15"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200" if h.gpm else "Tesla T4"

    def nvmlDeviceGetUUID(self, h):
        return h.uuid

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(domain=h.pci[0], bus=h.pci[1], device=h.pci[2])

    def nvmlDeviceGetMigMode(self, h):
        self._call("nvmlDeviceGetMigMode", h)
        return [int(h.mig), int(h.mig)]

    def nvmlDeviceGetUtilizationRates(self, h):
        self._call("nvmlDeviceGetUtilizationRates", h)
        if h.mig:
            raise NVMLError_NotSupported()
        return SimpleNamespace(gpu=h.util_gpu, memory=h.util_memory)

    def nvmlDeviceGetPowerUsage(self, h):
        self._call("nvmlDeviceGetPowerUsage", h)
        return h.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self._call("nvmlDeviceGetTotalEnergyConsumption", h)
        h.accrue_energy()
        h.energy_reads.append(int(h.energy_mj))
        return h.energy_reads[-1]

    def nvmlDeviceGetClockInfo(self, h, clock):
        self._call("nvmlDeviceGetClockInfo", h)
        assert clock == self.NVML_CLOCK_SM
        return h.sm_clock_mhz

    def nvmlDeviceGetMemoryInfo(self, h):
        self._call("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(used=h.memory_used_bytes, total=80 * 1024**3)

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._call("nvmlDeviceGetTemperature", h)
        return h.temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
        return h.throttle_reasons

    # GPM: buffers record the order in which they were filled.
    def nvmlGpmQueryDeviceSupport(self, h):
        self._call("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=int(h.gpm))

    def nvmlGpmSampleAlloc(self):
        self._call("nvmlGpmSampleAlloc")
        return SimpleNamespace(seq=None, freed=False)

    def nvmlGpmSampleFree(self, sample):
        sample.freed = True

    def nvmlGpmSampleGet(self, h, sample):
        self._call("nvmlGpmSampleGet", h)
        self.gpm_seq += 1
        sample.seq = self.gpm_seq
        return sample

    class c_nvmlGpmMetricsGet_t:
        def __init__(self):
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)]

    def nvmlGpmMetricsGet(self, query):
        assert query.version == 1 and query.sample1 is not query.sample2
        assert query.sample1.seq < query.sample2.seq, "sample1 must be the earlier sample"
        self.gpm_queries.append((query.sample1.seq, query.sample2.seq))
        gpu = self.gpus[0]
        for m in query.metrics[: query.numMetrics]:
            m.nvmlReturn = gpu.gpm_metric_errors.get(m.metricId, 0)
            m.value = gpu.gpm_values[m.metricId] if m.nvmlReturn == 0 else 0.0
        return query
