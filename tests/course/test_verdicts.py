"""Verdicts that the machine's noise could flip say so (``claims.verdict``), on synthetic figures; and
issue 39's calibration and issue 41's edges, a case on each side of each verdict's terms (named by claim id)."""

from __future__ import annotations

import pytest

from minieng.course import verdicts as v
from minieng.course.claims import TOO_NOISY, noise_note, verdict, verdict_kind
from minieng.course.kit import claims_table
from minieng.measure.ceilings import Noise
from minieng.measure.metrics import summarize_ms, tail_text


def ratio_above(threshold):
    return lambda fast, slow: "holds" if fast / slow > threshold else "does not hold here"


def test_a_clear_effect_keeps_its_verdict():
    assert verdict(ratio_above(5), 0.05, fast=120.0, slow=4.0) == "holds"
    assert verdict(ratio_above(5), 0.05, fast=10.0, slow=4.0) == "does not hold here"


def test_an_effect_within_the_noise_is_too_noisy_to_judge():
    said = verdict(ratio_above(1), 0.05, fast=1.06, slow=1.0)  # 6% faster, each timing +-5%
    assert said.startswith(TOO_NOISY) and "at face value: holds" in said and "5%" in said
    # The same effect on a quiet machine is judged.
    assert verdict(ratio_above(1), 0.01, fast=1.06, slow=1.0) == "holds"


def test_the_issue_s6_flip_reads_too_noisy_on_a_busy_machine_and_holds_on_a_quiet_one():
    """Issue 19: S6's 'almost linear' read 'does not hold' on a busy machine where a quiet run
    said it holds. Batch-4 tok/s at 68% of linear against a 70% threshold, under 30% noise."""

    def s6(b1, b4):
        return "holds up to batch 4" if b4 >= 0.7 * 4 * b1 else "does not hold here: below 70% of linear"

    assert verdict(s6, 0.30, b1=25.0, b4=68.0).startswith(TOO_NOISY)
    assert verdict(s6, 0.02, b1=25.0, b4=90.0) == "holds up to batch 4"


def test_a_noise_object_none_or_zero():
    judge = ratio_above(1)
    busy = Noise(0.4, 0.4, 0.1, 0.1, 5, 2.0, 2)
    assert verdict(judge, busy, fast=1.2, slow=1.0).startswith(TOO_NOISY)
    assert verdict(judge, None, fast=1.01, slow=1.0) == "holds"  # noise not read: as judged
    assert verdict(judge, 0.0, fast=1.01, slow=1.0) == "holds"
    unread = Noise(None, None, None, None, 0, None, None)
    assert verdict(judge, unread, fast=1.01, slow=1.0) == "holds"


def test_numbers_in_the_wording_do_not_count_as_a_flip():
    def linear_to(rates):
        b = max(i + 1 for i, r in enumerate(rates) if r >= 0.7 * (i + 1) * rates[0])
        return f"holds up to batch {b}" if b >= 2 else "does not hold here"

    # Batch 3 sits at the edge (72% of linear): the batch number moves, the conclusion does not.
    assert verdict(linear_to, 0.03, rates=[10.0, 19.0, 21.6]) == "holds up to batch 3"
    assert verdict(linear_to, 0.03, rates=[10.0, 14.2]).startswith(TOO_NOISY)


def test_every_corner_is_tried_so_a_ratio_gets_both_timings_noise():
    # 8% faster: 5% noise on one figure alone would not flip it; on both timings it can.
    judge = ratio_above(1)
    assert verdict(lambda fast: judge(fast, 1.0), 0.05, fast=1.08) == "holds"
    assert verdict(judge, 0.05, fast=1.08, slow=1.0).startswith(TOO_NOISY)


def test_too_many_figures_is_a_value_error():
    with pytest.raises(ValueError, match="at most"):
        verdict(lambda rates: "holds", 0.1, rates=[1.0] * 13)


def test_the_claims_table_says_what_noise_its_verdicts_were_checked_against():
    rows = [("S1: prefill tok/s >> decode tok/s", "136x", "12x", "holds")]
    table = claims_table(rows, noise=Noise(0.31, 0.1, 0.1, 0.1, 5, 1.0, 2))
    assert "Timing noise read at the start: about 31% (busy)" in table.data and TOO_NOISY in table.data
    bundle = table._repr_mimebundle_()
    assert list(bundle.values())[0]["rows"] == [list(rows[0])]  # the JSON rows are unchanged
    assert "noise" not in claims_table(rows).data.lower()
    assert "not read" in noise_note(None)


# -- issue 39 section 4 and issue 41 section 1: each verdict's terms, a case on each side --------------


QUIET = 0.02


def test_S11_above_the_range_holds_as_above_the_range():
    said = v.s11_prefill_mfu(75.0, 90.0, noise=QUIET)
    assert said.startswith("holds (above the range)") and "75%" in said
    # 59% and 61% are both "holds": the noise flips nothing at the top of the range, only at its bottom
    assert v.s11_prefill_mfu(61.0, 80.0, noise=0.1).startswith("holds (above the range)")
    assert v.s11_prefill_mfu(58.0, 80.0, noise=0.1) == "holds: 58% of the datasheet"
    said = v.s11_prefill_mfu(35.0, 80.0, noise=QUIET)
    assert said.startswith(v.FAILS) and "below the article's 40-60%" in said
    said = v.s11_prefill_mfu(41.0, 80.0, noise=0.1)
    assert said.startswith("too noisy") and "at face value: holds: 41%" in said


def test_S10_judges_the_p99_from_a_hundred_requests_a_point():
    caps, tok_s, good = [1, 8, 64], [10.0, 40.0, 55.0], [0.3, 0.9, 0.2]
    said = v.s10_goodput_cap(tok_s, good, caps=caps, noise=QUIET, p99_s=[2.0, 3.5, 9.0], requests=200)
    assert said.startswith(v.HOLDS) and "P99 E2EL 9.00 s against 3.50 s" in said
    # the most-tok/s cap had no worse tail than the goodput cap's: the P99 term fails
    said = v.s10_goodput_cap(tok_s, good, caps=caps, noise=QUIET, p99_s=[2.0, 3.5, 3.0], requests=[150, 200, 120])
    assert said.startswith(v.FAILS) and "the tail did not pay" in said
    # notebook 10's 24 requests a point: the P99 term is not judged, and the verdict says so
    said = v.s10_goodput_cap(tok_s, good, caps=caps, noise=QUIET, p99_s=[2.0, 3.5, 3.0], requests=24)
    assert said.startswith(v.HOLDS) and "P99 not judged: 24 requests a point, a P99 needs 100" in said
    said = v.s10_goodput_cap(tok_s, good, caps=caps, noise=QUIET, p99_s=[2.0, 3.5, 3.0])
    assert "P99 not judged: the requests a point not given" in said
    assert v.s10_goodput_cap(tok_s, good, caps=caps, noise=QUIET) == (
        "holds: the most tok/s at cap 64, the most goodput at cap 8"  # the old call, unchanged
    )
    # issue 41: a cap with zero goodput among others is still judged
    assert v.s10_goodput_cap(tok_s, [0.0, 0.9, 0.4], caps=caps, noise=QUIET).startswith(v.HOLDS)
    assert v.s10_goodput_cap(tok_s, [0.0, 0.3, 0.9], caps=caps, noise=QUIET).startswith(v.FAILS)
    said = v.s10_goodput_cap(tok_s, good, caps=caps, noise=0.1, p99_s=[2.0, 3.5, 3.6], requests=200)
    assert said.startswith("too noisy")
    with pytest.raises(ValueError, match="four caps"):
        v.s10_goodput_cap([1.0] * 5, [1.0] * 5, caps=list(range(5)), noise=None, p99_s=[1.0] * 5, requests=100)


def test_S5_the_best_point_has_uncached_tokens_too():
    """Issue 41: 100 / 80 / 1,000 uncached tokens, TTFT 0.12 / 0.10 / 1.0 s lie on one line."""
    counts = dict(uncached_near=100, uncached_high=80, uncached_cold=1000)
    said = v.s5_hit_rate(0.12, 0.10, 1.0, **counts, noise=QUIET)
    assert said.startswith(v.HOLDS) and "1.2x the best hit's" in said
    assert v.s5_hit_rate(0.30, 0.10, 1.0, **counts, noise=QUIET).startswith(v.FAILS)  # 2.5x above the line
    assert v.s5_hit_rate(0.05, 0.10, 1.0, **counts, noise=QUIET).startswith(v.FAILS)  # below the best hit
    assert v.s5_hit_rate(0.12, 0.10, 0.11, **counts, noise=QUIET).startswith(v.FAILS)  # the cache saved 10%
    assert v.s5_hit_rate(0.12, 0.10, 0.125, **counts, noise=None).startswith(v.HOLDS)  # saved 1.25x: enough


def test_S14_only_one_phase_grows():
    """Issue 41: TTFT x1.5 for a 4x prompt while decode follows the answer: does not hold."""
    said = v.s14_slopes(0.1, 0.15, 0.1, 1.0, 1.02, 3.9, noise=QUIET)
    assert said.startswith(v.FAILS) and "TTFT x1.5" in said
    # each phase grows with its own length, but decode grows as much with the prompt: not its own length
    assert v.s14_slopes(0.1, 0.38, 0.1, 1.0, 3.0, 3.9, noise=QUIET).startswith(v.FAILS)
    # the answer grew TTFT 2.5x beside decode's 3.9x: under 2x apart
    assert v.s14_slopes(0.1, 0.38, 0.25, 1.0, 1.05, 3.9, noise=QUIET).startswith(v.FAILS)
    assert v.s14_slopes(0.1, 0.38, 0.11, 1.0, 1.05, 3.9, noise=QUIET).startswith(v.HOLDS)


def test_S16_a_curve_that_peaks_then_falls_is_judged_on_its_best_batch():
    said = v.s16_prefill_batch([100.0, 300.0, 200.0, 110.0], batch_sizes=[1, 2, 4, 8], noise=QUIET)
    assert said.startswith(v.FAILS) and "2 prompts at once moved 3.00x" in said
    said = v.s16_prefill_batch([500.0, 540.0, 480.0, 300.0], batch_sizes=[1, 2, 4, 8], noise=QUIET)
    assert said.startswith(v.HOLDS) and "1.08x" in said


def test_the_percentile_rule_has_no_exception():
    """Notebook 01's ITL line: a P99 from under 100 gaps is printed as the max it is."""
    gaps = [0.010] * 63 + [0.030]
    assert tail_text(summarize_ms(gaps)) == "max of 64 30.0 ms"
    assert tail_text(summarize_ms([0.010] * 100)) == "P99 10.0 ms"
    assert tail_text([0.5, 0.7], unit="s", digits=2) == "max of 2 0.70 s"
    assert tail_text(summarize_ms([])) == "no samples"


def test_verdict_kinds_name_the_explained_and_computed_verdicts():
    said = v.s1_logged_ratio([4.0, 132.0], load_ratios=[4.0, 132.0])
    assert verdict_kind(said) == "explained"
    assert verdict_kind(v.s18_idler([65, 312, 989], [3.0, 2.0, 1.2])) == "computed"
    assert verdict_kind(v.s4_tensor_parallel(1.4, devices=1, noise=None)) == "not testable here"
    assert verdict_kind("holds (above the range): 75%") == "holds"
    assert verdict_kind("too noisy to judge here: ... (at face value: holds)") == "too noisy to judge here"
    assert verdict_kind("suspect: int8 ...") == "suspect"
    assert verdict_kind("a bound, computed") == "other"


def test_S15_either_misreading_makes_the_one_number_mislead():
    # TTFT a sliver of one step over a 2-token answer: latency / tokens reads TPOT 48% low
    said = v.s15_total_latency(0.001, 0.03, mean_output_tokens=2, noise=QUIET)
    assert said.startswith(v.HOLDS) and "48% off" in said
    assert v.s15_total_latency(0.5, 0.03, mean_output_tokens=64, noise=QUIET).startswith(v.HOLDS)  # TTFT 17x
    assert v.s15_total_latency(0.031, 0.03, mean_output_tokens=64, noise=QUIET).startswith(v.FAILS)
