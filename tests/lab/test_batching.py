"""Notebook 05's batching experiments: the decode batch sweep, the roofline's compute-bound batch,
the arrival rate, and static against continuous batching on one workload."""

from __future__ import annotations

import pytest
from helpers import assert_same_or_near_tie, hf_next_logits, make_engine, random_prompts

from minieng.config import ModelConfig
from minieng.lab import batching as batch_experiment
from minieng.lab.batching import (
    batch_sweep,
    compare_batching,
    decode_point,
    limiting_factor,
    near_linear_batch,
    sustainable_rate,
)
from minieng.measure.peaks import Peak
from minieng.measure.workloads import RequestSpec, fixed_workload, poisson_workload, spread_output_lengths

PEAK = Peak("measured cpu float32", 0.07, 15.0, "measured")


def test_decode_point(worded):
    engine = make_engine(worded, max_num_seqs=8)
    sheet = Peak("a datasheet twice the measured FLOP/s", 0.14, 30.0, "datasheet")
    row = decode_point(engine, 4, prompt_tokens=12, output_tokens=6, peaks=[PEAK, sheet])
    assert row["batch_size"] == 4 and row["tok_s"] == pytest.approx(4 / row["tpot_s"])
    by_peak = row["mfu_percent_by_peak"]
    assert by_peak["measured"] == row["mfu_percent"] and by_peak["datasheet"] == pytest.approx(row["mfu_percent"] / 2)
    assert 0 < row["kv_bytes_share"] < 1 and row["mbu_percent"] > 0 and row["mfu_percent"] > 0
    assert row["intensity_flop_per_byte"] > 0 and row["wall_s"] > 0 and row["seconds_per_step"] > 0
    # the roofline's keys too (notebook 02 reads them): one decode_point for both lessons
    assert row["by_peak"]["measured"]["mfu_percent"] == row["mfu_percent"] and row["intensity"] > 0


def fake_points(tpot_by_batch: dict[int, float], wall_s: float = 1.0):
    calls = []

    def point(engine, b, prompt_tokens, output_tokens, peaks):
        calls.append(b)
        return {"batch_size": b, "tpot_s": tpot_by_batch[b], "tok_s": b / tpot_by_batch[b], "wall_s": wall_s * b}

    return point, calls


def test_batch_sweep_stops_once_tok_s_stops_growing(monkeypatch):
    # tok/s: 10, 20, 40, 44, 45: stops growing at batch 4, confirmed by batches 8 and 16.
    tpot = {1: 0.1, 2: 0.1, 4: 0.1, 8: 8 / 44, 16: 16 / 45, 32: 1.0}
    point, calls = fake_points(tpot)
    monkeypatch.setattr(batch_experiment, "decode_point", point)
    r = batch_sweep(None, 64, 8, 4, [PEAK], budget_s=1e9)
    assert calls == [1, 2, 4, 8, 16] and r["knee_batch"] == 4 and r["knee_reached"]


def test_one_slow_point_does_not_end_the_batch_sweep(monkeypatch):
    # tok/s: 10, 8 (a noisy point), 40, 80, 82, 83: the knee is at 8, not at 1.
    tpot = {1: 0.1, 2: 0.25, 4: 0.1, 8: 0.1, 16: 16 / 82, 32: 32 / 83, 64: 1.0}
    point, calls = fake_points(tpot)
    monkeypatch.setattr(batch_experiment, "decode_point", point)
    r = batch_sweep(None, 64, 8, 4, [PEAK], budget_s=1e9)
    assert calls == [1, 2, 4, 8, 16, 32] and r["knee_batch"] == 8


def test_batch_sweep_keeps_to_max_batch_and_budget(monkeypatch):
    point, calls = fake_points({b: 0.1 for b in (1, 2, 4, 8, 16, 32, 48)})  # tok/s grows without end
    monkeypatch.setattr(batch_experiment, "decode_point", point)
    r = batch_sweep(None, 48, 8, 4, [PEAK], budget_s=1e9)
    assert calls == [1, 2, 4, 8, 16, 32, 48] and not r["knee_reached"]
    calls.clear()
    r = batch_sweep(None, 48, 8, 4, [PEAK], budget_s=10.0)  # points cost 1, 2, 4, 8 s: the 8 would overrun
    assert calls == [1, 2, 4] and [row["batch_size"] for row in r["rows"]] == [1, 2, 4]


SMOL = ModelConfig("llama", 49152, 576, 1536, 30, 9, 3, 64, 1e-5, 8192, True)  # SmolLM2-135M's shape


def test_sustainable_rate():
    # 8 slots, 40 tokens at 50 ms: 0.25 s of the engine per request; a 100-token prompt at 1000 tok/s: 0.1 s.
    assert sustainable_rate(0.05, 8, 40, 100, 1000.0) == pytest.approx(1 / 0.35)
    with pytest.raises(ValueError, match="must be > 0"):
        sustainable_rate(0.0, 8, 40, 100, 1000.0)


def test_spread_output_lengths():
    specs = poisson_workload(200, 5.0, 32, 10, seed=1)
    spread = spread_output_lengths(specs, 4, 9, seed=2)
    assert [s.arrival_s for s in spread] == [s.arrival_s for s in specs]
    assert {s.output_tokens for s in spread} == set(range(4, 10)), "every length in [low, high] is drawn"
    assert all(s.prompt_tokens == 32 for s in spread)
    assert spread == spread_output_lengths(specs, 4, 9, seed=2) != spread_output_lengths(specs, 4, 9, seed=3)
    with pytest.raises(ValueError, match="low=5, high=4"):
        spread_output_lengths(specs, 5, 4)


def test_static_and_continuous_on_one_workload(worded, tiny_llama):
    hf = tiny_llama[0]
    specs = spread_output_lengths(fixed_workload(9, 6, 1, interval_s=0.01), 2, 14, seed=0)
    prompts = random_prompts([6] * 9, 300, seed=9)
    engines = {
        "static": make_engine(worded, max_num_seqs=3, batching="static", batch_timeout_s=0.05),
        "continuous": make_engine(worded, max_num_seqs=3),
    }
    r = compare_batching(engines, specs, prompts)
    for name, run in r["runs"].items():
        m = run["metrics"]
        assert m["completed"] == 9 and m["total_output_tokens"] == sum(s.output_tokens for s in specs), name
        assert len(run["ttft_ms"]) == len(run["e2el_ms"]) == 9
        assert 1 <= run["mean_sequences_per_step"] <= 3
        assert max(seqs for _, _, seqs in run["steps"]) <= 3
        assert [len(t) for t in run["token_ids"]] == [s.output_tokens for s in specs]
    for i, (a, b) in enumerate(zip(r["runs"]["static"]["token_ids"], r["runs"]["continuous"]["token_ids"])):
        assert_same_or_near_tie(a, b, prompts[i], hf_next_logits(hf), what=f"request {i}")
    assert isinstance(r["same_tokens"], bool)


def test_a_static_batch_holds_its_slots_until_the_longest_ends(worded):
    """All at once, one long request and two short ones per batch: a static engine runs the short
    ones' slots empty until the long one ends; a continuous one refills them."""
    specs = [RequestSpec(0.0, 6, n) for n in (20, 2, 2, 20, 2, 2)]
    prompts = random_prompts([6] * 6, 300, seed=10)
    engines = {
        "static": make_engine(worded, max_num_seqs=3, batching="static"),
        "continuous": make_engine(worded, max_num_seqs=3),
    }
    runs = compare_batching(engines, specs, prompts)["runs"]
    static_seqs = [s for _, _, s in runs["static"]["steps"]]
    continuous_seqs = [s for _, _, s in runs["continuous"]["steps"]]
    assert static_seqs.count(1) >= 2 * 17, "each batch ran its long request alone for most of its steps"
    assert len(continuous_seqs) < len(static_seqs)


def row(b: int, tok_s: float, intensity: float = 1.0, mbu: float = 10.0) -> dict:
    return {"batch_size": b, "tok_s": tok_s, "intensity_flop_per_byte": intensity, "mbu_percent": mbu}


def test_near_linear_batch_is_the_last_batch_of_an_unbroken_run():
    rows = [row(1, 10), row(2, 19), row(4, 30), row(8, 75), row(16, 80)]  # 4 falls to 75% ... 8 recovers to 94%
    assert near_linear_batch(rows) == 8
    assert near_linear_batch(rows, efficiency=0.8) == 2, "batch 4 breaks the run at 80%"
    assert near_linear_batch([row(1, 10)]) == 1
    with pytest.raises(ValueError):
        near_linear_batch([])


@pytest.mark.parametrize(
    "intensity,mbu,expected",
    [(50.0, 10.0, "compute"), (5.0, 80.0, "bandwidth"), (5.0, 20.0, "overhead"), (20.0, 0.1, "compute")],
)
def test_limiting_factor(intensity, mbu, expected):
    assert limiting_factor(row(8, 1.0, intensity, mbu), ridge_flop_per_byte=20.0) == expected


def test_format_batching_names_a_tail_over_too_few_requests_the_max():
    from minieng.lab.batching import format_batching
    from minieng.measure.metrics import RequestMetrics, serving_metrics

    def run(n, e2el_s):  # n requests of 3 tokens, the last token at e2el_s
        reqs = [RequestMetrics.from_emissions(i, [(i + 0.1, 1), (i + e2el_s, 2)], 6) for i in range(n)]
        return {"metrics": serving_metrics(reqs).to_dict(), "mean_sequences_per_step": 2.0}

    lines = format_batching({"runs": {"static": run(24, 0.5), "continuous": run(120, 0.3)}})
    assert lines[0].split() == ["static", "continuous"]
    e2el = next(line for line in lines if line.startswith("E2EL max"))
    assert e2el.startswith("E2EL max of 24 ms") and e2el.split()[-2:] == ["500", "300"]  # the maxima
    assert "E2EL P50 ms" in "\n".join(lines) and "P99" not in "\n".join(lines)
    assert next(line for line in lines if line.startswith("queue")).split() == ["queue", "ms", "N/A", "N/A"]
