"""The ceilings kept per machine and environment, and the noise read at every call.

Measurements are synthetic (a fake ``measure``) or real on tiny sizes: what is under test is the
cache's key and folder, the best-of bookkeeping, and the noise arithmetic.
"""

from __future__ import annotations

import json

import pytest
import torch

from minieng.measure import ceilings, harness
from minieng.measure.ceilings import Ceilings, Noise, cpu_contention, machine_ceilings, read_noise
from minieng.measure.harness import Measurement

CPU = torch.device("cpu")


def fake_measure(calls: list, flops=(1e11, 2e11, 1.5e11), copies=(10e9, 20e9, 15e9)):
    """A ``measure(device, dtype, repeats)`` that records its calls and returns fixed runs."""

    def measure(device, dtype, repeats=5):
        calls.append((device, dtype, repeats))
        mm = Measurement(list(flops), "FLOP/s", {"matmul_n": 64})
        cp = Measurement(list(copies), "B/s", {"copy_bytes": 1 << 20})
        return None, mm, cp

    return measure


def test_measured_once_then_read_from_the_cache(tmp_path, capsys):
    calls = []
    first = machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, measure=fake_measure(calls))
    second = machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, measure=fake_measure(calls))
    assert len(calls) == 1
    assert not first.from_cache and second.from_cache
    assert second.matmul.values == first.matmul.values and second.copy.values == first.copy.values
    # The ceiling is the best run, not the median.
    assert second.peak.peak_tflops == pytest.approx(0.2) and second.peak.bandwidth_gbps == pytest.approx(20.0)
    assert second.peak.source == "measured" and second.peak.name == "measured cpu float32"
    (path,) = tmp_path.glob("ceilings-*.json")
    stored = json.loads(path.read_text())
    assert stored["environment"]["torch_version"] == torch.__version__
    assert stored["environment"]["torch_threads"] == torch.get_num_threads()
    assert stored["environment"]["dtype"] == "float32" and stored["environment"]["device_name"]
    assert "read from" in "\n".join(second.lines()) and str(path) in "\n".join(second.lines())
    machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, refresh=True, measure=fake_measure(calls))
    assert len(calls) == 2


def test_a_damaged_cache_file_is_measured_again(tmp_path):
    calls = []
    machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, measure=fake_measure(calls))
    (path,) = tmp_path.glob("ceilings-*.json")
    path.write_text(path.read_text()[:40])  # a write cut short
    again = machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, measure=fake_measure(calls))
    assert len(calls) == 2 and not again.from_cache and json.loads(path.read_text())["matmul"]["values"]


@pytest.mark.parametrize(
    "change",
    [
        {"torch_version": "9.9.9"},
        {"torch_threads": 97},
        {"dtype": "bfloat16"},
        {"device_name": "another CPU"},
        {"host": "another-host"},
    ],
)
def test_a_changed_environment_measures_again(tmp_path, monkeypatch, change):
    calls = []
    machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, measure=fake_measure(calls))
    real = harness.environment
    monkeypatch.setattr(harness, "environment", lambda device="cpu", dtype=None: real(device, dtype) | change)
    machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, measure=fake_measure(calls))
    assert len(calls) == 2 and len(list(tmp_path.glob("ceilings-*.json"))) == 2


def test_smoke_and_full_measurements_are_kept_apart(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setenv("MINIENG_SMOKE", "1")
    machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, measure=fake_measure(calls))
    monkeypatch.delenv("MINIENG_SMOKE")
    machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, measure=fake_measure(calls))
    assert len(calls) == 2
    assert [c[2] for c in calls] == [ceilings.SMOKE_REPEATS, ceilings.REPEATS]


def test_the_cache_folder_follows_the_environment_at_call_time(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path / "results"))
    assert ceilings.ceilings_dir() == tmp_path / "results"
    monkeypatch.delenv("MINIENG_RESULTS_DIR")
    monkeypatch.setenv("MINIENG_CACHE_DIR", str(tmp_path / "cache"))
    assert ceilings.ceilings_dir() == tmp_path / "cache" / "ceilings"
    monkeypatch.delenv("MINIENG_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ceilings.ceilings_dir() == tmp_path / "home" / ".cache" / "minieng" / "ceilings"
    calls = []
    machine_ceilings(CPU, torch.float32, noise=False, measure=fake_measure(calls))
    assert list((tmp_path / "home" / ".cache" / "minieng" / "ceilings").glob("ceilings-*.json"))


# -- the noise ---------------------------------------------------------------------------------------


def test_noise_takes_the_largest_of_shortfall_half_spread_and_contention():
    quiet = Noise(0.03, 0.02, 0.04, 0.06, 5, 0.3, 2, 0.0, 0.0)
    assert quiet.relative == pytest.approx(0.03) and quiet.level == "quiet"
    busy = Noise(0.10, 0.69, 0.2, 0.3, 5, 2.5, 2, 1.0, 1 / 3)  # the run: copy at 16.2 of 52.8 GB/s
    assert busy.relative == pytest.approx(0.69) and busy.level == "busy"
    spread = Noise(0.01, 0.0, 0.4, 0.1, 5, None, None)
    assert spread.relative == pytest.approx(0.2) and spread.level == "noisy"
    # A best measured while the same other work ran shows no shortfall: the contention still counts.
    loaded = Noise(0.0, 0.01, 0.02, 0.02, 5, 2.0, 2, 2.0, 0.5)
    assert loaded.relative == pytest.approx(0.5)
    unknown = Noise(None, None, None, None, 0, 1.0, 2)
    assert unknown.relative is None and unknown.level == "unknown"
    assert "not read" in "\n".join(unknown.lines())
    text = "\n".join(busy.lines())
    assert "31%" in text and "load average 2.50 over 2 CPUs" in text and "too noisy to judge here" in text


@pytest.mark.parametrize(
    "others,threads,cpus,expected",
    [(0.0, 2, 2, 0.0), (1.0, 2, 2, 1 / 3), (2.0, 2, 2, 0.5), (1.0, 1, 2, 0.0), (3.0, 4, 16, 0.0), (None, 2, 2, None)],
)
def test_cpu_contention(others, threads, cpus, expected):
    got = cpu_contention(others, threads, cpus)
    assert got == expected if expected is None else got == pytest.approx(expected)


def test_others_running_is_a_count_or_unknown():
    n = ceilings.others_running(samples=3, interval_s=0.0)
    assert n is None or n >= 0


def stored(flops, copies, n=64, nbytes=1 << 20) -> Ceilings:
    return Ceilings(
        "cpu",
        "float32",
        Measurement(flops, "FLOP/s", {"matmul_n": n}),
        Measurement(copies, "B/s", {"copy_bytes": nbytes}),
        "2026-12-01 10:00 UTC",
    )


def test_read_noise_compares_a_repeat_at_the_stored_sizes_with_the_stored_runs(monkeypatch):
    seen = {}

    def matmul(device, dtype, n=None, repeats=5):
        seen["n"] = n
        return Measurement([0.5e11, 0.9e11, 1.0e11], "FLOP/s", {"matmul_n": n})

    def copy(device, nbytes=None, repeats=5):
        seen["nbytes"] = nbytes
        return Measurement([8e9, 10e9, 12e9], "B/s", {"copy_bytes": nbytes})

    monkeypatch.setattr(ceilings, "measure_matmul", matmul)
    monkeypatch.setattr(ceilings, "measure_copy", copy)
    monkeypatch.setattr(ceilings, "others_running", lambda: 0.0)
    noise, mm, cp = read_noise(stored([1e11, 2e11], [10e9, 20e9]), repeats=3)
    assert seen == {"n": 64, "nbytes": 1 << 20}
    assert noise.matmul_shortfall == pytest.approx(1 - 0.9e11 / 1.5e11)  # against the stored runs' median
    assert noise.copy_shortfall == pytest.approx(1 - 10e9 / 15e9)
    assert noise.copy_spread == pytest.approx(cp.spread) and noise.runs == 3
    assert noise.relative == pytest.approx(0.4)
    # A repeat as fast as the stored runs has no shortfall, whatever their best.
    monkeypatch.setattr(
        ceilings,
        "measure_matmul",
        lambda d, dt, n=None, repeats=5: Measurement([1.5e11] * 3, "FLOP/s", {"matmul_n": n}),
    )
    assert read_noise(stored([1e11, 2e11], [10e9, 20e9]), repeats=3)[0].matmul_shortfall == 0.0


def test_read_noise_on_the_cpu_for_real():
    from minieng.measure.peaks import measure_copy, measure_matmul

    best = Ceilings(
        "cpu",
        "float32",
        measure_matmul(CPU, torch.float32, n=64, repeats=3),
        measure_copy(CPU, nbytes=1 << 20, repeats=3),
        "now",
    )
    noise, mm, cp = read_noise(best, repeats=3)
    assert mm.runs == cp.runs == 3 and mm.fingerprint["matmul_n"] == 64
    assert noise.relative is not None and noise.relative >= 0
    assert 0 <= noise.matmul_shortfall < 1 and 0 <= noise.copy_shortfall < 1


def test_a_repeat_that_beats_the_stored_best_raises_it(tmp_path, monkeypatch):
    """A best stored while the machine was busy is corrected by the first quieter call."""
    calls = []
    machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, measure=fake_measure(calls))
    faster = Measurement([3e11, 4e11], "FLOP/s", {"matmul_n": 64})
    same_copy = Measurement([12e9, 14e9], "B/s", {"copy_bytes": 1 << 20})
    monkeypatch.setattr(
        ceilings, "read_noise", lambda c, repeats: (Noise(0.0, 0.1, 0.1, 0.1, repeats, None, None), faster, same_copy)
    )
    raised = machine_ceilings(CPU, torch.float32, directory=tmp_path, measure=fake_measure(calls))
    assert raised.peak.peak_tflops == pytest.approx(0.4) and raised.peak.bandwidth_gbps == pytest.approx(20.0)
    again = machine_ceilings(CPU, torch.float32, directory=tmp_path, noise=False, measure=fake_measure(calls))
    assert again.peak.peak_tflops == pytest.approx(0.4) and again.matmul.runs == 5  # stored with both
    assert len(calls) == 1


def test_machine_ceilings_end_to_end_on_the_cpu(tmp_path, monkeypatch):
    from minieng.measure import peaks

    monkeypatch.setattr(peaks, "ceiling_sizes", lambda device, dtype: (64, 1 << 20))
    c = machine_ceilings("cpu", "auto", directory=tmp_path)
    assert c.dtype == "float32" and c.matmul.fingerprint["matmul_n"] == 64
    assert c.noise is not None and c.noise.relative is not None
    d = c.to_dict()
    assert d["noise"]["level"] in ("quiet", "noisy", "busy") and d["matmul_flop_s"]["max"] == c.matmul.max
    json.dumps(d)
    text = "\n".join(c.lines())
    assert "TFLOP/s, the best of" in text and "noise now" in text
