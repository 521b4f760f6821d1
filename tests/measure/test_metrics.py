"""metrics: figures from synthetic timestamps, every expectation worked out by hand (DESIGN.md section 4)."""

import json
from dataclasses import asdict

import numpy as np
import pytest

from minieng.core.sequence import RequestTimes
from minieng.measure.metrics import (
    SLO,
    RequestMetrics,
    acceptance_metrics,
    common_tail,
    labeled_percentile,
    percentile_label,
    request_metrics,
    run_duration_s,
    serving_metrics,
    summarize_ms,
)

approx = pytest.approx
req = RequestMetrics.from_emissions


# -- one request ----------------------------------------------------------------------------------


def test_request_of_four_single_token_emissions():
    m = req(
        10.0,
        [(11.0, 1), (11.2, 1), (11.5, 1), (12.0, 1)],
        prompt_tokens=8,
        finish_reason="length",
        first_scheduled_s=10.5,
        num_preemptions=2,
    )
    assert m.ttft_s == approx(1.0)
    assert m.e2el_s == approx(2.0)
    assert m.tpot_s == approx(1.0 / 3)  # (2.0 - 1.0) / (4 - 1)
    assert m.itl_s == approx([0.2, 0.3, 0.5])
    assert m.queue_s == approx(0.5)
    assert (m.prompt_tokens, m.output_tokens, m.ok, m.num_preemptions) == (8, 4, True, 2)


def test_request_with_zero_output_tokens_has_no_ttft():
    m = req(3.0, [], prompt_tokens=5, finish_reason="abort")
    assert (m.ttft_s, m.e2el_s, m.tpot_s, m.itl_s, m.queue_s) == (None, None, None, [], None)
    assert m.output_tokens == 0 and not m.ok


def test_request_with_one_output_token_has_ttft_but_no_tpot():
    m = req(0.0, [(0.4, 1)], prompt_tokens=3)
    assert m.ttft_s == approx(0.4) and m.e2el_s == approx(0.4)
    assert m.tpot_s is None and m.itl_s == [] and m.ok


def test_multi_token_emissions_make_tpot_smaller_than_itl():
    # speculative decoding: 1 token from prefill, then steps emitting 3, 3 and 2 tokens, 0.1 s apart
    m = req(0.0, [(1.0, 1), (1.1, 3), (1.2, 3), (1.3, 2)], prompt_tokens=4)
    assert m.output_tokens == 9
    assert m.tpot_s == approx(0.3 / 8)  # 37.5 ms per token after the first
    assert m.itl_s == approx([0.1, 0.1, 0.1])  # one gap per emission, not per token
    assert m.tpot_s < min(m.itl_s)


def test_one_emission_of_several_tokens_has_zero_tpot_and_no_itl():
    m = req(0.0, [(0.5, 3)], prompt_tokens=2)
    assert m.tpot_s == 0.0 and m.itl_s == [] and m.output_tokens == 3


@pytest.mark.parametrize("emissions", [[(1.0, 1), (0.9, 1)], [(1.0, 0)], [(-0.1, 1)]])
def test_bad_emissions_are_rejected(emissions):
    with pytest.raises(ValueError):
        req(0.0, emissions, prompt_tokens=1)


def test_request_metrics_reads_a_request_output():
    from minieng.core.outputs import RequestOutput

    times = RequestTimes(
        arrival_s=1.0, first_scheduled_s=1.25, emissions=[(2.0, 1), (2.5, 2)], finished_s=2.5, num_preemptions=1
    )
    out = RequestOutput("r0", [7, 8, 9], [1, 2, 3], [2, 3], "", "", True, "stop", times)
    m = request_metrics(out)
    assert (m.ttft_s, m.e2el_s, m.queue_s) == (approx(1.0), approx(1.5), approx(0.25))
    assert m.tpot_s == approx(0.25)  # (1.5 - 1.0) / (3 - 1)
    assert (m.prompt_tokens, m.output_tokens, m.num_preemptions, m.arrival_s) == (3, 3, 1, 1.0)
    bad = RequestOutput("r1", [7], [1], [1], "", "", True, "stop", times)  # 1 token, emissions say 3
    with pytest.raises(AssertionError, match="r1"):
        request_metrics(bad)


# -- summaries ------------------------------------------------------------------------------------


def test_summary_percentiles_are_linear_interpolation():
    values_s = [0.4, 0.1, 1.0, 0.3, 0.2]  # sorted ms: 100 200 300 400 1000
    s = summarize_ms(values_s)
    # rank = p/100 * (n - 1): p90 -> 3.6 -> 400 + 0.6 * 600 = 760
    assert s == approx(
        {"mean": 400.0, "p50": 300.0, "p90": 760.0, "p95": 880.0, "p99": 976.0, "max": 1000.0, "count": 5}
    )
    for p in (50, 90, 95, 99):
        assert s[f"p{p}"] == approx(np.percentile(np.array(values_s) * 1e3, p))


def test_empty_summary_is_none_not_a_crash():
    s = summarize_ms([])
    assert s["count"] == 0
    assert all(s[k] is None for k in ("mean", "p50", "p90", "p95", "p99", "max"))


# -- a run ----------------------------------------------------------------------------------------


def _run():
    """Six requests; the run spans arrival 0.0 to the last emission at 3.0."""
    return [
        req(0.0, [(1.0, 1), (1.5, 1), (2.0, 1)], 10, "stop", first_scheduled_s=0.0),  # TTFT 1, TPOT .5, E2EL 2
        req(0.5, [(1.5, 1)], 4, "length", first_scheduled_s=1.0),  # TTFT 1, no TPOT, E2EL 1
        req(1.0, [(2.0, 1), (3.0, 1)], 6, "stop", first_scheduled_s=1.5),  # TTFT 1, TPOT 1, E2EL 2
        req(1.0, [(2.5, 1)], 5, "abort"),  # aborted after one token
        req(2.0, [], 7, "abort"),  # aborted before its first token
        req(0.2, [(1.0, 1)], 9, None),  # still unfinished when measured: failed
    ]


def test_serving_metrics_counts_tokens_and_throughput():
    s = serving_metrics(_run())
    assert s.duration_s == approx(3.0)
    assert (s.num_requests, s.completed, s.aborted, s.failed) == (6, 3, 2, 1)
    assert (s.total_prompt_tokens, s.total_output_tokens) == (20, 6)  # completed requests only
    assert s.request_throughput_req_s == approx(1.0)
    assert s.output_throughput_tok_s == approx(2.0)
    assert s.prefill_throughput_tok_s == approx(20 / 3)


def test_serving_metrics_summaries_pool_completed_requests():
    s = serving_metrics(_run())
    assert s.ttft_ms["count"] == 3 and s.ttft_ms["max"] == approx(1000.0)  # the abort's 1500 ms is left out
    assert s.tpot_ms["count"] == 2 and s.tpot_ms["mean"] == approx(750.0)  # 500 and 1000 ms
    assert s.num_excluded_from_tpot == 1
    assert s.itl_ms["count"] == 3 and s.itl_ms["mean"] == approx(2000 / 3)  # 500, 500, 1000 ms
    assert s.e2el_ms["mean"] == approx(5000 / 3) and s.e2el_ms["p50"] == approx(2000.0)
    assert s.queue_ms["mean"] == approx(1000 / 3)  # 0, 500, 500 ms
    assert s.slo is None and s.goodput_req_s is None


def test_given_duration_overrides_the_measured_one():
    s = serving_metrics(_run(), duration_s=6.0)
    assert s.output_throughput_tok_s == approx(1.0) and s.request_throughput_req_s == approx(0.5)


@pytest.mark.parametrize(
    "slo, good",
    [
        (SLO(ttft_ms=1000), 3),  # all three TTFTs are exactly 1000 ms: bounds are inclusive
        (SLO(ttft_ms=999), 0),
        (SLO(ttft_ms=2000), 3),  # the abort (1500 ms) and the unfinished one (800 ms) still miss
        (SLO(tpot_ms=600), 2),  # 500 ms meets, the 1-token request meets vacuously, 1000 ms misses
        (SLO(e2el_ms=1500), 1),  # only the 1-token request (1000 ms)
        (SLO(tpot_ms=600, e2el_ms=1500), 1),
        (SLO(ttft_ms=1000, tpot_ms=600, e2el_ms=2000), 2),
    ],
)
def test_goodput_under_each_slo(slo, good):
    s = serving_metrics(_run(), slo=slo)
    assert s.num_good_requests == good
    assert s.goodput_req_s == approx(good / 3.0)
    assert s.slo == asdict(slo)


def test_an_aborted_request_misses_every_slo_however_fast():
    """Asked directly: an abort whose figures meet every bound still misses (failed or aborted
    requests miss, DESIGN.md section 4), and so does one aborted before its first token."""
    slo = SLO(ttft_ms=1000, tpot_ms=1000, e2el_ms=1000)
    fast = req(0.0, [(0.01, 1), (0.02, 1), (0.03, 1)], prompt_tokens=4, finish_reason="abort")
    assert fast.ttft_s * 1e3 <= 1000 and fast.tpot_s * 1e3 <= 1000 and fast.e2el_s * 1e3 <= 1000
    assert not fast.ok and not slo.met_by(fast)
    completed = req(0.0, [(0.01, 1), (0.02, 1), (0.03, 1)], prompt_tokens=4, finish_reason="length")
    assert slo.met_by(completed), "the same figures, completed, meet it"
    for one in (SLO(ttft_ms=1000), SLO(tpot_ms=1000), SLO(e2el_ms=1000)):
        assert not one.met_by(fast)
        assert not one.met_by(req(0.0, [], prompt_tokens=4, finish_reason="abort"))


@pytest.mark.parametrize("kwargs", [{}, {"ttft_ms": 0}, {"tpot_ms": -5.0}])
def test_bad_slo_is_rejected(kwargs):
    with pytest.raises(ValueError):
        SLO(**kwargs)


def test_single_request_run():
    s = serving_metrics([req(10.0, [(11.0, 1), (11.2, 1), (11.5, 1), (12.0, 1)], 8, "length")])
    assert s.duration_s == approx(2.0) and s.output_throughput_tok_s == approx(2.0)
    assert s.ttft_ms["p99"] == approx(1000.0) and s.tpot_ms["p50"] == approx(1000 / 3)
    assert s.itl_ms["p50"] == approx(300.0) and s.itl_ms["max"] == approx(500.0)
    assert s.num_excluded_from_tpot == 0


def test_empty_and_tokenless_runs_give_none():
    s = serving_metrics([])
    assert s.duration_s is None and s.output_throughput_tok_s is None and s.ttft_ms["mean"] is None
    aborted = [req(0.0, [], 3, "abort")]
    assert run_duration_s(aborted) is None
    s = serving_metrics(aborted, slo=SLO(ttft_ms=100))
    assert (s.completed, s.aborted, s.num_good_requests, s.goodput_req_s) == (0, 1, 0, None)
    assert serving_metrics(_run(), duration_s=0.0).request_throughput_req_s is None


def test_everything_is_json_serializable():
    s = serving_metrics(_run(), slo=SLO(ttft_ms=1000, tpot_ms=600))
    back = json.loads(json.dumps(s.to_dict()))
    assert back["tpot_ms"]["mean"] == approx(750.0) and back["num_good_requests"] == 2
    assert json.loads(json.dumps(asdict(_run()[0])))["itl_s"] == approx([0.5, 0.5])
    assert json.loads(json.dumps(asdict(acceptance_metrics([1, 2], 2))))["num_accepted_tokens"] == 3


# -- speculative decoding acceptance --------------------------------------------------------------


def test_acceptance_on_a_hand_worked_history():
    # k = 3; four drafts accept 3, 0, 2, 1 tokens -> emit 4, 1, 3, 2 tokens (bonus included)
    a = acceptance_metrics([3, 0, 2, 1], 3)
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens) == (4, 12, 6)
    assert a.acceptance_rate == approx(0.5)
    assert a.mean_acceptance_length == approx(2.5)  # (4 + 1 + 3 + 2) / 4
    assert a.acceptance_rate_per_position == approx([3 / 4, 2 / 4, 1 / 4])


def test_mean_acceptance_length_matches_tokens_per_emission():
    m = req(0.0, [(1.0, 1), (1.1, 4), (1.2, 1), (1.3, 3), (1.4, 2)], prompt_tokens=4)  # prefill, then 4 drafts
    emitted = m.output_tokens - 1
    assert acceptance_metrics([3, 0, 2, 1], 3).mean_acceptance_length == approx(emitted / len(m.itl_s))


def test_acceptance_with_varying_proposals():
    # proposals shrink near max_tokens: position i divides by the drafts that proposed it
    a = acceptance_metrics([2, 1, 0], [2, 3, 1])
    assert (a.num_draft_tokens, a.num_accepted_tokens) == (6, 3)
    assert a.acceptance_rate == approx(0.5) and a.mean_acceptance_length == approx(2.0)
    assert a.acceptance_rate_per_position == approx([2 / 3, 1 / 2, 0.0])


def test_acceptance_empty_and_invalid():
    a = acceptance_metrics([], 4)
    assert (a.num_drafts, a.acceptance_rate, a.mean_acceptance_length) == (0, None, None)
    with pytest.raises(ValueError):
        acceptance_metrics([4], 3)  # more accepted than proposed
    with pytest.raises(ValueError):
        acceptance_metrics([-1], 3)
    with pytest.raises(ValueError):
        acceptance_metrics([1, 1], [2])  # one proposal count for two drafts


def test_percentile_label_names_the_max_when_the_sample_is_too_small_for_the_percentile():
    assert percentile_label(99, 4) == "max of 4"
    assert percentile_label(99, 24) == "max of 24"
    assert percentile_label(99, 99) == "max of 99"
    assert percentile_label(99, 100) == "P99"
    assert percentile_label(90, 10) == "P90"  # 10 * 0.1 == 1 despite float rounding
    assert percentile_label(90, 9) == "max of 9"
    assert percentile_label(95, 19) == "max of 19"
    assert percentile_label(95, 20) == "P95"
    assert percentile_label(50, 2) == "P50"
    assert percentile_label(99.9, 1000) == "P99.9"
    assert percentile_label(99, 0) == "max of 0"
    for bad in ((0, 10), (101, 10), (99, -1)):
        with pytest.raises(ValueError):
            percentile_label(*bad)


def test_labeled_percentile_gives_the_max_under_its_name_when_the_percentile_is_unsupported():
    few = [1.0, 2.0, 3.0, 10.0]
    assert labeled_percentile(few, 99) == ("max of 4", 10.0)
    assert labeled_percentile(few, 50) == ("P50", 2.5)
    many = list(range(1, 201))
    label, value = labeled_percentile(many, 99)
    assert label == "P99" and value == approx(np.percentile(many, 99)) and value < 200
    assert labeled_percentile([], 99) == ("max of 0", None)
    stats = summarize_ms([x / 1e3 for x in few])  # seconds in, ms out
    assert labeled_percentile(stats, 99) == ("max of 4", approx(10.0))
    assert labeled_percentile(stats, 50) == ("P50", approx(2.5))
    assert labeled_percentile(summarize_ms([]), 99) == ("max of 0", None)
    with pytest.raises(ValueError):
        labeled_percentile(stats, 75)  # not one of the summary's percentiles


def test_common_tail_falls_back_to_the_max_when_any_row_is_too_small_for_a_p99():
    big, small = summarize_ms([0.001] * 150), summarize_ms([0.001] * 24)
    assert common_tail([big, big]) == ("P99", "p99")
    assert common_tail([big, small]) == ("max of 24", "max")
    assert common_tail([big], 95) == ("P95", "p95")
    with pytest.raises(ValueError):
        common_tail([])
