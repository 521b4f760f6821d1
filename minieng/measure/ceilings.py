"""This machine's ceilings, measured once per machine and environment, and how noisy it is now.

Every notebook and the bench set their timings against two ceilings: the best matmul and the
best copy (``peaks.measure_ceilings``). Measured afresh in each notebook, they followed
whatever else ran on the machine: one course run on a shared 2-core machine measured the same
copy at 24.1, 16.2 and 52.8 GB/s in three notebooks, and a matmul ceiling measured low made a
prefill read 149.5% MFU. So:

- ``machine_ceilings`` measures them once, in rounds (the best run is the ceiling, the runs'
  spread is kept), and stores them on disk under a key of everything the result depends on:
  ``harness.environment`` (device name, dtype, torch and minieng, threads, driver, platform,
  host) and the smoke switch. Another environment is measured afresh. The folder is
  ``MINIENG_RESULTS_DIR`` when it is set (a course run, the tests), else
  ``$MINIENG_CACHE_DIR/ceilings`` (default ``~/.cache/minieng/ceilings``), which the notebooks
  and ``python -m minieng bench`` share.
- Every call also times a short repeat of the same two kernels now (``read_noise``). How far the
  repeat falls below the stored runs, and how far apart its runs lie, is the machine's timing
  noise at this moment (``Noise.relative``), reported with the load average; ``claims.verdict``
  turns a verdict that this noise could flip into "too noisy to judge here". A repeat that beats
  the stored best raises it: the stored one was measured while something else ran.

Call it before building an engine: on a GPU the ceilings' buffers are sized from the free memory
(``peaks.ceiling_sizes``), and an engine's KV pool takes most of it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from minieng.device import select_device, select_dtype
from minieng.measure import harness  # harness.environment, read at call time (tests patch it)
from minieng.measure.harness import Measurement, smoke_mode
from minieng.measure.peaks import Peak, ceiling_sizes, measure_ceilings, measure_copy, measure_matmul

# Rounds x runs of a first measurement (smoke mode: one round of 3), and runs of the repeat that
# reads the noise at every call. On a 2-core x86 CPU a round costs about a second.
ROUNDS, REPEATS, SMOKE_ROUNDS, SMOKE_REPEATS = 3, 5, 1, 3
NOISE_REPEATS, SMOKE_NOISE_REPEATS = 5, 3
# Noise.level's words: under 10% a machine is "quiet", under 25% "noisy", beyond that "busy".
QUIET, NOISY = 0.10, 0.25


def load_average() -> tuple[float | None, int | None]:
    """(1-minute load average, CPUs): how many processes wanted a CPU, on average over the last
    minute, and how many CPUs there are; None where the OS does not say (Windows)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return load, os.cpu_count()


def others_running(samples: int = 10, interval_s: float = 0.02) -> float | None:
    """How many threads of other processes are running or waiting for a CPU now: the mean over
    ``samples`` readings of Linux's runnable count (``/proc/loadavg``) less this process's own
    running threads (``/proc/self/task``). Unlike the load average it does not lag. None off Linux."""
    counts = []
    try:
        for i in range(samples):
            if i:
                time.sleep(interval_s)
            with open("/proc/loadavg") as f:
                runnable = int(f.read().split()[3].split("/")[0])
            mine = 0
            for task in Path("/proc/self/task").iterdir():
                try:
                    mine += (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
                except (OSError, IndexError):
                    pass  # a thread that ended while being read
            counts.append(max(0, runnable - mine))
    except (OSError, ValueError, IndexError):
        return None
    return sum(counts) / len(counts)


def cpu_contention(others: float | None, threads: int, cpus: int | None) -> float | None:
    """The share of its CPU time a process of ``threads`` busy threads loses when ``others`` other
    threads want the same ``cpus`` (the OS shares the CPUs evenly): 1 - cpus / (threads + others),
    at least 0. None when either count is unknown."""
    if others is None or not cpus:
        return None
    return max(0.0, 1 - cpus / max(cpus, threads + others))


@dataclass
class Noise:
    """How noisy timings on this machine are now, read from a short repeat of the ceilings' kernels.

    ``*_shortfall``: 1 - the repeat's median rate / the stored runs' median (at least 0; None
    when the repeat could not run at the stored size: a GPU with less memory free than when the
    ceilings were measured). The median, not the best: a machine whose runs always scatter (a
    shared VM's memory bandwidth) is as noisy as their spread says, not as its luckiest run.
    ``*_spread``: the repeat's (p90 - p10) / median. ``others_running``: other processes'
    threads wanting a CPU just before the repeat (``others_running()``); ``contention``: what
    they cost this process's busy threads (``cpu_contention``: torch's threads on a CPU, the one
    host thread that launches the kernels on a GPU).

    ``relative``: the largest of every shortfall, half of every spread and the contention, the
    fraction by which one timing here may sit away from what a quiet machine gives (None:
    nothing could be timed). The contention counts because runs stored while the same others ran
    are as slow as the repeat, which then shows no shortfall. ``load_average`` over ``cpus``: the
    1-minute load average, reported, not counted: it lags, so it still counts work that ended in
    the last minute (a previous notebook's, in a course run).
    """

    matmul_shortfall: float | None
    copy_shortfall: float | None
    matmul_spread: float | None
    copy_spread: float | None
    runs: int
    load_average: float | None
    cpus: int | None
    others_running: float | None = None
    contention: float | None = None

    @property
    def relative(self) -> float | None:
        figures = [f for f in (self.matmul_shortfall, self.copy_shortfall) if f is not None]
        figures += [s / 2 for s in (self.matmul_spread, self.copy_spread) if s is not None]
        if not figures:
            return None
        return max(0.0, *figures, *([self.contention] if self.contention is not None else []))

    @property
    def level(self) -> str:
        """ "quiet" (under 10%), "noisy" (under 25%), "busy", or "unknown"."""
        r = self.relative
        return "unknown" if r is None else "quiet" if r < QUIET else "noisy" if r < NOISY else "busy"

    def to_dict(self) -> dict:
        return {
            "relative": self.relative,
            "level": self.level,
            "matmul_shortfall": self.matmul_shortfall,
            "copy_shortfall": self.copy_shortfall,
            "matmul_spread": self.matmul_spread,
            "copy_spread": self.copy_spread,
            "runs": self.runs,
            "load_average": self.load_average,
            "cpus": self.cpus,
            "others_running": self.others_running,
            "contention": self.contention,
        }

    def lines(self) -> list[str]:
        pct = lambda f: "N/A" if f is None else f"{100 * f:.0f}%"  # noqa: E731
        at = lambda s: "N/A" if s is None else f"{100 * (1 - s):.0f}%"  # noqa: E731
        smaller = (
            " (N/A: run smaller, with less GPU memory free than when the ceilings were measured)"
            if None in (self.matmul_shortfall, self.copy_shortfall)
            else ""
        )
        load = (
            "load average N/A"
            if self.load_average is None
            else f"load average {self.load_average:.2f} over {self.cpus} CPUs (last minute)"
        )
        if self.others_running is not None:
            load += f"; other processes' threads running now: {self.others_running:.1f}" + (
                f", taking about {pct(self.contention)} of this process's CPU time" if self.contention else ""
            )
        if self.relative is None:
            return [
                f"noise now: not read (no room to time the kernels); {load}",
                "=> verdicts are given as measured, without a noise check",
            ]
        return [
            f"noise now: {self.runs} more runs of each, their median at {at(self.matmul_shortfall)} of the stored "
            f"matmul's median and {at(self.copy_shortfall)} of the copy's, their spread {pct(self.matmul_spread)} and "
            f"{pct(self.copy_spread)}{smaller}",
            f"  {load}",
            f"=> a timing here may be off by about {pct(self.relative)} ({self.level}): a verdict that this could "
            'flip reads "too noisy to judge here"',
        ]


@dataclass
class Ceilings:
    """This machine's measured ceilings: every run of the matmul and of the copy, when and where
    they were measured, and (``machine_ceilings``) the noise read at this call."""

    device: str
    dtype: str
    matmul: Measurement
    copy: Measurement
    measured_at: str
    path: Path | None = None
    from_cache: bool = False
    noise: Noise | None = None

    @property
    def peak(self) -> Peak:
        """The measured ``Peak``: the best matmul run's FLOP/s and the best copy run's bytes/s."""
        return Peak(
            f"measured {torch.device(self.device).type} {self.dtype}",
            self.matmul.max / 1e12,
            self.copy.max / 1e9,
            "measured",
        )

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "measured_at": self.measured_at,
            "path": str(self.path) if self.path else None,
            "from_cache": self.from_cache,
            "matmul_flop_s": self.matmul.to_dict(),
            "copy_bytes_s": self.copy.to_dict(),
            "noise": self.noise.to_dict() if self.noise else None,
        }

    def lines(self) -> list[str]:
        mm, cp = self.matmul, self.copy
        where = (
            f"read from {self.path}; delete it to measure again"
            if self.from_cache
            else f"stored in {self.path}"
            if self.path
            else "not stored"
        )
        out = [
            f"ceilings, measured {self.measured_at} ({where}):",
            f"  matmul {mm.max / 1e12:8.3f} TFLOP/s, the best of {mm.runs} runs (median {mm.median / 1e12:.3f}, "
            f"spread {100 * mm.spread:.0f}%; {mm.fingerprint.get('matmul_n', '?')}-cube, {self.dtype})",
            f"  copy   {cp.max / 1e9:8.1f} GB/s, the best of {cp.runs} runs (median {cp.median / 1e9:.1f}, "
            f"spread {100 * cp.spread:.0f}%; {cp.fingerprint.get('copy_bytes', 0) / 1024**2:.0f} MiB read and written)",
        ]
        return out + (self.noise.lines() if self.noise else [])


def ceilings_dir() -> Path:
    """Where the ceilings are kept: ``MINIENG_RESULTS_DIR`` when set, else
    ``$MINIENG_CACHE_DIR/ceilings`` (default ``~/.cache/minieng/ceilings``). Read at call time."""
    if os.environ.get("MINIENG_RESULTS_DIR"):
        return Path(os.environ["MINIENG_RESULTS_DIR"])
    return Path(os.environ.get("MINIENG_CACHE_DIR", Path.home() / ".cache" / "minieng")) / "ceilings"


def _key(device: torch.device, dtype: torch.dtype, method: str) -> tuple[str, dict]:
    where = harness.environment(device, dtype) | {"smoke": smoke_mode(), "method": method}
    return hashlib.sha256(json.dumps(where, sort_keys=True, default=str).encode()).hexdigest()[:16], where


def _stored(m: Measurement) -> dict:
    return {"values": m.values, "unit": m.unit, "fingerprint": m.fingerprint}


def _write(path: Path, ceilings: Ceilings, environment: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "environment": environment,
                "measured_at": ceilings.measured_at,
                "device": ceilings.device,
                "dtype": ceilings.dtype,
                "matmul": _stored(ceilings.matmul),
                "copy": _stored(ceilings.copy),
            },
            default=str,
        )
    )
    tmp.replace(path)


def _read(path: Path) -> Ceilings:
    d = json.loads(path.read_text())
    return Ceilings(
        d["device"],
        d["dtype"],
        Measurement(**d["matmul"]),
        Measurement(**d["copy"]),
        d["measured_at"],
        path,
        from_cache=True,
    )


def read_noise(
    ceilings: Ceilings, repeats: int = NOISE_REPEATS
) -> tuple[Noise, Measurement | None, Measurement | None]:
    """Time ``repeats`` runs of the ceilings' matmul and copy now, at their stored sizes (on a GPU
    with less memory free, at the largest that fits, and then without a shortfall), and compare
    them with the stored runs. Returns the ``Noise`` and the two new measurements (None where
    nothing could be timed)."""
    device, dtype = torch.device(ceilings.device), getattr(torch, ceilings.dtype)
    load, cpus = load_average()
    others = others_running()
    # A CPU run keeps torch's threads busy; a GPU run one host thread, which launches the kernels.
    contention = cpu_contention(others, torch.get_num_threads() if device.type == "cpu" else 1, cpus)
    n, nbytes = ceilings.matmul.fingerprint.get("matmul_n"), ceilings.copy.fingerprint.get("copy_bytes")
    if device.type == "cuda":
        try:
            fit_n, fit_bytes = ceiling_sizes(device, dtype)
        except RuntimeError:
            return Noise(None, None, None, None, 0, load, cpus, others), None, None
        n, nbytes = (n if n and n <= fit_n else fit_n), (nbytes if nbytes and nbytes <= fit_bytes else fit_bytes)
    mm = measure_matmul(device, dtype, n=n, repeats=repeats)
    cp = measure_copy(device, nbytes=nbytes, repeats=repeats)
    if device.type == "cuda":
        torch.cuda.empty_cache()

    def shortfall(now: Measurement, stored: Measurement, size_key: str) -> float | None:
        if now.fingerprint.get(size_key) != stored.fingerprint.get(size_key):
            return None  # another size: not comparable with the stored runs
        return max(0.0, 1 - now.median / stored.median)

    return (
        Noise(
            shortfall(mm, ceilings.matmul, "matmul_n"),
            shortfall(cp, ceilings.copy, "copy_bytes"),
            mm.spread,
            cp.spread,
            repeats,
            load,
            cpus,
            others,
            contention,
        ),
        mm,
        cp,
    )


def machine_ceilings(
    device: torch.device | str = "auto",
    dtype: torch.dtype | str = "auto",
    directory: Path | None = None,
    refresh: bool = False,
    noise: bool = True,
    measure: Callable | None = None,
) -> Ceilings:
    """This machine's ceilings for ``device`` and ``dtype`` (``"auto"``: as an engine picks them),
    from the cache when this environment's are stored there, else measured (``peaks.measure_ceilings``,
    3 rounds of 5 runs; smoke mode 1 of 3) and stored. With ``noise``, the noise read now
    (``read_noise``) rides on the result, and a repeat that beat the stored best raises it.

    Args:
        directory: the cache folder (default ``ceilings_dir()``); ``refresh``: measure even when stored.
        measure: ``measure(device, dtype, repeats=...)`` returning ``(Peak, matmul, copy)``, as
            ``peaks.measure_ceilings`` does (the default); another one is stored under a key of its own.
    Raises:
        RuntimeError: on a GPU with too little memory free for the ceilings (``peaks.ceiling_sizes``).
    """
    device = select_device(device) if isinstance(device, str) else device
    dtype = select_dtype(dtype, device) if isinstance(dtype, str) else dtype
    smoke = smoke_mode()
    if measure is None:
        rounds = SMOKE_ROUNDS if smoke else ROUNDS

        def measure(d, dt, repeats):
            return measure_ceilings(d, dt, repeats=repeats, rounds=rounds)

        method = "measure_ceilings"
    else:
        method = getattr(measure, "__qualname__", type(measure).__name__)
    key, environment = _key(device, dtype, method)
    path = Path(directory or ceilings_dir()) / f"ceilings-{key}.json"
    ceilings = None
    if path.is_file() and not refresh:
        try:
            ceilings = _read(path)
        except (ValueError, KeyError, TypeError):  # a file cut short or of another format: measure again
            ceilings = None
    if ceilings is None:
        _, mm, cp = measure(device, dtype, repeats=SMOKE_REPEATS if smoke else REPEATS)
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        ceilings = Ceilings(str(device), str(dtype).removeprefix("torch."), mm, cp, when, path)
        _write(path, ceilings, environment)
    if noise:
        ceilings.noise, mm, cp = read_noise(ceilings, SMOKE_NOISE_REPEATS if smoke else NOISE_REPEATS)
        raised = False
        for name, now in (("matmul", mm), ("copy", cp)):
            best = getattr(ceilings, name)
            size = "matmul_n" if name == "matmul" else "copy_bytes"
            if now is not None and now.fingerprint.get(size) == best.fingerprint.get(size) and now.max > best.max:
                setattr(ceilings, name, Measurement.pooled([best, now]))
                raised = True
        if raised:
            _write(path, ceilings, environment)
    return ceilings
