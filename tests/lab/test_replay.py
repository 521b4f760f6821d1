"""Real-time replay of a workload on a tiny random-model engine, and the serving report.

Prompts are token ids (the tiny model has no tokenizer). No assertion depends on how fast the
machine is: arrivals are checked as orderings of recorded timestamps, not as durations.
"""

from __future__ import annotations

import json

import pytest
from helpers import make_engine, random_prompts

from minieng import SamplingParams
from minieng.lab.replay import WorkloadResult, run_workload, serving_report
from minieng.measure.metrics import SLO
from minieng.measure.peaks import Peak
from minieng.measure.workloads import RequestSpec

VOCAB = 300  # the tiny Llama's
PEAKS = [Peak("made-up datasheet", 1.0, 10.0, "datasheet"), Peak("made-up ceiling", 0.5, 5.0, "measured")]

# Out of arrival order on purpose: outputs must still follow the order of the specs.
SPECS = [RequestSpec(0.12, 9, 3), RequestSpec(0.0, 5, 4), RequestSpec(0.05, 7, 2), RequestSpec(0.0, 6, 5)]


@pytest.fixture(scope="module")
def run(tiny_llama):
    """One replay of SPECS, shared by the tests that only read its result."""
    engine = make_engine(tiny_llama[1])
    # Earlier work on the same engine: its steps must not leak into the run's result.
    engine.generate([[1, 2, 3, 4, 5]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    steps_before = len(engine.step_records)
    prompts = random_prompts([s.prompt_tokens for s in SPECS], VOCAB, seed=11)
    result = run_workload(engine, SPECS, prompts=prompts)
    return engine, prompts, steps_before, result


def test_every_request_completes_in_spec_order(run):
    engine, prompts, _, result = run
    assert isinstance(result, WorkloadResult)
    assert len(result.outputs) == len(SPECS)
    for spec, prompt, out in zip(SPECS, prompts, result.outputs):
        assert out.prompt_token_ids == prompt
        assert len(out.token_ids) == spec.output_tokens
        assert out.finished and out.finish_reason == "length"
    assert not engine.has_unfinished_requests()
    assert result.duration_s > 0


def test_arrivals_are_respected(run):
    _, _, _, result = run
    for spec, out in zip(SPECS, result.outputs):
        t = out.times
        assert t.arrival_s == result.start_s + spec.arrival_s
        assert t.first_scheduled_s is not None and t.first_scheduled_s >= t.arrival_s
        assert t.emissions[0][0] >= t.arrival_s
        assert [n for _, n in t.emissions] == [1] * spec.output_tokens
    # The request arriving at 0.12 s was added then, so nothing of it ran before that time.
    late = result.outputs[0]
    assert late.times.first_scheduled_s >= result.start_s + 0.12


def test_steps_recorded_for_this_run_only(run):
    engine, _, steps_before, result = run
    assert result.steps == engine.step_records[steps_before:]
    assert all(s.start_s >= result.start_s for s in result.steps)
    # Distinct random prompts: every prompt token is prefilled exactly once in this run.
    assert sum(s.num_prefill_tokens for s in result.steps) == sum(s.prompt_tokens for s in SPECS)
    assert result.telemetry == []


def test_params_override(tiny_engine):
    specs = [RequestSpec(0.0, 4, 6), RequestSpec(0.0, 4, 6)]
    prompts = random_prompts([4, 4], VOCAB, seed=2)
    result = run_workload(
        tiny_engine(),
        specs,
        prompts=prompts,
        params=lambda s: SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
    )
    assert [len(o.token_ids) for o in result.outputs] == [2, 2]


def test_timeout_aborts_unfinished_requests(tiny_engine):
    """A request needing 200 steps cannot finish within 10 ms: it is aborted and reported so."""
    engine = tiny_engine()
    result = run_workload(
        engine, [RequestSpec(0.0, 6, 200)], prompts=random_prompts([6], VOCAB, seed=3), timeout_s=0.01
    )
    (out,) = result.outputs
    assert out.finished and out.finish_reason == "abort"
    assert len(out.token_ids) < 200
    assert not engine.has_unfinished_requests()
    metrics = serving_report(result, engine.model_config, 4, PEAKS)["metrics"]
    assert metrics["aborted"] == 1 and metrics["completed"] == 0


def test_timeout_bounds_the_wait_for_a_late_arrival(tiny_engine):
    """timeout_s must end the run even while it waits for the next arrival.

    The first request finishes in milliseconds; the second arrives at 2 s. With timeout_s=0.2 the
    run should end near 0.2 s; a run that sleeps until the 2 s arrival ignores the timeout. (The
    bound is loose: only a 1.8 s stall of the machine could make a correct run fail it.)
    """
    specs = [RequestSpec(0.0, 4, 2), RequestSpec(2.0, 4, 2)]
    result = run_workload(tiny_engine(), specs, prompts=random_prompts([4, 4], VOCAB, seed=4), timeout_s=0.2)
    assert result.duration_s < 2.0, f"run lasted {result.duration_s:.2f} s despite timeout_s=0.2"


# -- the report -----------------------------------------------------------------------------------


def test_serving_report_with_slo_and_utilization(run):
    engine, _, _, result = run
    report = serving_report(result, engine.model_config, 4, PEAKS, SLO(ttft_ms=1e6, tpot_ms=1e6))
    json.dumps(report)  # JSON-serializable as it is
    m = report["metrics"]
    assert m["num_requests"] == m["completed"] == len(SPECS)
    assert m["total_output_tokens"] == sum(s.output_tokens for s in SPECS)
    assert m["duration_s"] == result.duration_s
    assert m["num_good_requests"] == len(SPECS)
    assert m["goodput_req_s"] == pytest.approx(len(SPECS) / result.duration_s)
    assert m["slo"] == {"ttft_ms": 1e6, "tpot_ms": 1e6, "e2el_ms": None}
    prefill, decode = report["steps_with_prefill"], report["decode_only_steps"]
    assert prefill is not None and decode is not None
    assert prefill["num_steps"] + decode["num_steps"] == len(result.steps)
    assert prefill["num_steps"] == sum(s.num_prefill_tokens > 0 for s in result.steps)
    for phase in (prefill, decode):
        assert phase["flops"] > 0 and phase["bytes"] > 0 and phase["seconds"] > 0
        assert phase["achieved_tflops"] == pytest.approx(phase["flops"] / phase["seconds"] / 1e12)
        for peak in PEAKS:
            u = phase[peak.source]
            assert u["mfu_percent"] == pytest.approx(100 * phase["achieved_tflops"] / peak.peak_tflops)
            assert u["mbu_percent"] == pytest.approx(100 * phase["achieved_gbps"] / peak.bandwidth_gbps)
            assert isinstance(u["suspect"], bool)
    assert report["telemetry"] is None


def test_serving_report_without_slo_and_with_an_impossible_one(run):
    engine, _, _, result = run
    m = serving_report(result, engine.model_config, 4, PEAKS)["metrics"]
    assert m["slo"] is None and m["goodput_req_s"] is None and m["num_good_requests"] is None
    m = serving_report(result, engine.model_config, 4, PEAKS, SLO(ttft_ms=1e-9))["metrics"]
    assert m["num_good_requests"] == 0 and m["goodput_req_s"] == 0.0
