"""The batch-cap sweep: one workload per cap, goodput against raw throughput (no timing assertions)."""

import pytest
from helpers import random_prompts

from minieng.lab.goodput import batch_cap_sweep, format_sweep
from minieng.measure.metrics import SLO
from minieng.measure.workloads import poisson_workload


def _workload(n=10):
    specs = poisson_workload(n, rate_per_s=200.0, prompt_tokens=12, output_tokens=5, seed=0)
    return specs, random_prompts([s.prompt_tokens for s in specs], 300, seed=1)


def test_every_point_replays_the_whole_workload(tiny_engine):
    specs, prompts = _workload()
    caps = [(1, 16), (4, 16), (8, 64)]
    result = batch_cap_sweep(tiny_engine(), specs, caps, SLO(ttft_ms=60_000), prompts=prompts)
    assert [(p["max_num_seqs"], p["max_num_batched_tokens"]) for p in result["points"]] == caps
    for p in result["points"]:
        assert p["completed"] == p["num_requests"] == 10
        assert p["num_good_requests"] == 10, "a lax SLO is met by every completed request"
        assert p["goodput_req_s"] == pytest.approx(p["request_throughput_req_s"])
        assert p["ttft_p50_ms"] <= p["ttft_p99_ms"] and p["tpot_p50_ms"] <= p["tpot_p99_ms"]
    tok_s = [p["output_throughput_tok_s"] for p in result["points"]]
    assert result["best_throughput"] == tok_s.index(max(tok_s))
    text = "\n".join(format_sweep(result))
    assert "most throughput" in text and "most goodput" in text


def test_an_impossible_slo_leaves_no_goodput(tiny_engine):
    specs, prompts = _workload(4)
    result = batch_cap_sweep(tiny_engine(), specs, [(2, 16)], SLO(tpot_ms=1e-6), prompts=prompts)
    point = result["points"][0]
    assert point["completed"] == 4 and point["num_good_requests"] == 0 and point["goodput_req_s"] == 0


def test_the_sweep_leaves_the_given_engine_alone(tiny_engine):
    specs, prompts = _workload(3)
    engine = tiny_engine(max_num_seqs=5)
    batch_cap_sweep(engine, specs, [(1, 8)], SLO(ttft_ms=1e6), prompts=prompts)
    assert engine.config.max_num_seqs == 5 and not engine.has_unfinished_requests() and engine.step_records == []


@pytest.mark.parametrize("caps", [[], [(0, 16)], [(4, 0)]])
def test_bad_caps_are_refused(tiny_engine, caps):
    with pytest.raises(ValueError):
        batch_cap_sweep(tiny_engine(), *_workload(2)[:1], caps, SLO(ttft_ms=1), prompts=_workload(2)[1])


def test_format_sweep_names_a_tail_over_too_few_requests_the_max(tiny_engine):
    """10 requests a point: no P99 (it needs 100), so the table shows each point's max and says so."""
    specs, prompts = _workload()
    result = batch_cap_sweep(tiny_engine(), specs, [(1, 16), (4, 16)], SLO(ttft_ms=60_000), prompts=prompts)
    for p in result["points"]:
        assert p["ttft_ms"]["count"] == 10 and p["ttft_ms"]["max"] >= p["ttft_p99_ms"]
    lines = format_sweep(result)
    assert "max TTFT ms" in lines[1] and "P99" not in lines[1]
    assert lines[-1] == "  (max: too few requests a point for a P99: TTFT max of 10, TPOT max of 10)"
    row = lines[2].split()
    assert float(row[3]) == pytest.approx(result["points"][0]["ttft_ms"]["max"], abs=0.5)
