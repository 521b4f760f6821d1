"""Notebook 02's roofline sweep on the tiny model: prefill and decode points, the sweep's sizes
from a probe, and the sentences that read it."""

from __future__ import annotations

from helpers import make_engine

from minieng.config import published_config
from minieng.lab.roofline_sweep import (
    attention_shares,
    best_and_b1,
    crossover_lines,
    format_roofline,
    labelled,
    phase_reading,
    probe_words,
    roofline_sweep,
    sweep_sizes,
)
from minieng.measure.peaks import Peak

PEAK = Peak("measured cpu float32", 0.07, 15.0, "measured")
PROBE = {
    "overhead_s": 0.001,
    "prefill_tok_s": 5000.0,
    "decode_step_s": 0.002,
    "knee_tokens": 64,
    "knee_reached": True,
    "prefill_points": [(16, 0.004), (64, 0.013)],
    "max_prompt_tokens": 255,
}


def test_roofline_sweep_times_each_length_and_batch(worded):
    engine = make_engine(worded, max_num_seqs=4)
    res = roofline_sweep(engine, [8, 16], [1, 2], repeats=1, decode_tokens=3, decode_prompt_tokens=8, peaks=[PEAK])
    assert [r["prompt_tokens"] for r in res["prefill"]] == [8, 16] and [r["batch_size"] for r in res["decode"]] == [
        1,
        2,
    ]
    for _, r in labelled(res):
        assert r["seconds_per_step"] > 0 and r["intensity"] > 0 and r["by_peak"]["measured"]["mfu_percent"] > 0
    # A prefill reuses every weight for all its tokens: more FLOP per byte than batch-1 decode.
    best, b1 = best_and_b1(res)
    assert best["intensity"] > b1["intensity"]
    table = format_roofline(labelled(res), [PEAK])
    assert table[0].startswith("step") and any("decode b2" in line for line in table)
    assert any("prefill reached" in line for line in phase_reading(res, PROBE))


def test_sweep_sizes_keep_what_is_given_and_choose_the_rest(worded):
    engine = make_engine(worded)
    kw = dict(points=3, budget_s=5, repeats=1, decode_prompt_tokens=8, decode_tokens=3, max_batch=8, decode_budget_s=5)
    assert sweep_sizes(PROBE, engine, 4.7, prompt_tokens=[16, 32], decode_batches=[1, 4], **kw) == ([16, 32], [1, 4])
    lengths, batches = sweep_sizes(PROBE, engine, 4.7, prompt_tokens=None, decode_batches=None, **kw)
    assert lengths == sorted(lengths) and len(lengths) >= 1 and batches[0] == 1


def test_probe_words_say_where_the_knee_is():
    assert "stops growing at 64 tokens" in probe_words(PROBE)
    still = PROBE | {"knee_reached": False, "prefill_points": [(16, 0.004), (255, 0.05)]}
    assert "overhead-bound at every length" in probe_words(still)


def test_a_narrow_model_crosses_over_before_llama_3_8b():
    shapes = {"small": published_config("SmolLM2-135M"), "Llama-3-8B": published_config("Llama-3-8B")}
    lines = crossover_lines(shapes)
    n = [int(line.split("overtakes the linear layers at ")[1].split(" ")[0].replace(",", "")) for line in lines]
    assert n[0] < n[1]
    shares = attention_shares(shapes, [64, 4096])
    assert all(s[0] < s[1] for s in shares.values())
