"""An honest timing harness: warm up, synchronize, repeat, report the median with its spread.

Every measurement in minieng goes through ``measure``: the first calls (allocation, kernel
selection, caches) are discarded, the GPU is synchronized before each clock read, and the
result keeps every run so a reader sees the spread (p10-p90) and the run count, not one number.
``fingerprint`` records what the numbers depend on (device, driver, versions, dtype, threads,
and on a GPU its SM clock, temperature and throttling at that moment).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from minieng._version import __version__
from minieng.device import cpu_name, synchronize
from minieng.measure.nvml import read_clocks


@dataclass
class Measurement:
    """Repeated runs of one quantity. ``values`` in ``unit``; ``median``/``p10``/``p90`` summarise them."""

    values: list[float]
    unit: str = "s"
    fingerprint: dict = field(default_factory=dict)

    @property
    def median(self) -> float:
        return float(np.median(self.values))

    @property
    def p10(self) -> float:
        return float(np.percentile(self.values, 10))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.values, 90))

    @property
    def max(self) -> float:
        return float(np.max(self.values))

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how far apart the runs lie, relative to a typical one (0: identical)."""
        return (self.p90 - self.p10) / self.median if self.median else 0.0

    @property
    def runs(self) -> int:
        return len(self.values)

    def rate(self, work: float, unit: str) -> "Measurement":
        """Turn times (s) into rates: ``work`` units per second for each run."""
        assert self.unit == "s", "rate() converts a time measurement"
        return Measurement([work / v for v in self.values], unit, self.fingerprint)

    def to_dict(self) -> dict:
        return {
            "median": self.median,
            "p10": self.p10,
            "p90": self.p90,
            "max": self.max,
            "spread": self.spread,
            "runs": self.runs,
            "unit": self.unit,
        }

    @classmethod
    def pooled(cls, parts: list["Measurement"]) -> "Measurement":
        """One measurement of every run of ``parts`` (same unit), with the first part's fingerprint."""
        assert parts and len({m.unit for m in parts}) == 1, "pool measurements of one quantity"
        return cls([v for m in parts for v in m.values], parts[0].unit, parts[0].fingerprint)

    def __str__(self) -> str:
        return f"{self.median:.4g} {self.unit} (p10-p90 {self.p10:.4g}-{self.p90:.4g}, {self.runs} runs)"


def measure(
    fn: Callable[[], object], device: torch.device | str = "cpu", warmup: int = 2, repeats: int = 7
) -> Measurement:
    """Time ``fn()``: ``warmup`` discarded calls, then ``repeats`` timed ones, synchronized on CUDA."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return Measurement(times, "s", fingerprint(device))


def fingerprint(device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> dict:
    """What a measurement depends on: device, driver, versions, dtype, threads, GPU clocks now."""
    device = torch.device(device)
    fp = {
        "device": device.type,
        "torch_version": torch.__version__,
        "minieng_version": __version__,
        "torch_threads": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch.") if dtype else None,
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        fp["device_name"] = torch.cuda.get_device_name(device)
        fp["cuda_version"] = torch.version.cuda
        fp.update(read_clocks(device))  # driver, SM clock, temperature, throttling; N/A as None
    else:
        fp["device_name"] = cpu_name()
    return fp


# Fields of ``fingerprint`` that change from one moment to the next on the same machine.
MOMENTARY_FIELDS = ("sm_clock_mhz", "temperature_c", "throttle_reasons")


def environment(device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> dict:
    """``fingerprint`` less its momentary fields (clocks, temperature) plus the host's name: what
    must match for a stored result to stand for a new measurement here."""
    fp = fingerprint(device, dtype)
    for field_name in MOMENTARY_FIELDS:
        fp.pop(field_name, None)
    return fp | {"host": platform.node(), "minieng_source": _own_source_digest()}


@functools.cache
def _own_source_digest() -> str:
    """minieng's own digest, read once per process (``environment`` is called by every cached cell)."""
    return source_digest()


def source_digest(package_dir: Path | None = None) -> str:
    """16 hex digits of SHA-256 over the package's Python sources (names and contents, in name
    order): an engine changed since a result was stored does not stand for a new measurement,
    even at the same version number. ``package_dir`` defaults to minieng's own folder."""
    package_dir = Path(package_dir or Path(__file__).resolve().parents[1])  # minieng/, above measure/
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


SMOKE_ENV = "MINIENG_SMOKE"


def smoke_mode() -> bool:
    """True when ``MINIENG_SMOKE`` is set (CI): every experiment shrinks to seconds."""
    return os.environ.get(SMOKE_ENV, "").lower() not in ("", "0", "false", "no")
