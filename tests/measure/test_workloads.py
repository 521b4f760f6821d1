"""Workloads: fixed and Poisson streams, the Azure trace replayed or sampled, scaling, real-text prompts.

The trace is read from ``../shared/data/azure-llm-trace-2023/`` beside the repository (never
copied into it); its tests skip where that folder is absent. The quantiles derived from it, which
the course keeps in ``data/azure-llm-trace-2023/``, are tested anywhere: the workload sampled
from them, and (where the CSVs are present) that they are what the script derives.
"""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from minieng.measure.workloads import (
    TRACE_QUANTILES,
    TRACE_SERVICES,
    RequestSpec,
    fixed_workload,
    poisson_workload,
    read_trace,
    sampled_trace_workload,
    scale_workload,
    stored_trace_quantiles,
    text_prompts,
    trace_quantiles,
    workload_prompts,
)

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO.parent / "shared" / "data" / "azure-llm-trace-2023" / "conv.csv"
needs_trace = pytest.mark.skipif(not TRACE.is_file(), reason=f"{TRACE} not present")


# -- fixed and Poisson ----------------------------------------------------------------------------


def test_fixed_workload():
    specs = fixed_workload(4, 16, 8, interval_s=0.5)
    assert specs == [RequestSpec(0.0, 16, 8), RequestSpec(0.5, 16, 8), RequestSpec(1.0, 16, 8), RequestSpec(1.5, 16, 8)]
    assert all(s.arrival_s == 0 for s in fixed_workload(3, 5, 2))  # interval 0: all at once


def test_poisson_workload_shape():
    specs = poisson_workload(50, rate_per_s=4.0, prompt_tokens=32, output_tokens=7, seed=3)
    assert len(specs) == 50
    assert specs[0].arrival_s == 0.0
    arrivals = [s.arrival_s for s in specs]
    assert all(b >= a for a, b in zip(arrivals, arrivals[1:]))
    assert all(s.prompt_tokens == 32 and s.output_tokens == 7 for s in specs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_poisson_mean_gap_is_one_over_the_rate(seed):
    """Exponential gaps of mean 1/rate: over 3,999 gaps the sample mean has a relative standard
    error of 1/sqrt(3999) = 1.6%, so a 10% tolerance is 6.3 standard errors: a correct generator
    fails this with odds of about 3e-10 per seed (the seeds are fixed, so it is deterministic).
    The gaps' standard deviation (= the mean, for an exponential) has a relative standard error
    of about sqrt(8 / 4000) / 2 = 2.2%: 15% is 6.7 of them, odds below 1e-10."""
    rate, n = 5.0, 4000
    arrivals = np.array([s.arrival_s for s in poisson_workload(n, rate, 8, 8, seed=seed)])
    gaps = np.diff(arrivals)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.10)
    # Exponential, not evenly spaced: the gaps' standard deviation is close to their mean too.
    assert gaps.std() == pytest.approx(1 / rate, rel=0.15)


def test_poisson_is_reproducible_per_seed():
    a = poisson_workload(20, 2.0, 8, 8, seed=7)
    assert a == poisson_workload(20, 2.0, 8, 8, seed=7)
    assert a != poisson_workload(20, 2.0, 8, 8, seed=8)


@pytest.mark.parametrize(
    "call",
    [
        lambda: fixed_workload(0, 16, 8),
        lambda: fixed_workload(3, 0, 8),
        lambda: fixed_workload(3, 16, -1),
        lambda: poisson_workload(3, 0.0, 16, 8),
        lambda: poisson_workload(3, -2.0, 16, 8),
        lambda: poisson_workload(3, float("nan"), 16, 8),
        lambda: poisson_workload(0, 1.0, 16, 8),
        lambda: poisson_workload(3, 1.0, 0, 8),
    ],
)
def test_bad_workload_input_is_a_value_error(call):
    with pytest.raises(ValueError, match="must be > 0"):
        call()


def test_negative_interval_is_a_value_error():
    """A negative interval makes arrivals decrease and fall before the run starts."""
    with pytest.raises(ValueError, match="interval_s"):
        fixed_workload(3, 16, 8, interval_s=-1.0)


# -- the Azure trace ------------------------------------------------------------------------------


def _csv_rows() -> list[list[str]]:
    lines = TRACE.read_text().splitlines()
    assert lines[0].split(",") == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    return [line.split(",") for line in lines[1:] if line]


def _seconds(stamp: str) -> Decimal:
    """Exact seconds of '2023-11-16 18:15:50.9951690' since midnight (all rows share one day)."""
    day, clock = stamp.split(" ")
    assert day == "2023-11-16"
    h, m, s = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + Decimal(s)


@needs_trace
def test_read_whole_trace():
    rows = _csv_rows()
    specs = read_trace(TRACE)
    assert len(specs) == len(rows)
    assert specs[0].arrival_s == 0.0
    assert all(b.arrival_s >= a.arrival_s for a, b in zip(specs, specs[1:]))
    assert all(s.prompt_tokens >= 1 and s.output_tokens >= 1 for s in specs)
    span = float(_seconds(rows[-1][0]) - _seconds(rows[0][0]))
    assert specs[-1].arrival_s == pytest.approx(span, abs=1e-5)


@needs_trace
def test_read_trace_honours_skip_and_num_requests_and_fractional_seconds():
    rows = _csv_rows()
    specs = read_trace(TRACE, num_requests=5, skip=10)
    assert len(specs) == 5
    assert [(s.prompt_tokens, s.output_tokens) for s in specs] == [(int(r[1]), int(r[2])) for r in rows[10:15]]
    assert specs[0].arrival_s == 0.0
    for i in range(1, 5):
        # The 7-digit fractional seconds, subtracted exactly from the CSV text.
        by_hand = float(_seconds(rows[10 + i][0]) - _seconds(rows[10][0]))
        assert specs[i].arrival_s == pytest.approx(by_hand, abs=1e-6)
    gap = float(_seconds(rows[12][0]) - _seconds(rows[11][0]))
    assert 0 < gap < 60 and gap != round(gap)  # sub-second part present, not truncated
    assert specs[2].arrival_s - specs[1].arrival_s == pytest.approx(gap, abs=1e-6)


@needs_trace
def test_read_trace_first_rows_by_hand():
    # conv.csv rows 2 and 3: 18:15:50.9951690 and 18:15:51.2224670, 0.227298 s apart.
    rows = _csv_rows()
    specs = read_trace(TRACE, num_requests=2, skip=1)
    assert (specs[0].prompt_tokens, specs[0].output_tokens) == (int(rows[1][1]), int(rows[1][2]))
    assert specs[1].arrival_s == pytest.approx(float(_seconds(rows[2][0]) - _seconds(rows[1][0])), abs=1e-6)


def test_read_trace_missing_file(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        read_trace(tmp_path / "nope.csv")


def test_read_trace_missing_columns(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,prompt,output\n2023-11-16 18:15:46.6805900,374,44\n")
    with pytest.raises(ValueError, match="ContextTokens"):
        read_trace(path)


def test_read_trace_of_a_small_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 23:59:59.5000000,10,3\n2023-11-17 00:00:01,20,4\n"
    )  # across midnight, no fractional part
    specs = read_trace(path)
    assert specs == [RequestSpec(0.0, 10, 3), RequestSpec(pytest.approx(1.5), 20, 4)]


# -- the trace's quantiles, and the workload sampled from them ------------------------------------


@needs_trace
def test_stored_quantiles_are_what_the_script_derives_from_the_csvs(tmp_path):
    """data/azure-llm-trace-2023/ holds exactly what benchmarks/trace_quantiles.py writes from the CSVs."""
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "trace_quantiles.py"),
            "--source",
            str(TRACE.parent),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for name in ("quantiles.json", "README.md"):
        assert (tmp_path / name).read_text(encoding="utf-8") == (TRACE_QUANTILES.parent / name).read_text(
            encoding="utf-8"
        ), name
    # And the figures are the CSV's: its request count and its median prompt length.
    specs = read_trace(TRACE)
    conv = stored_trace_quantiles("conv")
    assert conv["num_requests"] == len(specs)
    assert conv["prompt_tokens"][conv["probabilities"].index(0.5)] == np.median([s.prompt_tokens for s in specs])


def test_stored_quantiles_carry_the_attribution_and_no_rows():
    doc = json.loads(TRACE_QUANTILES.read_text(encoding="utf-8"))
    assert "CC BY 4.0" in doc["license"] and "Splitwise" in doc["attribution"]
    readme = (TRACE_QUANTILES.parent / "README.md").read_text(encoding="utf-8")
    assert "CC BY 4.0" in readme and "Splitwise" in readme and "AzurePublicDataset" in readme
    assert sorted(p.name for p in TRACE_QUANTILES.parent.iterdir()) == ["README.md", "quantiles.json"]
    probs = doc["probabilities"]
    assert probs[0] == 0.0 and probs[-1] == 1.0 and all(a < b for a, b in zip(probs, probs[1:]))
    for service in TRACE_SERVICES:
        q = stored_trace_quantiles(service)
        for name in ("prompt_tokens", "output_tokens", "interarrival_s"):
            assert len(q[name]) == len(probs)
            assert all(a <= b for a, b in zip(q[name], q[name][1:])), (service, name)  # a quantile function
        assert q["rate_per_s"] == pytest.approx((q["num_requests"] - 1) / q["duration_s"], rel=1e-5)


@pytest.mark.parametrize("service", TRACE_SERVICES)
def test_stored_quantiles_carry_the_trace_rate(service):
    """The mean gap of the distribution the sampler draws from (linear between the stored
    quantiles) is the trace's own mean gap within 1%: the fine grid in the top percentile keeps
    the rare long gaps (minutes, in code.csv) that a grid of percentiles alone would smear."""
    q = stored_trace_quantiles(service)
    p, g = np.array(q["probabilities"]), np.array(q["interarrival_s"])
    mean_gap_s = float(np.sum(np.diff(p) * (g[1:] + g[:-1]) / 2))
    assert mean_gap_s == pytest.approx(1 / q["rate_per_s"], rel=0.01)


@pytest.mark.parametrize("service", TRACE_SERVICES)
def test_sampled_workload_has_the_stored_quantiles(service):
    """Inverse-CDF sampling: at every stored probability p with quantile x, the sampled share at or
    below x is p. Lengths are rounded to whole tokens, so the check brackets x by half a token:
    share(< x - 0.5) <= p <= share(<= x + 0.5), each within 0.02. For 20,000 draws a share's
    standard error is at most 0.0035, so 0.02 is 5.7 of them (odds below 1e-8 per probability for
    a correct sampler; the seed is fixed, so the test is deterministic)."""
    n, tol = 20_000, 0.02
    q = stored_trace_quantiles(service)
    specs = sampled_trace_workload(n, service, seed=1)
    gaps = np.diff([s.arrival_s for s in specs])
    for name, values, half in (
        ("prompt_tokens", [s.prompt_tokens for s in specs], 0.5),
        ("output_tokens", [s.output_tokens for s in specs], 0.5),
        ("interarrival_s", gaps, 0.0),
    ):
        values = np.sort(values)
        for p, x in zip(q["probabilities"], q[name]):
            below = np.searchsorted(values, x - half, side="left") / len(values)
            at_or_below = np.searchsorted(values, x + half, side="right") / len(values)
            assert below - tol <= p <= at_or_below + tol, (name, p, x, below, at_or_below)


def test_sampled_workload_rate():
    """conv's gaps have a coefficient of variation of about 1.1, so the mean of 20,000 sampled gaps
    has a relative standard error under 1%: 5% is over 5 of them."""
    q = stored_trace_quantiles("conv")
    specs = sampled_trace_workload(20_000, "conv", seed=2)
    assert (len(specs) - 1) / specs[-1].arrival_s == pytest.approx(q["rate_per_s"], rel=0.05)


def test_sampled_workload_is_a_trace_shaped_request_list():
    """What ``read_trace`` returns: RequestSpecs from t = 0, in arrival order, whole tokens >= 1."""
    specs = sampled_trace_workload(50, "code", seed=0)
    assert len(specs) == 50 and all(isinstance(s, RequestSpec) for s in specs)
    assert specs[0].arrival_s == 0.0
    assert all(b.arrival_s >= a.arrival_s for a, b in zip(specs, specs[1:]))
    assert all(isinstance(s.prompt_tokens, int) and s.prompt_tokens >= 1 and s.output_tokens >= 1 for s in specs)
    assert specs == sampled_trace_workload(50, "code", seed=0)
    assert specs != sampled_trace_workload(50, "code", seed=1)
    assert specs != sampled_trace_workload(50, "conv", seed=0)


def test_sampled_workload_from_given_quantiles():
    """One step from 10 to 20 tokens: every draw lands in [10, 20]; a constant gap spaces arrivals evenly."""
    q = {"probabilities": [0.0, 1.0], "prompt_tokens": [10, 20], "output_tokens": [3, 3], "interarrival_s": [0.5, 0.5]}
    specs = sampled_trace_workload(200, seed=4, quantiles=q)
    assert {s.output_tokens for s in specs} == {3}
    assert all(10 <= s.prompt_tokens <= 20 for s in specs)
    assert len({s.prompt_tokens for s in specs}) > 5
    assert [s.arrival_s for s in specs[:3]] == [0.0, 0.5, 1.0]


def test_trace_quantiles_by_hand():
    specs = [RequestSpec(0.0, 10, 1), RequestSpec(1.0, 20, 2), RequestSpec(3.0, 30, 3), RequestSpec(4.0, 40, 4)]
    q = trace_quantiles(specs, probabilities=(0.0, 0.5, 1.0))
    assert q == {
        "num_requests": 4,
        "duration_s": 4.0,
        "rate_per_s": 0.75,
        "prompt_tokens": [10.0, 25.0, 40.0],
        "output_tokens": [1.0, 2.5, 4.0],
        "interarrival_s": [1.0, 1.0, 2.0],
    }
    with pytest.raises(ValueError, match="at least 2"):
        trace_quantiles(specs[:1])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: sampled_trace_workload(0), "must be > 0"),
        (lambda: sampled_trace_workload(3, "chat"), "unknown"),
        (lambda: stored_trace_quantiles("chat"), "conv, code"),
    ],
)
def test_sampled_workload_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_stored_quantiles_missing_file(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        stored_trace_quantiles("conv", path=tmp_path / "quantiles.json")


# -- scaling --------------------------------------------------------------------------------------


def test_scale_workload_arithmetic_and_caps():
    specs = [RequestSpec(0.0, 400, 100), RequestSpec(2.0, 1000, 8), RequestSpec(3.0, 2, 1)]
    out = scale_workload(specs, time_scale=0.5, length_scale=0.25, max_prompt_tokens=200, max_output_tokens=20)
    assert out == [RequestSpec(0.0, 100, 20), RequestSpec(1.0, 200, 2), RequestSpec(1.5, 1, 1)]
    # Defaults change nothing; lengths never fall below one token.
    assert scale_workload(specs) == specs
    assert all(s.prompt_tokens == 1 and s.output_tokens == 1 for s in scale_workload(specs, length_scale=1e-6))
    assert [s.arrival_s for s in scale_workload(specs, time_scale=4)] == [0.0, 8.0, 12.0]


# -- prompts of exact lengths ---------------------------------------------------------------------


class CharTokenizer:
    """One id per character: a stand-in with the one method the workload module calls."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 5000 for c in text]


def _is_window(ids, prompt) -> bool:
    n = len(prompt)
    return any(list(ids[i : i + n]) == prompt for i in range(len(ids) - n + 1) if ids[i] == prompt[0])


def test_text_prompts_exact_length_distinct_contiguous():
    from minieng.measure.workloads import DEFAULT_TEXT

    tok = CharTokenizer()
    ids = tok.encode(DEFAULT_TEXT.read_text(encoding="utf-8"))
    prompts = text_prompts(tok, 50, count=6)
    assert len(prompts) == 6
    assert all(len(p) == 50 for p in prompts)
    assert len({tuple(p) for p in prompts}) == 6
    assert all(_is_window(ids, p) for p in prompts)


def test_text_prompts_on_a_short_text(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("abcdefghij")
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="num_tokens=11"):
        text_prompts(tok, 11, path=path)
    prompts = text_prompts(tok, 4, count=5, path=path)  # wraps around the 7 possible windows
    assert all(len(p) == 4 for p in prompts)
    assert len({tuple(p) for p in prompts}) == 5
    assert text_prompts(tok, 10, path=path) == [[ord(c) for c in "abcdefghij"]]


def test_workload_prompts_with_a_fake_tokenizer(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("".join(chr(65 + i % 26) * 1 + str(i) for i in range(500)))
    specs = [RequestSpec(0.0, n, 1) for n in (1, 7, 30, 30, 100)]
    prompts = workload_prompts(CharTokenizer(), specs, path=path)
    assert [len(p) for p in prompts] == [1, 7, 30, 30, 100]
    assert prompts[2] != prompts[3]
    with pytest.raises(ValueError, match="prompt_tokens=100000"):
        workload_prompts(CharTokenizer(), [RequestSpec(0.0, 100000, 1)], path=path)


@pytest.mark.real_model
def test_text_prompts_with_the_real_tokenizer(default_model):
    tok = default_model.tokenizer
    prompts = text_prompts(tok, 64, count=4)
    assert [len(p) for p in prompts] == [64] * 4
    assert len({tuple(p) for p in prompts}) == 4
    assert all(0 <= i < tok.vocab_size + len(tok.get_added_vocab()) for p in prompts for i in p)
    text = tok.decode(prompts[0])
    assert sum(c.isalpha() for c in text) > len(text) / 2  # prose, not noise
    with pytest.raises(ValueError, match="exceeds"):
        text_prompts(tok, 10**6)


@pytest.mark.real_model
def test_workload_prompts_with_the_real_tokenizer(default_model):
    specs = [RequestSpec(0.0, n, 4) for n in (3, 16, 16, 128, 300)]
    prompts = workload_prompts(default_model.tokenizer, specs)
    assert [len(p) for p in prompts] == [3, 16, 16, 128, 300]
    assert len({tuple(p) for p in prompts}) == len(prompts)
    assert prompts == workload_prompts(default_model.tokenizer, specs)  # seeded: reproducible


@pytest.mark.parametrize("arrivals", [[0.0, 0.0, 0.0], [0.0, 2.0, 1.0]])
def test_trace_quantiles_refuse_arrivals_out_of_order_or_at_one_instant(arrivals):
    with pytest.raises(ValueError, match="time order"):
        trace_quantiles([RequestSpec(t, 16, 8) for t in arrivals])
