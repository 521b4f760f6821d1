"""The timing harness: warm-up discarded, every run kept, percentiles as numpy computes them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minieng._version import __version__
from minieng.measure import harness
from minieng.measure.harness import Measurement, fingerprint, measure


def test_measure_calls_fn_warmup_plus_repeats_times():
    calls = []
    m = measure(lambda: calls.append(1), "cpu", warmup=3, repeats=5)
    assert len(calls) == 8
    assert m.runs == 5 and m.unit == "s"
    assert all(v >= 0 for v in m.values)


def test_measure_times_each_call_and_discards_the_warmup(monkeypatch):
    """A fake clock that each call of fn advances by a known amount: the warm-up's durations
    (100, 200) must be dropped and the timed ones recorded in order, one per call."""
    clock = [0.0]
    durations = iter([100.0, 200.0, 1.0, 2.0, 4.0])

    def fn():
        clock[0] += next(durations)

    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])
    m = measure(fn, "cpu", warmup=2, repeats=3)
    assert m.values == [1.0, 2.0, 4.0]
    assert m.median == 2.0


VALUES = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0]


def test_summary_statistics_match_numpy():
    m = Measurement(list(VALUES))
    assert m.median == pytest.approx(np.median(VALUES)) == pytest.approx(3.5)
    assert m.p10 == pytest.approx(np.percentile(VALUES, 10))
    assert m.p90 == pytest.approx(np.percentile(VALUES, 90))
    assert m.p10 == pytest.approx(1.0) and m.p90 == pytest.approx(6.3)  # linear interpolation
    assert m.runs == len(VALUES)


def test_rate_converts_times_to_work_per_second():
    fp = {"device": "cpu"}
    times = Measurement([0.5, 2.0, 0.25], "s", fp)
    rates = times.rate(10.0, "FLOP/s")
    assert rates.values == pytest.approx([20.0, 5.0, 40.0])
    assert rates.unit == "FLOP/s"
    assert rates.fingerprint == fp
    assert rates.median == pytest.approx(20.0)
    # The fastest run is the highest rate: p90 of rates corresponds to the short times.
    assert rates.p90 > rates.median > rates.p10


def test_max_and_spread():
    m = Measurement(list(VALUES))
    assert m.max == 9.0
    assert m.spread == pytest.approx((6.3 - 1.0) / 3.5)  # (p90 - p10) / median
    assert Measurement([2.0, 2.0, 2.0]).spread == 0.0


def test_pooled_keeps_every_run_and_the_first_fingerprint():
    a, b = Measurement([1.0, 2.0], "B/s", {"copy_bytes": 4}), Measurement([5.0], "B/s", {"copy_bytes": 4, "x": 1})
    pooled = Measurement.pooled([a, b])
    assert pooled.values == [1.0, 2.0, 5.0] and pooled.unit == "B/s" and pooled.fingerprint == {"copy_bytes": 4}
    assert pooled.max == 5.0
    with pytest.raises(AssertionError):
        Measurement.pooled([a, Measurement([1.0], "s")])


def test_rate_refuses_a_non_time_measurement():
    with pytest.raises(AssertionError):
        Measurement([1.0], "FLOP/s").rate(1.0, "x")


def test_to_dict_and_str():
    m = Measurement([1.0, 2.0, 3.0], "B/s")
    d = m.to_dict()
    assert set(d) == {"median", "p10", "p90", "max", "spread", "runs", "unit"}
    assert d["median"] == 2.0 and d["runs"] == 3 and d["unit"] == "B/s" and d["max"] == 3.0
    assert "3 runs" in str(m) and "B/s" in str(m)


def test_fingerprint_on_cpu():
    fp = fingerprint("cpu", torch.float32)
    assert {"device", "torch_version", "minieng_version", "torch_threads", "dtype", "platform", "device_name"} <= set(
        fp
    )
    assert fp["device"] == "cpu"
    assert fp["dtype"] == "float32"
    assert fp["torch_version"] == torch.__version__
    assert fp["minieng_version"] == __version__
    assert fp["torch_threads"] == torch.get_num_threads()
    assert "cuda_version" not in fp and "sm_clock_mhz" not in fp
    assert fingerprint("cpu")["dtype"] is None


def test_measurement_carries_the_fingerprint():
    m = measure(lambda: None, "cpu", warmup=0, repeats=1)
    assert m.fingerprint["device"] == "cpu"
    assert m.fingerprint["torch_threads"] == torch.get_num_threads()


def test_source_digest_changes_with_any_source_file_and_only_then(tmp_path):
    """A stored result keyed by ``environment`` is not reused once the engine's code changed."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "notes.txt").write_text("not source")
    first = harness.source_digest(tmp_path)
    assert len(first) == 16 and harness.source_digest(tmp_path) == first
    (tmp_path / "notes.txt").write_text("changed, still not source")
    assert harness.source_digest(tmp_path) == first
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert harness.source_digest(tmp_path) != first
    assert harness.environment("cpu")["minieng_source"] == harness.source_digest()
