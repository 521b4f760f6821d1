"""lab.tensor_parallel: a run survives the notebooks' JSON cache, and its table says what was
measured and what was modelled. (The measurement itself runs end to end in tests/cli's
``test_bench_tensor_parallel_from_the_command_line``.)"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from minieng.lab.tensor_parallel import ModelledStep, SplitStep, TensorParallelRun, format_tensor_parallel
from minieng.measure.tp_estimate import fit_link, tensor_parallel_decode


@pytest.fixture
def run() -> TensorParallelRun:
    sizes, times = [64, 1024, 65536], [4e-4, 4.2e-4, 6e-4]
    link, latency_s = fit_link(sizes, times, 2, "cpu link")
    steps = [SplitStep(1, 1, 0.052, 0.051, 0.0, 0, 5.5e8, 1e6), SplitStep(2, 1, 0.15, 0.145, 0.088, 62, 5.5e8, 1e6)]
    shape = dict(weight_bytes=5.5e8, num_layers=30, hidden_size=576, link=link, latency_s=latency_s, activation_bytes=4)
    modelled = [
        ModelledStep("own memory", 2, 1, tensor_parallel_decode(num_devices=2, bandwidth_gbps=10.8, **shape)),
        ModelledStep("one shared bus", 2, 1, tensor_parallel_decode(num_devices=2, bandwidth_gbps=5.4, **shape)),
    ]
    return TensorParallelRun(steps, sizes, [2 * t for t in times], times, link, latency_s, modelled)


def test_a_run_survives_the_json_cache(run):
    assert TensorParallelRun.from_dict(json.loads(json.dumps(asdict(run)))) == run


def test_the_table_splits_the_step_and_sets_the_model_beside_the_measurement(run):
    text = format_tensor_parallel(run)
    two = run.step(2, 1)
    assert two.compute_s == pytest.approx(0.057)
    assert "  2     1   150.00   145.00    57.00      88.00          62" in text
    assert f"{run.hop_latency_s * 1e6:.1f} us per hop" in text
    assert "     1,024     840.0     420.0" in text  # the median, then the 25th percentile the fit read
    own = run.modelled_step("own memory", 2, 1)
    assert f"modelled {own.step_s * 1e3:7.2f}" in text and "measured  145.00" in text
    # Sharing one bus, the model's read takes the one-rank time: the split buys no bandwidth.
    assert run.modelled_step("one shared bus", 2, 1).read_s == pytest.approx(2 * own.read_s)
