"""Notebook 12's plumbing (``lab.continuous_batching``) and notebook 05's new readings
(``kv_cache.recompute_work``, ``batching.sweep_reading``, ``work_tables.kv_weights_answer``)."""

from __future__ import annotations

import pytest
from helpers import make_engine

from minieng.config import published_config
from minieng.lab.batching import batch_why, bound_lines, sweep_reading
from minieng.lab.continuous_batching import (
    admitted_at_first,
    batching_summary,
    block_tables_answer,
    faster_policy,
    format_block_tables,
    poisson_load,
    pool_caps,
)
from minieng.lab.kv_cache import format_recompute, recompute_totals, recompute_why, recompute_work
from minieng.lab.lesson_setup import device_peaks, format_probe, result_key
from minieng.lab.work_tables import kv_shapes, kv_weights_answer
from minieng.measure.peaks import Peak

PEAK = Peak("measured cpu float32", 0.07, 15.0, "measured")


@pytest.mark.parametrize("n,m,cache,recompute", [(16, 1, 16, 16), (16, 4, 19, 70), (1, 10, 10, 55)])
def test_recompute_work_counts_token_passes(n, m, cache, recompute):
    w = recompute_work(n, m)
    assert (w["cache"], w["recompute"]) == (cache, recompute) and w["ratio"] == pytest.approx(recompute / cache)
    with pytest.raises(ValueError):
        recompute_work(0, 4)


def fake_recompute(same=True):
    side = {"tokens_run": [16, 1, 1], "flops": [1e12, 1e11, 1e11], "token_s": [0.1, 0.01, 0.01]}
    slow = {"tokens_run": [16, 17, 18], "flops": [1e12, 1.1e12, 1.2e12], "token_s": [0.1, 0.1, 0.12]}
    return {
        "prompt_tokens": 16,
        "max_tokens": 3,
        "cache": side,
        "recompute": slow,
        "same_tokens": same,
        "first_difference": None if same else 2,
    }


def test_recompute_totals_and_table():
    t = recompute_totals(fake_recompute())
    assert t["work_x"] == pytest.approx(51 / 18) and t["time_x"] == pytest.approx(0.32 / 0.12)
    lines = format_recompute(fake_recompute(same=False))
    assert "2.8x the token-passes" in lines[-2] and "from output position 2" in lines[-1]


def test_recompute_why_names_the_knee():
    below = recompute_why(fake_recompute(), {"knee_tokens": 256, "knee_reached": True})
    past = recompute_why(fake_recompute(), {"knee_tokens": 8, "knee_reached": True})
    assert "below the prefill knee (256 tokens)" in below and "past the prefill knee (8 tokens)" in past


def test_kv_weights_answer_is_the_ratio_of_the_shapes_bytes():
    cfg = published_config("SmolLM2-135M")
    per_token = cfg.kv_bytes_per_token(4)
    assert per_token == 2 * 30 * 3 * 64 * 4
    assert f"{cfg.num_params * 4 // per_token:,} tokens" in kv_weights_answer(cfg, 4)
    names = [name for name, _, _ in kv_shapes(cfg, 4)]
    assert names[1] == "this model without GQA, 4-byte" and kv_shapes(cfg, 4)[1][1].num_key_value_heads == 9


def test_format_probe_says_whether_the_knee_was_reached():
    probe = {"prefill_tok_s": 900.0, "overhead_s": 0.002, "decode_step_s": 0.01, "knee_tokens": 512}
    assert "stops growing at 512" in format_probe(probe | {"knee_reached": True})
    assert "still growing at 512" in format_probe(probe | {"knee_reached": False})


def test_result_key_and_peaks_on_a_cpu(worded):
    engine = make_engine(worded, max_num_seqs=4)
    assert device_peaks(engine, PEAK) == [PEAK]
    assert result_key(engine, "tiny", a=1) == {"model": "tiny", "a": 1, "device": "cpu", "dtype": str(engine.dtype)}


def row(b, tok_s, intensity=1.0, mbu=10.0, mfu=1.0):
    return {
        "batch_size": b,
        "tok_s": tok_s,
        "tpot_s": b / tok_s,
        "intensity_flop_per_byte": intensity,
        "mbu_percent": mbu,
        "mfu_percent": mfu,
        "kv_bytes_share": 0.1,
        "mfu_percent_by_peak": {"measured": mfu, "datasheet": mfu / 2},
    }


def test_sweep_reading(worded):
    engine = make_engine(worded, max_num_seqs=8)
    rows = [row(1, 10, mfu=2), row(2, 19, mfu=4), row(4, 30, intensity=50, mfu=6), row(8, 31, mfu=7)]
    sweep = {"rows": rows, "knee_batch": 4, "knee_reached": True, "prompt_tokens": 8, "output_tokens": 4}
    sheet = Peak("sheet", 0.14, 30.0, "datasheet")
    r = sweep_reading(sweep, engine, [PEAK, sheet])
    assert r["linear_to"] == 4 and r["knee_row"] is rows[2] and r["mfu_source"] == "datasheet"
    assert (r["mfu_1"], r["mfu_top"]) == (1.0, 3.5) and r["pool_batch"] <= 8
    lines = bound_lines(rows, r["knee_row"], PEAK.ridge_flop_per_byte)
    assert "overhead" in lines[0] and lines[1].startswith("At batch 4") and "compute-bound" in lines[1]


def test_batch_why_quotes_both_step_ratios():
    class Napkin:
        def __init__(self, floor):
            self.tpot_floor_s, self.tpot_bound = floor, "bandwidth"

    text = batch_why(Napkin(0.01), Napkin(0.011), row(8, 40), row(1, 10))
    assert "1.10x batch 1's" in text and "measured one 2.00x" in text


def test_block_tables_in_words():
    snap = {
        "block_size": 16,
        "num_blocks": 18,
        "num_free_blocks": 3,
        "step": 32,
        "finished": ["1"],
        "sequences": [
            {"request_id": "0", "num_tokens": 40, "block_table": [0, 1, 5]},
            {"request_id": "2", "num_tokens": 17, "block_table": [2, 6]},
        ],
    }
    lines = format_block_tables(snap)
    assert lines[0] == "after 32 steps: request(s) 1 finished; 3 of 18 blocks free"
    assert "slots held 80, tokens in them 57" in lines[-1]
    answer = block_tables_answer([40, 20], [60, 4], 4, 18, 16)
    assert "[7, 2] blocks" in answer and "joins at step 4 (4 output tokens) ends first" in answer


def test_pool_caps_and_admission():
    lines = pool_caps(64, 16)
    assert lines[1].split()[-1] == "2" and "Llama-3-8B" in lines[-1]  # 64 blocks hold two 512-token sequences
    assert admitted_at_first(16, 16, 32, requests=16, max_num_seqs=64) == 8
    assert admitted_at_first(16, 16, 32, requests=3, max_num_seqs=64) == 3


def test_poisson_load_sizes_the_rate_from_the_capacity():
    load = poisson_load(0.05, 1000.0, 8, 64, (8, 64), 0.5, 12, 256)
    capacity = 1 / (36 * 0.05 / 8 + 64 / 1000)
    assert load["capacity"] == pytest.approx(capacity) and load["rate"] == float(f"{0.5 * capacity:.2g}")
    assert len(load["specs"]) % 8 == 0 and all(8 <= s.output_tokens <= 64 for s in load["specs"])
    assert load["timeout_s"] == pytest.approx(16 / load["rate"])


def test_batching_summary_and_the_faster_policy():
    def summary(v):
        return {"p50": v, "p99": v, "max": v, "count": 24}

    def run(tok_s, req_s, ms, full):
        return {
            "metrics": {
                "output_throughput_tok_s": tok_s,
                "request_throughput_req_s": req_s,
                "ttft_ms": summary(ms),
                "e2el_ms": summary(2 * ms),
                "tpot_ms": summary(ms / 10),
            },
            "mean_sequences_per_step": full,
        }

    serve = {"runs": {"static": run(100.0, 1.0, 500.0, 3.0), "continuous": run(150.0, 1.9, 100.0, 6.0)}}
    assert faster_policy(serve) == "continuous"
    lines = batching_summary(serve, rate=2.0)
    assert lines[0].startswith("Continuous batching served 1.50x") and "past its capacity" in lines[1]
    assert "TTFT (max of 24) 100 ms against 500 ms" in lines[2]
