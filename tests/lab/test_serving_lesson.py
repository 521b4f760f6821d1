"""serving_lesson and notebook 10's closing table: the workload sized from a probe, the lines the
cells print, the worked answers, and the table's rows on an engine and through an API."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minieng.course.closing import serving as closing_10
from minieng.lab.serving_lesson import (
    disaggregation_answer,
    latency_samples,
    lesson_workload,
    objectives_answer,
    run_summary,
    slo_lines,
    two_clocks_answer,
)
from minieng.measure.loadgen import LoadResult
from minieng.measure.metrics import SLO, RequestMetrics, serving_metrics


def estimate_s(prefill_tokens=0, decode_steps=0, prefills=0):
    """A device that prefills 1,000 tok/s and decodes a step in 10 ms, 1 ms a prefill's fixed cost."""
    return prefills * 1e-3 + prefill_tokens / 1000 + decode_steps * 0.01


def test_the_workload_arrives_load_times_as_fast_as_one_request_alone_is_served():
    work = lesson_workload(40, "", 0.25, 2.0, estimate_s, max_prompt_tokens=512, max_output_tokens=64)
    assert len(work.specs) == 40 and len(work.key) == 40 and "quantiles" in work.source
    assert all(s.prompt_tokens <= 512 and 1 <= s.output_tokens <= 64 for s in work.specs)
    mean_alone = sum(work.alone_s) / 40
    assert work.rate_req_s == pytest.approx(2.0 / mean_alone)
    assert work.specs[-1].arrival_s == pytest.approx(40 / work.rate_req_s)  # arrivals stretched to that rate
    assert work.replay_s() == pytest.approx(work.specs[-1].arrival_s + 2 * max(work.alone_s))
    # One request at a time: the requests' times alone, end to end (load 2: twice the arrivals' span).
    assert work.replay_s(1) == pytest.approx(sum(work.alone_s) + 2 * max(work.alone_s))
    assert work.replay_s(8) == pytest.approx(work.replay_s())
    assert "40 requests" in work.line() and "2.0x" in work.line()
    again = lesson_workload(40, "", 0.25, 4.0, estimate_s, max_prompt_tokens=512, max_output_tokens=64)
    assert again.rate_req_s == pytest.approx(2 * work.rate_req_s)  # twice the load: twice the rate


def _run(ttfts_s: list[float], tpot_s: float, n_out: int = 5) -> LoadResult:
    requests = [
        RequestMetrics.from_emissions(i, [(i + t + j * tpot_s, 1) for j in range(n_out)], 10)
        for i, t in enumerate(ttfts_s)
    ]
    return LoadResult(requests, len(ttfts_s) + 1.0)


def test_the_slo_lines_name_the_tail_the_sample_supports_and_goodput_counts_the_good():
    client = _run([0.1] * 9 + [2.0], 0.02)
    slo = SLO(ttft_ms=500, tpot_ms=30)
    m = client.summary(slo)
    assert m.num_good_requests == 9  # the one that waited 2 s missed its TTFT objective
    lines = slo_lines(m, slo)
    assert lines[0] == "SLO: TTFT <= 500 ms, TPOT <= 30 ms"
    assert "max of 10 2000 ms" in lines[2]  # ten requests cannot place a P99
    assert run_summary("here", m).startswith("here: 10 requests, TTFT P50 100 ms")
    samples = latency_samples(client)
    assert samples["TTFT"][-1] == pytest.approx(2000) and samples["TPOT"][0] == pytest.approx(20)


def test_the_worked_answers_carry_the_probes_figures():
    work = lesson_workload(10, "", 0.25, 2.0, estimate_s, max_prompt_tokens=512, max_output_tokens=64)
    assert "about 263 ms" in two_clocks_answer(263.4, 12.0) and "12.0 ms alone" in two_clocks_answer(263.4, 12.0)
    slo = SLO(ttft_ms=1300, tpot_ms=25)
    assert "1300 ms" in objectives_answer(work, slo, 263, 10.0) and "2.0x as fast" in objectives_answer(
        work, slo, 263, 10.0
    )
    prefill_s = sum(estimate_s(prefill_tokens=s.prompt_tokens, prefills=1) for s in work.specs)
    share = round(100 * prefill_s / sum(work.alone_s))
    assert f"split it {share}/{100 - share}" in disaggregation_answer(work, estimate_s, 10.0)


def _rows(table) -> list[list[str]]:
    return next(iter(table._repr_mimebundle_().values()))["rows"]


def _point(seqs, tok_s, goodput, tpot_p99_ms, count):
    tpot = {"p50": tpot_p99_ms / 2, "p99": tpot_p99_ms, "max": tpot_p99_ms, "count": count}
    return {
        "max_num_seqs": seqs,
        "num_requests": count,
        "output_throughput_tok_s": tok_s,
        "goodput_req_s": goodput,
        "tpot_ms": tpot,
    }


def test_through_an_api_the_engine_rows_are_not_testable(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path))
    api = SimpleNamespace(has_steps=False, label="m at http://x/v1", noise=None, why_not=lambda what: f"no {what}")
    client = serving_metrics(_run([0.1] * 5, 0.02).requests, 6.0)
    rows = _rows(closing_10.closing(api, client, None))
    assert [r[0][:4] for r in rows] == ["S9: ", "S10:", "S15:", "(bey"]
    assert rows[0][3] == "not testable here: no disaggregation" and rows[1][3] == "not testable here: no caps"
    assert rows[2][2].startswith("m at http://x/v1 through the API: 5 streamed requests")
    assert rows[3][3] == "not testable here: no two_clocks"


def test_on_the_engine_s10_judges_the_p99_from_100_requests_a_cap(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path))
    engine = SimpleNamespace(has_steps=True, label="m on cpu", noise=None, why_not=lambda what: None)
    client = serving_metrics(_run([0.1] * 5, 0.02).requests, 6.0)
    points = [_point(1, 20.0, 0.5, 30, 100), _point(8, 60.0, 0.9, 60, 100), _point(64, 80.0, 0.4, 200, 100)]
    sweep = {"points": points, "best_throughput": 2, "best_goodput": 1}
    disagg = {
        "runs": [
            {
                "name": "colocated_x2",
                "num_devices": 2,
                "goodput_per_device_req_s": 0.4,
                "metrics": {"itl_ms": {"max": 90}},
            },
            {
                "name": "disaggregated",
                "num_devices": 2,
                "goodput_per_device_req_s": 0.3,
                "metrics": {"itl_ms": {"max": 40}},
            },
        ]
    }
    for d in disagg["runs"]:
        d["metrics"]["itl_ms"] |= {"p99": None, "count": 24}
    rows = _rows(closing_10.closing(engine, client, client, sweep, disagg))
    assert rows[0][3].startswith("does not hold here") and "ITL (max of 24) 40 vs 90 ms" in rows[0][2]
    assert rows[1][3].startswith("holds") and "P99 TPOT 0.20 s against 0.06 s" in rows[1][3]
    assert rows[1][2].startswith("100 requests a cap")
    assert rows[3][3].startswith("holds")  # the same figures on both clocks
    # The most tok/s with the better tail: the P99 term fails the claim.
    points[2]["tpot_ms"] |= {"p99": 40}
    assert _rows(closing_10.closing(engine, client, client, sweep, disagg))[1][3].startswith("does not hold here")
