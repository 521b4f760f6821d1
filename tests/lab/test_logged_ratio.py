"""S1, part b: the article's 136x as vLLM logs it moves with the load, on a tiny random Llama in a
smoke-sized run: the logged prompt / generation ratio follows the hit share (the prompt grows with the
cached prefix, the tokens computed do not) and stays put when only the running count changes."""

from __future__ import annotations

import pytest
from helpers import random_prompts

from minieng.course.verdicts import s1_logged_ratio
from minieng.lab.logged_ratio import (
    LoadSetting,
    format_logged_ratios,
    log_lines,
    logged_ratio_sweep,
    logged_ratios,
)

SHARED, USER, OUTPUT, REQUESTS, RUNNING = 32, 8, 2, 4, 4  # blocks of 4: the prefix is 8 whole blocks


@pytest.fixture(scope="module")
def sweep(tiny_llama):
    from helpers import make_engine

    engine = make_engine(tiny_llama[1], max_num_seqs=8)
    shared, *turns = random_prompts([SHARED] + [USER] * REQUESTS, 300, seed=5)
    return engine, logged_ratio_sweep(engine, shared, turns, OUTPUT, max_running=RUNNING, lines_per_load=3)


def by_setting(result):
    return {(x["shared_prefix"], x["prefix_caching"], x["max_running"]): x for x in result["loads"]}


def test_s1_logged_ratio_moves_with_the_hit_share_not_with_the_running_count(sweep):
    _, result = sweep
    loads = by_setting(result)
    alone, alone_many = loads[False, True, 1], loads[False, True, RUNNING]
    shared, shared_many, cold = loads[True, True, 1], loads[True, True, RUNNING], loads[True, False, 1]
    # Hit shares: nothing shared; the cached prefix is 32 of every 40-token prompt; the cache off.
    assert [x["whole"]["prefix_cache_hit_rate"] for x in (alone, shared, shared_many, cold)] == pytest.approx(
        [0.0, 0.8, 0.8, 0.0]
    )
    # Over the run the logged ratio is the load's prompt tokens per output token.
    for load in result["loads"]:
        assert load["whole"]["prompt_to_generation_ratio"] == pytest.approx(load["load_ratio"])
    assert alone["load_ratio"] == USER / OUTPUT and shared["load_ratio"] == (SHARED + USER) / OUTPUT
    # The hit share multiplies it by 1 / (1 - hit share) while each request computes the same tokens.
    assert shared["whole"]["prompt_to_generation_ratio"] / alone["whole"]["prompt_to_generation_ratio"] == (
        pytest.approx(1 / (1 - 0.8))
    )
    assert shared["whole"]["num_computed_prompt_tokens"] == alone["whole"]["num_computed_prompt_tokens"]
    assert cold["whole"]["num_computed_prompt_tokens"] == cold["whole"]["num_prompt_tokens"]
    # Four running instead of one (every step holds four sequences): the same ratio. (Both figures
    # rise with it; timings on a shared CPU are not asserted.)
    for one, many in ((alone, alone_many), (shared, shared_many)):
        assert many["whole"]["prompt_to_generation_ratio"] == pytest.approx(one["whole"]["prompt_to_generation_ratio"])
        assert (one["mean_running"], many["mean_running"]) == pytest.approx((1.0, RUNNING))
    # The course's verdict on these ratios: each is its load's prompt tokens per output token.
    loads = [load["load_ratio"] for load in result["loads"]]
    assert s1_logged_ratio(logged_ratios(result), load_ratios=loads).startswith("explained")


def test_lines_split_the_run_and_print_vllms_wording(sweep):
    _, result = sweep
    for load in result["loads"]:
        lines = load["lines"]
        assert len(lines) == 3
        assert sum(x["num_prompt_tokens"] for x in lines) == load["whole"]["num_prompt_tokens"]
        assert sum(x["num_generation_tokens"] for x in lines) == REQUESTS * OUTPUT
        assert sum(x["interval_s"] for x in lines) == pytest.approx(load["whole"]["interval_s"])
        printed = log_lines(load)
        assert len(printed) == 3 and all(p.startswith("Engine 000: Avg prompt throughput: ") for p in printed)
    table = format_logged_ratios(result)
    assert "shared prefix + turn, cache on, 4 running" in table and "12,968.6 vs 95 tok/s = 136.5x" in table


def test_physics_ratio_comes_from_a_one_at_a_time_load_without_hits(sweep):
    _, result = sweep
    physics = result["physics"]
    assert physics is not None and physics["ratio"] == pytest.approx(physics["prefill_tok_s"] / physics["decode_tok_s"])
    assert by_setting(result)[True, True, 1]["physics"] is None  # a load with hits is not physics
    assert physics in [x["physics"] for x in result["loads"] if x["physics"]]


def test_refusals(sweep):
    engine, _ = sweep
    shared, turn = [1] * 8, [2] * 4
    with pytest.raises(ValueError, match="max_num_seqs"):
        logged_ratio_sweep(engine, shared, [turn], 2, settings=[LoadSetting(False, True, 9)])
    with pytest.raises(ValueError, match="output_tokens"):
        logged_ratio_sweep(engine, shared, [turn], 0)
    with pytest.raises(ValueError, match="user turn"):
        logged_ratio_sweep(engine, shared, [], 2)


def test_the_figure_draws_each_load(sweep):
    import io

    from minieng.viz import logged_ratio_figure

    _, result = sweep
    fig = logged_ratio_figure(result)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.getvalue().startswith(b"\x89PNG")
    left, right = fig.axes
    assert len(left.patches) == 2 * len(result["loads"]) and len(right.patches) == 3 * len(result["loads"])
    heights = [p.get_height() for p in left.patches[: len(result["loads"])]]
    assert heights == pytest.approx(logged_ratios(result))


def test_the_estimate_counts_each_loads_prefills_and_decode_steps():
    from minieng.lab.logged_ratio import logged_ratio_estimate_s

    probe = {"prefill_tok_s": 1000.0, "overhead_s": 0.01, "decode_step_s": 0.02}
    # 352 prefill tokens (4 x 4 x 8 turns, 2 x 32 warm-ups, 4 x 40 with the cache off), 22 prefills,
    # 14 decode steps (12 one at a time, 2 for the two loads of one wave of four).
    assert logged_ratio_estimate_s(probe, SHARED, USER, OUTPUT, REQUESTS, RUNNING) == pytest.approx(0.352 + 0.22 + 0.28)
