"""Notebook 05's KV-cache experiments on a tiny random Llama: recompute against cache, block
tables of a live batch, and the pool's cap on concurrency."""

from __future__ import annotations

import pytest
from helpers import assert_same_or_near_tie, hf_next_logits, random_prompts

from minieng.lab.kv_cache import (
    block_table_snapshot,
    concurrency_run,
    live_block_tables,
    recompute_budget_tokens,
    recompute_estimate_s,
    recompute_vs_cache,
    sequences_that_fit,
)
from minieng.measure.sweep_plan import predict_ttft_s
from minieng.units import cdiv

VOCAB = 300


@pytest.mark.parametrize("budget", [512, 8])  # one prefill step, or the prompt in chunks of 8
def test_recompute_and_cache_give_the_same_tokens_for_quadratic_and_linear_work(tiny_llama, tiny_engine, budget):
    hf, _ = tiny_llama
    engine = tiny_engine(max_num_batched_tokens=budget, max_num_seqs=8)
    prompt, m = random_prompts([21], VOCAB, seed=3)[0], 12
    r = recompute_vs_cache(engine, prompt, m)
    n = len(prompt)
    assert_same_or_near_tie(
        r["cache"]["token_ids"], r["recompute"]["token_ids"], prompt, hf_next_logits(hf), what="recompute vs cache"
    )
    assert r["same_tokens"] == (r["first_difference"] is None)
    # Work: the cache runs the prompt once, then one token per step; recompute reruns everything.
    assert r["cache"]["tokens_run"] == [n] + [1] * (m - 1)
    assert r["recompute"]["tokens_run"] == [n + i for i in range(m)]
    assert sum(r["recompute"]["tokens_run"]) == n * m + m * (m - 1) // 2
    flops = r["recompute"]["flops"]
    assert all(b > a for a, b in zip(flops, flops[1:])), "recompute FLOPs grow with every token"
    assert r["cache"]["flops"][0] == pytest.approx(flops[0]), "both start with the same prefill"
    assert max(r["cache"]["flops"][1:]) < flops[0]
    for side in ("cache", "recompute"):
        assert len(r[side]["token_s"]) == m and all(t > 0 for t in r[side]["token_s"])
    # Nothing left behind: the prefix cache is empty and every block free.
    assert (
        not engine.has_unfinished_requests() and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    )
    assert engine.block_manager.enable_prefix_caching, "the engine's prefix-cache switch is restored"


def test_recompute_vs_cache_refuses_what_does_not_fit(tiny_engine):
    engine = tiny_engine(max_model_len=32)
    with pytest.raises(ValueError, match="max_tokens=0"):
        recompute_vs_cache(engine, [1, 2, 3], 0)
    with pytest.raises(ValueError, match="max_model_len=32"):
        recompute_vs_cache(engine, [1] * 30, 5)


PROBE = {"prefill_tok_s": 1000.0, "overhead_s": 0.01, "decode_step_s": 0.02}


def estimated_s(prompt: int, m: int) -> float:
    total = sum(predict_ttft_s(PROBE, prompt + i) + PROBE["decode_step_s"] for i in range(m))
    assert recompute_estimate_s(PROBE, prompt, m) == pytest.approx(total)
    return total


@pytest.mark.parametrize("budget_s", [0.0, 0.5, 2.0, 10.0, 1e6])
def test_recompute_budget_tokens_is_the_longest_answer_that_fits(budget_s):
    m = recompute_budget_tokens(PROBE, 32, budget_s, max_tokens=500)
    assert 2 <= m <= 500
    if m > 2:
        assert estimated_s(32, m) <= budget_s
    if m < 500:
        assert estimated_s(32, m + 1) > budget_s
    assert recompute_budget_tokens(PROBE, 32, budget_s, max_tokens=1) == 1


def test_live_block_tables_show_where_each_sequence_lives(tiny_engine):
    # 16 blocks of 4 tokens. Three requests fill most of the pool; the short one finishes and its
    # blocks go to the fourth, whose table then mixes them with never-used blocks.
    engine = tiny_engine(num_kv_blocks=16, block_size=4, max_model_len=64, max_num_seqs=4, enable_prefix_caching=False)
    prompts = random_prompts([10, 6, 14, 9], VOCAB, seed=4)
    snap = live_block_tables(engine, prompts, [30, 2, 30, 30], join_every=3, steps=14)
    seqs = snap["sequences"]
    assert snap["num_blocks"] == 16 and snap["block_size"] == 4 and snap["step"] == 14
    assert snap["finished"] == ["1"], "the 2-token request finished; the others still run"
    assert sorted(s["request_id"] for s in seqs) == ["0", "2", "3"]
    held = [b for s in seqs for b in s["block_table"]]
    assert len(held) == len(set(held)), "no block is held twice"
    assert snap["num_free_blocks"] == 16 - len(held)
    for s in seqs:
        assert len(s["block_table"]) == cdiv(s["num_computed_tokens"] + 1, 4) or len(s["block_table"]) == cdiv(
            s["num_computed_tokens"], 4
        ), "a table covers its tokens"
    late = next(s for s in seqs if s["request_id"] == "3")["block_table"]
    assert any(b - a != 1 for a, b in zip(late, late[1:])), f"request 3's blocks are all adjacent: {late}"
    # Afterwards the engine is idle and the pool empty.
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == 16
    assert block_table_snapshot(engine)["sequences"] == []


def test_live_block_tables_refuses_mismatched_lengths(tiny_engine):
    with pytest.raises(ValueError, match="one output length per prompt"):
        live_block_tables(tiny_engine(), [[1, 2]], [3, 4], join_every=1, steps=2)


@pytest.mark.parametrize(
    "blocks,size,tokens,expected",
    [(100, 16, 16, 100), (100, 16, 17, 50), (100, 16, 1, 100), (7, 4, 30, 0), (0, 16, 5, 0), (1456, 16, 96, 242)],
)
def test_sequences_that_fit(blocks, size, tokens, expected):
    assert sequences_that_fit(blocks, size, tokens) == expected


def test_sequences_that_fit_refuses_nonsense():
    with pytest.raises(ValueError, match="tokens_per_sequence >= 1"):
        sequences_that_fit(10, 16, 0)


def test_the_pool_caps_the_batch_and_preempts_as_sequences_grow(tiny_engine):
    # 24 blocks of 4 tokens; prompts of 8 tokens (2 blocks) that grow to 8 + 16 = 24 (6 blocks).
    engine = tiny_engine(num_kv_blocks=24, block_size=4, max_model_len=96, max_num_seqs=32, max_num_batched_tokens=256)
    prompts = random_prompts([8] * 16, VOCAB, seed=6)
    r = concurrency_run(engine, prompts, output_tokens=16)
    assert r["cap_at_prompt"] == 12 and r["cap_at_full_length"] == 4
    assert r["peak_running"] == 12, "admission fills the pool at prompt length"
    assert r["num_preemptions"] > 0 and sum(r["preempted"]) == r["num_preemptions"]
    assert max(r["running"]) <= min(r["max_num_seqs"], r["cap_at_prompt"])
    assert max(r["used_blocks"]) <= 24 and len(r["running"]) == len(r["used_blocks"])


def test_with_room_to_spare_max_num_seqs_caps_the_batch(tiny_engine):
    engine = tiny_engine(num_kv_blocks=256, block_size=4, max_num_seqs=5)
    r = concurrency_run(engine, random_prompts([8] * 9, VOCAB, seed=7), output_tokens=4)
    assert r["peak_running"] == 5 and r["num_preemptions"] == 0
