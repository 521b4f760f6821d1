"""NVML telemetry: what the GPU reports about itself while the engine runs.

A ``TelemetrySampler`` thread reads NVML (nvidia-ml-py, imported lazily as ``pynvml``) every
``interval_s`` and keeps ``Sample``s stamped with ``time.perf_counter()``, the clock of the
engine's ``StepRecord``s, so they line up with its steps.

Read util.gpu with care. ``nvmlDeviceGetUtilizationRates(h).gpu`` is the percent of the last
sample period (1/6 s to 1 s by product) during which at least one kernel ran. It is neither SM
occupancy nor efficiency: batch-1 decode, one small kernel after another, can read ~100% while
its MFU is under 1%. The honest counterparts are the GPM metrics of Hopper and newer GPUs
(SM occupancy, DRAM bandwidth utilization, tensor activity), sampled here where the GPU has them.
NVML averages over its own period, so runs shorter than ~2 s give meaningless util.

N/A is ``None``, never 0: no driver, no GPU, MIG mode (no whole-GPU utilization) or a field the
GPU does not support. None of these raise: ``unavailable_reason`` says why NVML cannot be used at
all, ``TelemetrySampler.na_reasons`` why each N/A field is N/A (recorded once). NVML numbers GPUs
ignoring CUDA_VISIBLE_DEVICES, so the torch device is matched by UUID, else by PCI bus id.
``nvml_status`` and ``read_clocks`` are one-shot readings for environment reports and the
fingerprints of measurements. This module plots nothing and knows of the engine only
``StepRecord.start_s``/``duration_s``.
"""

from __future__ import annotations

import functools
import operator
import statistics
import threading
import time
from dataclasses import dataclass, fields

import torch

MIN_RELIABLE_S = 2.0  # NVML averages util over up to 1 s: shorter runs give meaningless util


@dataclass
class Sample:
    """One NVML reading; every value but ``time_s`` may be None (N/A)."""

    time_s: float  # time.perf_counter() when the reading began
    util_gpu_percent: float | None  # % of NVML's period with >= 1 kernel running
    util_memory_percent: float | None  # % of NVML's period device memory was read or written
    power_w: float | None
    sm_clock_mhz: float | None
    memory_used_bytes: int | None
    temperature_c: float | None
    throttle_reasons: int | None  # bitmask of NVML clock event (throttle) reasons
    sm_occupancy_percent: float | None  # GPM (Hopper+): active warps / maximum warps
    dram_bw_util_percent: float | None  # GPM: DRAM bandwidth used / peak
    tensor_util_percent: float | None  # GPM: % of time SMs ran any tensor-core instruction


VALUE_FIELDS = tuple(f.name for f in fields(Sample))[1:]
UTIL_FIELDS = ("util_gpu_percent", "util_memory_percent")
GPM_FIELDS = ("sm_occupancy_percent", "dram_bw_util_percent", "tensor_util_percent")
_GPM_METRICS = ("NVML_GPM_METRIC_SM_OCCUPANCY", "NVML_GPM_METRIC_DRAM_BW_UTIL", "NVML_GPM_METRIC_ANY_TENSOR_UTIL")


_INIT_ERRORS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver: the NVML library (libnvidia-ml) was not found",
    "NVMLError_DriverNotLoaded": "the NVIDIA driver is not loaded",
}


def _open_nvml(nvml=None):
    """Import (if None) and initialize NVML: ``(nvml, None)``, to be paired with nvmlShutdown,
    or ``(nvml or None, why it cannot be used)``."""
    if nvml is None:
        try:
            import pynvml as nvml  # lazy and optional: nvidia-ml-py, absent on a CPU-only install
        except ImportError:
            return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return nvml, _INIT_ERRORS.get(type(e).__name__, f"nvmlInit failed: {type(e).__name__}: {e}")
    try:
        if nvml.nvmlDeviceGetCount() > 0:
            return nvml, None
        why = "NVML sees no GPU"
    except nvml.NVMLError as e:
        why = f"nvmlDeviceGetCount failed: {type(e).__name__}: {e}"
    nvml.nvmlShutdown()
    return nvml, why


def unavailable_reason(nvml=None) -> str | None:
    """Why NVML telemetry cannot be used here (no module, no driver, no GPU); None if it can."""
    nvml, why = _open_nvml(nvml)
    if why is None:
        nvml.nvmlShutdown()
    return why


def available(nvml=None) -> bool:
    return unavailable_reason(nvml) is None


@dataclass(frozen=True)
class DeviceId:
    """How to find a GPU in NVML: its UUID (any case, 'GPU-' prefix optional), PCI (domain, bus, device)."""

    uuid: str | None = None
    pci: tuple[int, int, int] | None = None


def _norm_uuid(uuid) -> str:
    text = (uuid.decode() if isinstance(uuid, bytes) else str(uuid)).strip().lower()
    return text.removeprefix("gpu-")


def torch_device_id(device: int | torch.device | None = None) -> DeviceId:
    """The UUID and PCI bus id of a torch CUDA device (default: the current one). Its index is
    one after CUDA_VISIBLE_DEVICES, so it need not be the NVML index."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    pci = tuple(getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    return DeviceId(_norm_uuid(uuid) if uuid else None, None if None in pci else pci)


def find_nvml_handle(nvml, device: DeviceId):
    """The NVML handle whose UUID matches ``device``, else the one whose PCI id does, else None.

    A MIG instance's UUID never matches its parent GPU's, so MIG devices are found by PCI id.
    """
    by_pci = None
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        if device.uuid and _norm_uuid(nvml.nvmlDeviceGetUUID(handle)) == _norm_uuid(device.uuid):
            return handle
        if device.pci and by_pci is None:
            info = nvml.nvmlDeviceGetPciInfo(handle)
            by_pci = handle if (info.domain, info.bus, info.device) == device.pci else None
    return by_pci


def _device_handle(nvml, device):
    """``(handle, None)`` for ``device`` as ``TelemetrySampler`` takes it, or ``(None, why not)``."""
    if isinstance(device, DeviceId) or torch.cuda.is_available():
        device = device if isinstance(device, DeviceId) else torch_device_id(device)
        handle = find_nvml_handle(nvml, device)
        return handle, None if handle is not None else f"no NVML device matches {device}"
    if device is None:  # a CPU-only torch build beside a GPU: watch NVML's first GPU
        return nvml.nvmlDeviceGetHandleByIndex(0), None
    return None, f"torch sees no CUDA GPU, so device={device!r} cannot be matched: pass a DeviceId"


def _features(nvml, handle) -> tuple[bool, dict[str, str]]:
    """(GPM usable, N/A reasons) for what the GPU cannot report: util and GPM under MIG, GPM
    before Hopper."""
    try:
        mig = nvml.nvmlDeviceGetMigMode(handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE
    except nvml.NVMLError:  # NotSupported: a GPU without MIG
        mig = False
    if mig:
        why = "MIG mode is enabled: NVML gives no whole-GPU utilization"
        return False, dict.fromkeys(UTIL_FIELDS + GPM_FIELDS, why)
    try:
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            why = "this nvidia-ml-py predates GPM: pip install -U nvidia-ml-py"
        elif nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            return True, {}
        else:
            why = "GPM metrics need a Hopper or newer GPU; this one does not support them"
    except nvml.NVMLError as e:
        why = f"GPM: {type(e).__name__}: {e}"
    return False, dict.fromkeys(GPM_FIELDS, why)


def _throttle_reasons(nvml):
    """The throttle-reasons query: its newer name, else the one older nvidia-ml-py has."""
    newer = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    return newer or nvml.nvmlDeviceGetCurrentClocksThrottleReasons


def _or_none(nvml, read):
    try:
        return read()
    except nvml.NVMLError:
        return None


def nvml_status(device=None, nvml=None) -> str:
    """One line for an environment report: the GPU NVML matched to ``device`` and what it can
    report, or ``"N/A: why"``."""
    nvml, why = _open_nvml(nvml)
    if why is not None:
        return f"N/A: {why}"
    try:
        handle, why = _device_handle(nvml, device)
        if why is not None:
            return f"N/A: {why}"
        gpm, na = _features(nvml, handle)
        name = _or_none(nvml, lambda: nvml.nvmlDeviceGetName(handle))
        driver = _or_none(nvml, nvml.nvmlSystemGetDriverVersion)
        return f"{name}, driver {driver}; " + ("GPM metrics available" if gpm else "; ".join(sorted(set(na.values()))))
    except nvml.NVMLError as e:
        return f"N/A: {type(e).__name__}: {e}"
    finally:
        nvml.nvmlShutdown()


def read_clocks(device=None, nvml=None) -> dict:
    """Now: ``driver_version``, ``sm_clock_mhz``, ``temperature_c``, ``throttle_reasons`` (a
    bitmask); each None where N/A. For a measurement's fingerprint."""
    out = dict.fromkeys(("driver_version", "sm_clock_mhz", "temperature_c", "throttle_reasons"))
    nvml, why = _open_nvml(nvml)
    if why is not None:
        return out
    try:
        handle, _ = _or_none(nvml, lambda: _device_handle(nvml, device)) or (None, None)
        out["driver_version"] = _or_none(nvml, nvml.nvmlSystemGetDriverVersion)
        if handle is not None:
            out["sm_clock_mhz"] = _or_none(nvml, lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
            out["temperature_c"] = _or_none(
                nvml, lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            )
            out["throttle_reasons"] = _or_none(nvml, lambda: _throttle_reasons(nvml)(handle))
    finally:
        nvml.nvmlShutdown()
    return out


class TelemetrySampler:
    """Samples one GPU every ``interval_s`` in a background thread; use as a context manager.

    Args:
        device: a torch CUDA index or ``torch.device``, or a ``DeviceId``. None: torch's current
            CUDA device, or NVML device 0 when torch sees no GPU (a CPU-only torch build).
        interval_s: sampling period; 0.1-0.2 s is useful (NVML's own period is 1/6-1 s).
        nvml: the NVML module (tests pass a fake); default ``pynvml``, imported at ``start``.
    After ``start``: ``available``, ``unavailable_reason`` (None while NVML works; when not
    None, nothing is sampled), ``samples``, ``na_reasons`` (field -> why it is N/A). A field that
    failed once stays N/A for the run. GPM fields of the first sample are None: they need two.
    """

    def __init__(self, device: int | torch.device | DeviceId | None = None, interval_s: float = 0.1, nvml=None):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 s, got {interval_s}; use 0.1-0.2")
        self.device, self.interval_s, self.nvml = device, interval_s, nvml
        self.samples: list[Sample] = []
        self.na_reasons: dict[str, str] = {}
        self.unavailable_reason: str | None = "not started"
        self._handle = self._thread = None
        self._gpm: list | None = None  # two GPM sample buffers: [previous, next to fill]
        self._gpm_primed = False  # True once the previous buffer holds a sample
        self._stop = threading.Event()

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> TelemetrySampler:
        """Open NVML, find the device and start sampling; if NVML is unusable, record why."""
        self.nvml, why = _open_nvml(self.nvml)
        if why is None:
            try:
                why = self._find_device()
            except self.nvml.NVMLError as e:
                why = f"could not find the device in NVML: {type(e).__name__}: {e}"
            if why is not None:
                self.nvml.nvmlShutdown()
        self.unavailable_reason = why
        if why is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="minieng-telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        """Stop the thread and release NVML; return the samples."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            for buffer in self._gpm or ():
                self.nvml.nvmlGpmSampleFree(buffer)
            self._gpm, self._gpm_primed = None, False
            self.nvml.nvmlShutdown()
        return self.samples

    def _find_device(self) -> str | None:
        self._handle, why = _device_handle(self.nvml, self.device)
        if why is None:
            gpm, na = _features(self.nvml, self._handle)
            self.na_reasons.update(na)
            if gpm:  # a failed allocation leaves only the GPM fields N/A
                alloc = self.nvml.nvmlGpmSampleAlloc
                self._gpm = self._read(lambda: [alloc(), alloc()], *GPM_FIELDS)
        return why

    def _run(self) -> None:
        start, ticks = time.perf_counter(), 0
        while not self._stop.is_set():
            self.samples.append(self.sample())
            ticks += 1  # a fixed schedule: slow reads do not make the period drift
            self._stop.wait(max(0.0, start + ticks * self.interval_s - time.perf_counter()))

    def _read(self, read, *names: str):
        """``read()``, or None (N/A) on an NVML error, whose reason is kept for ``names``."""
        if names[0] in self.na_reasons:
            return None
        try:
            return read()
        except self.nvml.NVMLError as e:
            self.na_reasons.update(dict.fromkeys(names, f"{type(e).__name__}: {e}"))
            return None

    def sample(self) -> Sample:
        """One reading now (the thread calls this)."""
        nvml, h, now = self.nvml, self._handle, time.perf_counter()
        reasons = _throttle_reasons(nvml)
        util = self._read(lambda: nvml.nvmlDeviceGetUtilizationRates(h), *UTIL_FIELDS)
        power_mw = self._read(lambda: nvml.nvmlDeviceGetPowerUsage(h), "power_w")
        return Sample(
            now,
            None if util is None else float(util.gpu),
            None if util is None else float(util.memory),
            None if power_mw is None else power_mw / 1000,
            self._read(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM), "sm_clock_mhz"),
            self._read(lambda: nvml.nvmlDeviceGetMemoryInfo(h).used, "memory_used_bytes"),
            self._read(lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU), "temperature_c"),
            self._read(lambda: reasons(h), "throttle_reasons"),
            *(self._read_gpm() if self._gpm else (None,) * len(GPM_FIELDS)),
        )

    def _read_gpm(self) -> tuple:
        """GPM metrics over the interval since the previous GPM sample (None for the first):
        GPM counters are cumulative, so a metric is the difference of two samples."""
        nvml, none = self.nvml, (None,) * len(GPM_FIELDS)
        prev, cur = self._gpm
        if self._read(lambda: nvml.nvmlGpmSampleGet(self._handle, cur), *GPM_FIELDS) is None:
            return none
        self._gpm, primed, self._gpm_primed = [cur, prev], self._gpm_primed, True  # cur starts the next
        if not primed:
            return none
        query = nvml.c_nvmlGpmMetricsGet_t()
        query.version, query.numMetrics = nvml.NVML_GPM_METRICS_GET_VERSION, len(_GPM_METRICS)
        query.sample1, query.sample2 = prev, cur
        for i, name in enumerate(_GPM_METRICS):
            query.metrics[i].metricId = getattr(nvml, name)
        if self._read(lambda: nvml.nvmlGpmMetricsGet(query), *GPM_FIELDS) is None:
            return none
        metrics = list(zip(GPM_FIELDS, query.metrics))
        for name, metric in metrics:
            if metric.nvmlReturn != nvml.NVML_SUCCESS:  # each metric has its own status
                self.na_reasons.setdefault(name, f"nvmlGpmMetricsGet: NVML error {metric.nvmlReturn}")
        return tuple(None if name in self.na_reasons else float(metric.value) for name, metric in metrics)


def summarize(samples: list[Sample]) -> dict:
    """The medians of every field over a trace, ignoring None (None when all are None).

    Keys: ``num_samples``, ``duration_s``, ``reliable`` (duration >= 2 s; else util means
    nothing), ``<field>_median`` and ``throttle_reasons_any`` (the OR of the bitmasks seen).
    """
    duration = samples[-1].time_s - samples[0].time_s if samples else 0.0
    out: dict = {"num_samples": len(samples), "duration_s": duration, "reliable": duration >= MIN_RELIABLE_S}
    for name in VALUE_FIELDS:
        values = [v for v in (getattr(s, name) for s in samples) if v is not None]
        if name == "throttle_reasons":
            out["throttle_reasons_any"] = functools.reduce(operator.or_, values) if values else None
        else:
            out[f"{name}_median"] = statistics.median(values) if values else None
    return out
