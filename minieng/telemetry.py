"""NVML telemetry: what the GPU reports about itself while the engine runs.

A ``TelemetrySampler`` thread reads NVML (through nvidia-ml-py, imported lazily as ``pynvml``)
every ``interval_s`` and keeps a list of ``Sample``s stamped with ``time.perf_counter()``, the
clock of the engine's ``StepRecord``s, so ``samples_per_step`` can line them up with steps.

Read util.gpu with care. ``nvmlDeviceGetUtilizationRates(h).gpu`` is the percent of the last
sample period (1/6 s to 1 s by product) during which at least one kernel ran. It is neither SM
occupancy nor efficiency: batch-1 decode, one small kernel after another, can read ~100% while
its MFU is under 1%. The honest counterparts are the GPM metrics of Hopper and newer GPUs
(SM occupancy, DRAM bandwidth utilization, tensor activity), sampled here where the GPU has them.
Because NVML averages over its own period, runs shorter than ~2 s give meaningless util.

N/A is ``None``, never 0: no driver, no GPU, MIG mode (no per-GPU utilization) or a field the GPU
does not support. Nothing here raises for those; ``unavailable_reason`` says why NVML cannot be
used at all, ``TelemetrySampler.na_reasons`` why each N/A field is N/A (recorded once).
NVML numbers devices ignoring CUDA_VISIBLE_DEVICES: the torch device is matched by UUID, else
by PCI bus id. This module plots nothing and knows nothing of the engine beyond
``StepRecord.start_s``/``duration_s``.
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from dataclasses import dataclass, fields

import torch

MIN_RELIABLE_S = 2.0  # NVML averages util over up to 1 s: shorter runs give meaningless util


@dataclass
class Sample:
    """One NVML reading; every value but ``time_s`` may be None (N/A)."""

    time_s: float                        # time.perf_counter() when the reading began
    util_gpu_percent: float | None       # % of NVML's period with >= 1 kernel running
    util_memory_percent: float | None    # % of NVML's period the memory was read or written
    power_w: float | None
    sm_clock_mhz: float | None
    memory_used_bytes: int | None
    temperature_c: float | None
    throttle_reasons: int | None         # bitmask of NVML clock event (throttle) reasons
    sm_occupancy_percent: float | None   # GPM (Hopper+): active warps / max warps
    dram_bw_util_percent: float | None   # GPM: DRAM bandwidth used / peak
    tensor_util_percent: float | None    # GPM: time SMs ran any tensor-core instruction


VALUE_FIELDS = tuple(f.name for f in fields(Sample))[1:]
UTIL_FIELDS = ("util_gpu_percent", "util_memory_percent")
GPM_FIELDS = ("sm_occupancy_percent", "dram_bw_util_percent", "tensor_util_percent")
_GPM_METRICS = ("NVML_GPM_METRIC_SM_OCCUPANCY", "NVML_GPM_METRIC_DRAM_BW_UTIL", "NVML_GPM_METRIC_ANY_TENSOR_UTIL")


def _import_nvml():
    import pynvml  # nvidia-ml-py provides this module
    return pynvml


def _init(nvml) -> str | None:
    """nvmlInit; None on success, else why NVML cannot be used. Pair a None with nvmlShutdown."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound:
        return "no NVIDIA driver: NVML library (libnvidia-ml) not found"
    except nvml.NVMLError_DriverNotLoaded:
        return "NVIDIA driver not loaded"
    except nvml.NVMLError as e:
        return f"nvmlInit failed: {type(e).__name__}: {e}"
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as e:
        count, why = 0, f"nvmlDeviceGetCount failed: {e}"
    else:
        why = "NVML sees no GPU"
    if count == 0:
        nvml.nvmlShutdown()
        return why
    return None


def unavailable_reason(nvml=None) -> str | None:
    """Why NVML telemetry cannot be used here (no module, no driver, no GPU); None if it can."""
    if nvml is None:
        try:
            nvml = _import_nvml()
        except ImportError:
            return "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    why = _init(nvml)
    if why is None:
        nvml.nvmlShutdown()
    return why


def available(nvml=None) -> bool:
    return unavailable_reason(nvml) is None


# -- matching the torch device ---------------------------------------------------------------


@dataclass(frozen=True)
class DeviceId:
    """How to find a GPU in NVML: UUID (no 'GPU-' prefix, lower case) and PCI (domain, bus, device)."""

    uuid: str | None = None
    pci: tuple[int, int, int] | None = None


def _norm_uuid(uuid) -> str:
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    text = text.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def torch_device_id(index: int) -> DeviceId:
    """The UUID and PCI bus id of torch's ``cuda:index`` (after CUDA_VISIBLE_DEVICES)."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    pci = tuple(getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    return DeviceId(_norm_uuid(uuid) if uuid else None, None if None in pci else pci)


def find_nvml_handle(nvml, device: DeviceId):
    """The NVML handle whose UUID matches ``device`` (else whose PCI bus id matches), or None."""
    by_pci = None
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        if device.uuid and _norm_uuid(nvml.nvmlDeviceGetUUID(handle)) == device.uuid:
            return handle
        if device.pci and by_pci is None:
            info = nvml.nvmlDeviceGetPciInfo(handle)
            if (info.domain, info.bus, info.device) == device.pci:
                by_pci = handle
    return by_pci


# -- the sampler -----------------------------------------------------------------------------


class TelemetrySampler:
    """Samples one GPU every ``interval_s`` in a background thread; use as a context manager.

    Args:
        device: torch CUDA index or ``torch.device``, or a ``DeviceId``; None: torch's current
            CUDA device, or NVML device 0 when torch sees no GPU (a CPU-only torch build).
        interval_s: sampling period; 0.1-0.2 s is useful (NVML's own period is 1/6-1 s).
        nvml: the NVML module (tests pass a fake); default ``pynvml``, imported at ``start``.
    Attributes: ``samples``; ``unavailable_reason`` (None while NVML works); ``na_reasons``:
        field -> why it is N/A. GPM fields of the first sample are None (they need two).
    """

    def __init__(self, device: int | torch.device | DeviceId | None = None, interval_s: float = 0.1, nvml=None):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}; use 0.1-0.2 s")
        self.device, self.interval_s, self.nvml = device, interval_s, nvml
        self.samples: list[Sample] = []
        self.na_reasons: dict[str, str] = {}
        self.unavailable_reason: str | None = "not started"
        self._handle = self._gpm = self._thread = None
        self._gpm_primed = False
        self._stop = threading.Event()

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> TelemetrySampler:
        """Open NVML and start sampling; if NVML is unusable, record why and sample nothing."""
        self.unavailable_reason = self._open()
        if self.available:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="minieng-telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        """Stop the thread, release NVML; return the samples."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            for s in self._gpm or ():
                self.nvml.nvmlGpmSampleFree(s)
            self._gpm = None
            self.nvml.nvmlShutdown()
        return self.samples

    def _open(self) -> str | None:
        if self.nvml is None:
            try:
                self.nvml = _import_nvml()
            except ImportError:
                return "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        nvml = self.nvml
        why = _init(nvml)
        if why is not None:
            return why
        try:
            why = self._find_device()
        except nvml.NVMLError as e:
            why = f"could not match the device in NVML: {type(e).__name__}: {e}"
        if why is not None:
            nvml.nvmlShutdown()
        return why

    def _find_device(self) -> str | None:
        nvml, dev = self.nvml, self.device
        if dev is None and torch.cuda.is_available():
            dev = torch.cuda.current_device()
        if dev is None:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(0)
        else:
            if not isinstance(dev, DeviceId):
                index = dev.index if isinstance(dev, torch.device) else int(dev)
                dev = torch_device_id(torch.cuda.current_device() if index is None else index)
            self._handle = find_nvml_handle(nvml, dev)
            if self._handle is None:
                return f"no NVML device matches {dev}"
        self._probe_features()
        return None

    def _probe_features(self) -> None:
        """Mark what this GPU cannot report: utilization under MIG, GPM before Hopper."""
        nvml, h = self.nvml, self._handle
        try:
            mig = nvml.nvmlDeviceGetMigMode(h)[0] == nvml.NVML_DEVICE_MIG_ENABLE
        except nvml.NVMLError:  # NotSupported: a GPU without MIG
            mig = False
        if mig:
            for name in UTIL_FIELDS + GPM_FIELDS:
                self.na_reasons[name] = "MIG mode is enabled: NVML gives no whole-GPU utilization"
            return
        try:
            if nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                self._gpm = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
                return
            why = "GPM metrics need a Hopper or newer GPU (this one does not support them)"
        except nvml.NVMLError as e:
            why = f"GPM: {type(e).__name__}: {e}"
        for name in GPM_FIELDS:
            self.na_reasons[name] = why

    def _run(self) -> None:
        start = time.perf_counter()
        ticks = 0
        while not self._stop.is_set():
            self.samples.append(self.sample())
            ticks += 1  # fixed schedule: slow reads do not make the period drift
            self._stop.wait(max(0.0, start + ticks * self.interval_s - time.perf_counter()))

    def _read(self, read, *names: str):
        """``read()``, or None (N/A) on an NVML error, whose reason is kept for ``names``.

        A field that failed once stays N/A for the rest of the run (no retry every tick).
        """
        if names[0] in self.na_reasons:
            return None
        try:
            return read()
        except self.nvml.NVMLError as e:
            for name in names:
                self.na_reasons.setdefault(name, f"{type(e).__name__}: {e}")
            return None

    def sample(self) -> Sample:
        """One reading now (the thread calls this)."""
        nvml, h, now = self.nvml, self._handle, time.perf_counter()
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
            self._read(lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h), "throttle_reasons"),
            *(self._read_gpm() if self._gpm else (None,) * len(GPM_FIELDS)))

    def _read_gpm(self) -> tuple:
        """GPM metrics between the previous GPM sample and one taken now (None for the first).

        GPM counters are cumulative: a metric is a difference of two samples over their interval.
        """
        nvml, none = self.nvml, (None,) * len(GPM_FIELDS)
        prev, cur = self._gpm
        if self._read(lambda: nvml.nvmlGpmSampleGet(self._handle, cur), *GPM_FIELDS) is None:
            return none
        self._gpm = [cur, prev]  # cur becomes the next call's prev
        primed, self._gpm_primed = self._gpm_primed, True
        if not primed:
            return none
        query = nvml.c_nvmlGpmMetricsGet_t()
        query.version, query.numMetrics = nvml.NVML_GPM_METRICS_GET_VERSION, len(_GPM_METRICS)
        query.sample1, query.sample2 = prev, cur
        for i, name in enumerate(_GPM_METRICS):
            query.metrics[i].metricId = getattr(nvml, name)
        if self._read(lambda: nvml.nvmlGpmMetricsGet(query), *GPM_FIELDS) is None:
            return none
        values = []
        for metric, name in zip(query.metrics, GPM_FIELDS):
            ok = metric.nvmlReturn == nvml.NVML_SUCCESS and name not in self.na_reasons
            if metric.nvmlReturn != nvml.NVML_SUCCESS:
                self.na_reasons.setdefault(name, f"nvmlGpmMetricsGet: error {metric.nvmlReturn} for this metric")
            values.append(float(metric.value) if ok else None)
        return tuple(values)


# -- traces and steps ------------------------------------------------------------------------


def samples_per_step(samples: list[Sample], steps, nearest_within_s: float | None = 0.2) -> list[list[Sample]]:
    """The samples taken during each step (``start_s <= time_s <= start_s + duration_s``).

    A step shorter than the sampling interval (a decode step is ~10 ms) usually holds no sample:
    it then gets the one sample nearest to it, if within ``nearest_within_s`` (None: never).
    A sample's util describes NVML's period *before* it, so treat per-step values as context.
    """
    samples = sorted(samples, key=lambda s: s.time_s)
    times = [s.time_s for s in samples]
    out = []
    for step in steps:
        lo, hi = step.start_s, step.start_s + step.duration_s
        i, j = bisect.bisect_left(times, lo), bisect.bisect_right(times, hi)
        inside = samples[i:j]
        if not inside and samples and nearest_within_s is not None:
            near = [k for k in (i - 1, i) if 0 <= k < len(samples)]
            k = min(near, key=lambda k: max(lo - times[k], times[k] - hi))
            inside = [samples[k]] if max(lo - times[k], times[k] - hi) <= nearest_within_s else []
        out.append(inside)
    return out


def summarize(samples: list[Sample]) -> dict:
    """Medians of every field over a trace, ignoring None (all None: None).

    Keys: ``num_samples``, ``duration_s``, ``reliable`` (duration >= 2 s, else util means
    nothing), ``<field>_median``, and ``throttle_reasons_any`` (OR of the bitmasks seen).
    """
    duration = samples[-1].time_s - samples[0].time_s if samples else 0.0
    out: dict = {"num_samples": len(samples), "duration_s": duration, "reliable": duration >= MIN_RELIABLE_S}
    for name in VALUE_FIELDS:
        values = [getattr(s, name) for s in samples if getattr(s, name) is not None]
        if name == "throttle_reasons":
            out["throttle_reasons_any"] = None if not values else _or(values)
        else:
            out[f"{name}_median"] = statistics.median(values) if values else None
    return out


def _or(values: list[int]) -> int:
    mask = 0
    for v in values:
        mask |= int(v)
    return mask
