"""Notebook 03's decode floor and notebook 11's tables: a batch-1 decode's bytes over its time, a
context point's bytes and floor, the published pairs' floors and the projections' tables."""

from __future__ import annotations

import pytest
from helpers import make_engine

from minieng.config import published_config
from minieng.lab.decode_floor import (
    decode_b1,
    decode_projection,
    floor_pairs,
    format_floor_pairs,
    format_kv_rows,
    format_thread_knob,
    kv_growth_words,
    kv_point,
)
from minieng.lab.lesson_setup import device_peaks, format_peaks
from minieng.measure.flops_bytes import decode_work
from minieng.measure.peaks import Peak

PEAK = Peak("measured cpu float32", 0.07, 15.0, "measured")


def test_device_peaks_on_a_cpu_is_the_measured_ceiling_alone(worded):
    engine = make_engine(worded)
    assert device_peaks(engine, PEAK) == [PEAK]
    lines = format_peaks([PEAK])
    assert "ridge 4.67 FLOP/byte" in lines[0] and "no datasheet" in lines[-1]


def test_decode_b1_counts_the_bytes_of_the_steps_it_kept(worded):
    engine = make_engine(worded)
    u = decode_b1(engine, 8, 3, [PEAK])
    assert u["num_steps"] >= 3 and u["seconds"] > 0
    # Every kept step read the weights once and a context of at least the prompt.
    one = decode_work(engine.model_config, 1, 8, engine.dtype.itemsize).total_bytes
    assert u["bytes"] / u["num_steps"] >= one
    assert u["measured"]["mbu_percent"] > 0 and u["measured"]["limit"] in {"compute", "memory", "overhead"}


def test_kv_point_floor_is_the_bytes_over_the_bandwidth(worded):
    engine = make_engine(worded, max_num_seqs=2)
    r = kv_point(engine, 2, 16, 3, PEAK)
    assert r["floor_s"] == pytest.approx((r["weight_bytes"] + r["kv_bytes"]) / 15e9)
    assert r["mbu_percent"] == pytest.approx(100 * r["floor_s"] / r["tpot_s"])
    assert r["kv_bytes"] > 0 and r["context_tokens"] == 16
    assert "16" in format_kv_rows([r])[1]


def _row(context, tpot_ms, floor_ms, limit="memory"):
    return {"context_tokens": context, "tpot_s": tpot_ms / 1e3, "floor_s": floor_ms / 1e3, "limit": limit, "bound": "b"}


def test_kv_growth_words_say_what_the_extra_kv_cost():
    words = kv_growth_words([_row(16, 2.0, 1.0), _row(1024, 5.0, 2.0)], visible_x=1.2)
    assert "floor grew 2.00x" in words and "TPOT 2.50x" in words and "3.0x the floor" in words
    assert "too little KV" in kv_growth_words([_row(16, 2.0, 1.0), _row(32, 2.1, 1.1)], visible_x=1.2)
    assert "did not grow" in kv_growth_words([_row(16, 2.0, 1.0), _row(1024, 1.9, 2.0)], visible_x=1.2)
    assert "at the shortest context the step is b" in kv_growth_words(
        [_row(16, 2.0, 1.0, "overhead"), _row(1024, 5.0, 2.0)], 1.2
    )
    assert "shortest context" not in words


def test_floor_pairs_put_the_4_bit_3060_ahead_of_the_bf16_l4():
    rows = {(r["model"], r["gpu"]): r for r in floor_pairs()}
    q4, l4 = rows[("Llama-3-8B", "RTX 3060")], rows[("Llama-3-8B", "L4")]
    assert q4["floor_s"] < l4["floor_s"]  # 4 bits cut the bytes fourfold; 360 GB/s against 300
    assert q4["floor_s"] == pytest.approx(q4["bytes"] / (q4["bandwidth_gbps"] * 1e9))
    assert len(format_floor_pairs(floor_pairs())) == len(rows) + 1


def test_decode_projection_ranks_by_ridge_and_stars_this_device():
    cfg = published_config("SmolLM2-1.7B")
    b1 = {"measured": {"mbu_percent": 50.0, "mfu_percent": 3.0}}
    p = decode_projection(b1, cfg, 64, [PEAK])
    assert p["judged"] == "measured" and p["mbu_percent"] == 50.0
    for r in p["projected"]:
        assert r["mfu_percent"] == pytest.approx(50.0 * p["intensity"] / r["ridge_flop_per_byte"])
    assert p["here"] == ("this device (measured ceiling)", PEAK.peak_tflops, 3.0)
    # An MBU above 100% (a ceiling measured low) is projected at 100%.
    high = decode_projection({"measured": {"mbu_percent": 130.0, "mfu_percent": 3.0}}, cfg, 64, [PEAK])
    assert high["projected"][0]["mfu_percent"] == pytest.approx(
        100.0 * high["intensity"] / high["projected"][0]["ridge_flop_per_byte"]
    )


def test_format_thread_knob_reads_all_threads_against_one():
    rows = [
        {"threads": 2, "matmul_flop_s": 4e10, "copy_bytes_s": 1.2e10, "ttft_s": 0.01, "tpot_s": 0.002},
        {"threads": 1, "matmul_flop_s": 2e10, "copy_bytes_s": 1e10, "ttft_s": 0.02, "tpot_s": 0.0022},
    ]
    last = format_thread_knob(rows)[-1]
    assert "matmul ceiling 2.00x" in last and "copy 1.20x" in last and "prefill 2.00x faster, decode 1.10x" in last
