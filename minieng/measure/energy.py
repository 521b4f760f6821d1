"""The energy of a measured interval: joules, beside the power the device draws doing nothing.

An ``EnergyMeter`` opens the first source that works on the device, reads the device idle for
``idle_s`` (the floor its owner pays for anyway), then measures intervals (``measure(fn)``). Each
``EnergyReading`` carries the joules, the seconds, the idle watts and the source, so a reader sees
what the work added: ``joules_above_idle`` = joules - idle watts x seconds.

Sources, in order:

- ``"nvml-counter"`` (an NVIDIA GPU, Volta and newer: V100, T4, A100, A10, L4, L40S, H100, H200,
  GeForce RTX 20/30/40): NVML's total-energy counter, ``nvmlDeviceGetTotalEnergyConsumption``
  (mJ since the driver loaded, an unsigned 64-bit count), read at both ends of the interval.
- ``"nvml-power"``: where that counter answers NotSupported (Pascal and older: P100, P4, P40,
  K80, M60), the board power ``nvmlDeviceGetPowerUsage`` (mW) sampled by ``nvml.TelemetrySampler``
  and integrated over the interval (``integrate_power_j``). On Ampere and newer GPUs (the A100's
  GA100 excepted) NVML returns that power averaged over 1 s, so the integral lags the work by up
  to a second: measure intervals of several seconds.
- ``"rapl"`` (a CPU): Linux's RAPL counters in the powercap sysfs (``POWERCAP``), ``energy_uj``
  (µJ) of every package zone (``intel-rapl:N``, named ``package-N``: cores, caches, memory
  controller) and of the ``dram`` zones where the platform has them; AMD's Zen CPUs appear under
  the same names. Each counter wraps to 0 after its ``max_energy_range_uj``. RAPL counts the whole
  socket, other processes included: the idle reading is what makes the figure the work's.
- none: ``source`` is None and ``reason`` says why (no NVIDIA driver; no RAPL, as in most VMs;
  ``energy_uj`` readable by root only, as Linux makes it since CVE-2020-8694).

A reading is the device's energy (board or package), not the whole machine's at the wall.
Sources: NVML API reference, Device Queries (docs.nvidia.com/deploy/nvml-api); Linux's power
capping framework (docs.kernel.org/power/powercap/powercap.html).
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from minieng.device import synchronize
from minieng.measure.nvml import TelemetrySampler

POWERCAP = Path("/sys/class/powercap")
NVML_COUNTER_WRAP_MJ = 2**64  # nvmlDeviceGetTotalEnergyConsumption is an unsigned long long of mJ
SOURCES = ("nvml-counter", "nvml-power", "rapl")
DEFAULT_IDLE_S = 2.0  # NVML's power is a 1-s average on recent GPUs: a shorter idle window reads the work before it


def counter_delta(start: int, end: int, wrap: int) -> int:
    """How far a counter that wraps to 0 after ``wrap`` advanced from ``start`` to ``end`` (same
    unit), assuming at most one wrap between the two reads. Raises ``ValueError`` for ``wrap <= 0``."""
    if wrap <= 0:
        raise ValueError(f"wrap={wrap}: a counter's range must be positive")
    return (end - start) % wrap


def integrate_power_j(points: list[tuple[float, float | None]], start_s: float, end_s: float) -> float | None:
    """Joules over ``[start_s, end_s]`` from ``(time_s, watts)`` readings: the power taken as linear
    between readings and constant before the first and after the last (trapezoids). Readings of
    None (N/A) are skipped; None when there is none. Raises ``ValueError`` if ``end_s < start_s``."""
    if end_s < start_s:
        raise ValueError(f"the interval ends ({end_s}) before it starts ({start_s})")
    pts = sorted((t, w) for t, w in points if w is not None)
    if not pts:
        return None
    times = [t for t, _ in pts]

    def watts_at(t: float) -> float:
        i = bisect.bisect_right(times, t)
        if i == 0:
            return pts[0][1]
        if i == len(pts):
            return pts[-1][1]
        (t0, w0), (t1, w1) = pts[i - 1], pts[i]
        return w0 + (w1 - w0) * (t - t0) / (t1 - t0) if t1 > t0 else w1

    edges = [start_s] + [t for t in times if start_s < t < end_s] + [end_s]
    return sum((b - a) * (watts_at(a) + watts_at(b)) / 2 for a, b in zip(edges, edges[1:]))


@dataclass(frozen=True)
class EnergyReading:
    """The energy of one interval on one device.

    Fields: ``joules`` (None: not measured), ``seconds`` (the interval's wall time, measured either
    way), ``idle_watts`` (the device's draw doing nothing, read before; None when not read),
    ``source`` (one of ``SOURCES``, None when nothing could be measured) and ``reason``: why nothing
    was measured (source None), or why the counter was not the source (the power was sampled
    instead); None when the first choice worked.
    """

    joules: float | None
    seconds: float
    idle_watts: float | None
    source: str | None
    reason: str | None = None

    @property
    def measured(self) -> bool:
        return self.joules is not None

    @property
    def mean_watts(self) -> float | None:
        """Joules / seconds (W); None when not measured or the interval is empty."""
        return self.joules / self.seconds if self.joules is not None and self.seconds > 0 else None

    @property
    def idle_joules(self) -> float | None:
        """What the device would have drawn idle over the same seconds (J)."""
        return None if self.idle_watts is None or self.joules is None else self.idle_watts * self.seconds

    @property
    def joules_above_idle(self) -> float | None:
        """What the work added: joules - idle watts x seconds (J). It can read slightly below 0 when
        the work adds less than the idle draw varies."""
        idle = self.idle_joules
        return None if idle is None else self.joules - idle

    def minus(self, other: EnergyReading) -> EnergyReading:
        """This interval less ``other`` (joules and seconds): the energy of the work one run did
        and the other did not, e.g. a run with n tokens less the same run with 2. Raises
        ``ValueError`` when the two readings come from different sources."""
        if other.source != self.source:
            raise ValueError(f"cannot subtract a {other.source} reading from a {self.source} reading")
        joules = None if self.joules is None or other.joules is None else self.joules - other.joules
        return EnergyReading(joules, self.seconds - other.seconds, self.idle_watts, self.source, self.reason)

    def to_dict(self) -> dict:
        """The fields plus ``mean_watts`` and ``joules_above_idle``: JSON-serializable."""
        return asdict(self) | {"mean_watts": self.mean_watts, "joules_above_idle": self.joules_above_idle}

    def describe(self) -> str:
        """One line: what was measured and how, or why nothing was."""
        if not self.measured:
            return f"{self.seconds:.2f} s; energy not measurable on this machine: {self.reason}"
        line = f"{self.joules:.3g} J in {self.seconds:.2f} s ({self.mean_watts or 0:.1f} W"
        if self.idle_watts is not None:
            line += f"; idle {self.idle_watts:.1f} W, {self.joules_above_idle:.3g} J above idle"
        return line + f") from {self.source}" + (f" ({self.reason})" if self.reason else "")


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


@dataclass(frozen=True)
class RaplZone:
    """One RAPL counter: its zone's ``name`` (``package-0``, ``dram``), ``energy_uj``'s path and the
    counter's range (µJ; it wraps to 0 after it)."""

    name: str
    energy_path: Path
    max_energy_range_uj: int


def rapl_zones(powercap: Path = POWERCAP) -> tuple[list[RaplZone], str | None]:
    """The RAPL zones whose sum is the CPU's energy, and why there are none (or None).

    Counted: the package zones (``intel-rapl:N`` named ``package-N``) and every ``dram`` zone.
    Not counted: a package's ``core`` and ``uncore`` subzones (parts of the package already
    counted), ``psys`` (the whole platform, packages included) and ``intel-rapl-mmio`` (a second
    interface to the same package counter)."""
    if not powercap.is_dir():
        return [], f"no RAPL: {powercap} does not exist (a virtual machine usually exposes none)"
    zones = []
    for path in sorted(powercap.glob("intel-rapl:*")):
        if not re.fullmatch(r"intel-rapl(:\d+)+", path.name) or not (path / "energy_uj").exists():
            continue
        try:
            name = (path / "name").read_text().strip()
        except OSError:
            continue
        if name.startswith("package") or name == "dram":
            try:
                wrap = _read_int(path / "max_energy_range_uj")
            except (OSError, ValueError) as e:
                return [], f"no RAPL range: {path / 'max_energy_range_uj'}: {e}"
            zones.append(RaplZone(name, path / "energy_uj", wrap))
    if not zones:
        return [], f"no RAPL: {powercap} has no intel-rapl package zone (a virtual machine usually exposes none)"
    try:
        for z in zones:
            _read_int(z.energy_path)
    except PermissionError:
        return [], (
            f"RAPL exists but {zones[0].energy_path} is readable by root only (Linux restricts it since "
            "CVE-2020-8694): run as root, or have an administrator make energy_uj readable"
        )
    except (OSError, ValueError) as e:
        return [], f"RAPL's {zones[0].energy_path} cannot be read: {e}"
    return zones, None


class _EnergySampler(TelemetrySampler):
    """The telemetry sampler (it opens NVML and finds the device), plus the energy counter."""

    def energy_mj(self) -> int:
        """The counter now (mJ since the driver loaded); raises ``NVMLError`` where unsupported."""
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)

    def energy_mj_or_none(self) -> int | None:
        try:
            return self.energy_mj()
        except self.nvml.NVMLError:
            return None

    def device_name(self) -> str:
        name = self.nvml.nvmlDeviceGetName(self._handle)
        return name.decode() if isinstance(name, bytes) else str(name)


def _sleep(seconds: float) -> None:  # the idle window's wait (tests replace it)
    time.sleep(seconds)


class EnergyMeter:
    """Measures the energy of intervals on one device; use as a context manager.

    Args:
        device: where the work runs: a CUDA device (NVML: the GPU torch uses, matched by UUID; NVML
            device 0 when torch sees no GPU) or ``"cpu"`` (RAPL). Other devices are not measurable.
        idle_s: seconds of idle read by ``start`` (0: none; ``idle_watts`` stays None).
        interval_s: the power sampling period where the power is sampled (NVML's own period is
            1/6-1 s).
        nvml: the NVML module (tests pass a fake); default ``pynvml``.
        powercap: the powercap sysfs root (tests pass a fake folder).
    After ``start``: ``source`` (one of ``SOURCES``, or None), ``reason`` (see ``EnergyReading``),
    ``idle_watts``, ``domains`` (what is counted: the GPU, or the RAPL zones). Nothing raises when
    no source works: every reading then has ``joules`` None and the reason.
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        idle_s: float = DEFAULT_IDLE_S,
        interval_s: float = 0.1,
        nvml=None,
        powercap: Path = POWERCAP,
    ):
        if idle_s < 0:
            raise ValueError(f"idle_s={idle_s} must be >= 0 s")
        self.device, self.idle_s, self.interval_s = torch.device(device), idle_s, interval_s
        self.nvml, self.powercap = nvml, powercap
        self.source: str | None = None
        self.reason: str | None = "not started"
        self.idle_watts: float | None = None
        self.domains: list[str] = []
        self._sampler: _EnergySampler | None = None
        self._zones: list[RaplZone] = []

    def __enter__(self) -> EnergyMeter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> EnergyMeter:
        """Find a source and read the idle power (``idle_s`` of sleep). Whatever interrupts it (an
        NVML error, Ctrl-C in the idle sleep) stops the sampling thread before it propagates."""
        self.source, self.reason = None, None
        try:
            if self.device.type == "cuda":
                self._open_nvml()
            elif self.device.type == "cpu":
                self._zones, self.reason = rapl_zones(self.powercap)
                if self._zones:
                    self.source, self.domains = "rapl", [z.name for z in self._zones]
            else:
                self.reason = f"no energy source for a {self.device.type} device (NVML covers NVIDIA GPUs, RAPL CPUs)"
            if self.source is not None and self.idle_s > 0:
                _, idle = self.measure(_sleep, self.idle_s)
                self.idle_watts = idle.mean_watts
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the power sampling and release NVML (readings taken stay valid)."""
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None

    def _open_nvml(self) -> None:
        device = self.device if torch.cuda.is_available() else None  # None: NVML's first GPU
        sampler = _EnergySampler(device, self.interval_s, self.nvml).start()
        if not sampler.available:
            self.reason = f"NVML: {sampler.unavailable_reason}"
            return
        self._sampler = sampler
        self.domains = [sampler.device_name()]
        try:
            sampler.energy_mj()
            self.source = "nvml-counter"
            return
        except sampler.nvml.NVMLError as e:
            why = (
                f"nvmlDeviceGetTotalEnergyConsumption: {type(e).__name__}: {e} (the counter needs a Volta or newer "
                "GPU): the power is sampled instead"
            )
        self._wait_for_sample(time.perf_counter())
        if "power_w" in sampler.na_reasons:
            self.reason = f"{why}, but nvmlDeviceGetPowerUsage: {sampler.na_reasons['power_w']}"
            self.stop()
            return
        self.source, self.reason = "nvml-power", why

    def _wait_for_sample(self, after_s: float) -> None:
        """Wait (at most a few periods) until the sampler holds a reading taken at or after ``after_s``."""
        deadline = time.perf_counter() + 3 * self.interval_s + 1.0
        samples = self._sampler.samples
        while not (samples and samples[-1].time_s >= after_s) and time.perf_counter() < deadline:
            time.sleep(self.interval_s / 4)

    def _mark(self) -> tuple[float, Any]:
        """(now, the counter's raw value): the GPU's queued work finished first."""
        if self.device.type == "cuda" and torch.cuda.is_available():
            synchronize(self.device)
        now = time.perf_counter()
        if self.source == "nvml-counter":
            return now, self._sampler.energy_mj_or_none()  # None: a failed read, that interval unmeasured
        if self.source == "rapl":
            return now, [_read_int(z.energy_path) for z in self._zones]
        return now, None

    def _joules(self, start: tuple[float, Any], end: tuple[float, Any]) -> float | None:
        (t0, raw0), (t1, raw1) = start, end
        if self.source == "nvml-counter":
            return None if raw0 is None or raw1 is None else counter_delta(raw0, raw1, NVML_COUNTER_WRAP_MJ) / 1e3
        if self.source == "rapl":
            return sum(counter_delta(a, b, z.max_energy_range_uj) for a, b, z in zip(raw0, raw1, self._zones)) / 1e6
        self._wait_for_sample(t1)  # a reading after the end, so the integral's right edge is not extrapolated
        return integrate_power_j([(s.time_s, s.power_w) for s in self._sampler.samples], t0, t1)

    def measure(self, fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, EnergyReading]:
        """Run ``fn(*args, **kwargs)``; return its value and the interval's ``EnergyReading`` (its
        seconds always; its joules where a source works)."""
        start = self._mark()
        value = fn(*args, **kwargs)
        end = self._mark()
        joules = self._joules(start, end) if self.source is not None else None
        return value, EnergyReading(joules, end[0] - start[0], self.idle_watts, self.source, self.reason)

    def describe(self) -> str:
        """One line: the source, what it counts and the idle power; or why nothing is measurable."""
        if self.source is None:
            return f"energy: not measurable on this machine: {self.reason}"
        what = {
            "nvml-counter": "NVML's total-energy counter",
            "nvml-power": "NVML's board power, sampled and integrated",
            "rapl": "Linux RAPL counters",
        }[self.source]
        line = f"energy: {what} ({', '.join(self.domains)})"
        if self.idle_watts is not None:
            line += f"; idle {self.idle_watts:.1f} W over {self.idle_s:g} s"
        return line + (f"; {self.reason}" if self.reason else "")


def energy_source(device: torch.device | str = "cpu", nvml=None, powercap: Path = POWERCAP) -> tuple[str | None, str]:
    """(the source an ``EnergyMeter`` would use on ``device``, or None; its one-line description),
    without reading the idle power."""
    with EnergyMeter(device, idle_s=0, nvml=nvml, powercap=powercap) as meter:
        return meter.source, meter.describe()
