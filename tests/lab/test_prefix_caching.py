"""prefix_caching: TTFT against the hit rate, the tokens the cache leaves to compute, and what each
lever on TTFT saves or costs (claim S19).

Runs on CPU over the tiny random Llama, whose engine has no tokenizer: the text prompts are replaced
by distinct random ids. Where a TTFT matters, the engine's clock is a fake one that advances 1 ms per
step plus 1 ms per token the step runs, so every TTFT is known in advance.
"""

from __future__ import annotations


import pytest
from helpers import random_prompts

from minieng.lab import prefix_caching
from minieng.lab.prefix_caching import (
    block_floor_verdict,
    format_levers,
    hit_rate_pair,
    multi_turn_verdict,
    ttft_levers,
    ttft_vs_hit_rate,
)
from minieng.measure.flops_bytes import prefill_work, step_work

P = 64  # the prompt's tokens; blocks of 4 (``make_engine``)


@pytest.fixture
def ids_for_text(monkeypatch, tiny_llama):
    """Distinct random prompts where the lab would cut real text (the tiny model has no tokenizer)."""
    vocab = tiny_llama[1].model.config.vocab_size
    monkeypatch.setattr(
        prefix_caching, "text_prompts", lambda tokenizer, n, count=1: random_prompts([n] * count, vocab, seed=n)
    )


@pytest.fixture
def swept(tiny_engine, ids_for_text, fake_clock):
    engine = fake_clock(tiny_engine(max_num_seqs=4))
    return engine, ttft_vs_hit_rate(engine, P, shares=(0.0, 0.01, 0.5, 0.9), requests=2)


def test_every_point_says_how_many_prompt_tokens_the_cache_left_to_compute(swept):
    _, sweep = swept
    assert sweep["cold"]["uncached_tokens"] == P and sweep["cold"]["hit_rate"] == 0
    by_shared = {p["shared_tokens"]: p for p in sweep["points"]}
    assert sorted(by_shared) == [0, 1, 32, 60]  # 0.9 * 64 rounded up to whole blocks of 4
    for p in sweep["points"]:
        assert p["uncached_tokens"] == pytest.approx(P * (1 - p["hit_rate"]))
    assert by_shared[60]["uncached_tokens"] == 4 and by_shared[32]["uncached_tokens"] == 32
    assert by_shared[1]["uncached_tokens"] == P  # under one block: nothing shared
    # the fake clock: 1 ms a step + 1 ms a computed token, one step a prompt
    assert sweep["cold"]["ttft_ms"]["p50"] == pytest.approx(1 + P)
    assert by_shared[60]["ttft_ms"]["p50"] == pytest.approx(1 + 4)


def test_the_s5_pair_is_the_highest_hit_and_the_lower_point_nearest_the_articles(swept):
    _, sweep = swept
    near, high = hit_rate_pair(sweep)
    assert high["shared_tokens"] == 60 and near["shared_tokens"] == 32  # 50% is nearest 85.5% below 93.75%
    assert hit_rate_pair(sweep, near_hit_rate=0.0)[0]["hit_rate"] == 0
    with pytest.raises(ValueError, match="two points"):
        hit_rate_pair({"points": [high]})


def test_the_block_size_floor_row(swept):
    _, sweep = swept
    here, said = block_floor_verdict(sweep)
    assert said.startswith("holds") and "1 shared tokens" in here
    leaky = sweep | {"points": [{"shared_tokens": 1, "hit_rate": 0.02}]}
    assert block_floor_verdict(leaky)[1].startswith("does not hold here")
    none = sweep | {"points": [p for p in sweep["points"] if p["shared_tokens"] != 1]}
    assert block_floor_verdict(none)[1].startswith("not testable here")


def test_the_multi_turn_row():
    climbing = [{"turn": 1, "hit_rate": 0.0}, {"turn": 2, "hit_rate": 0.4}, {"turn": 3, "hit_rate": 0.6}]
    assert multi_turn_verdict(climbing) == "holds: turn 1 hit 0% of its prompt, turn 3 60%"
    assert multi_turn_verdict(climbing[:1] + [{"turn": 2, "hit_rate": 0.0}]).startswith("does not hold here")
    with pytest.raises(ValueError, match="two turns"):
        multi_turn_verdict(climbing[:1])


def test_each_lever_saves_or_costs_ttft_with_its_flops_and_memory_counted(swept):
    engine, sweep = swept
    budget = engine.config.max_num_batched_tokens
    steps = len(engine.step_records)
    result = ttft_levers(engine, sweep, chunk_tokens=16, num_decoders=2, decoder_prompt_tokens=8, warmup_runs=1)
    # each setting twice (a warm-up, then measured): alone 1 step, chunked 4, batched 2 + 1 (decoders first)
    assert len(engine.step_records) - steps == 2 * (1 + 4 + 3)
    assert not engine.has_unfinished_requests() and engine.config.max_num_batched_tokens == budget
    levers = result["levers"]
    assert list(levers) == ["prefix caching", "chunked prefill", "batching"]
    cfg, kv_per_token = engine.model_config, engine.model_config.kv_bytes_per_token(4)
    alone = prefill_work(cfg, P, 4).total_flops

    cache = levers["prefix caching"]  # the sweep's cold P50 (65 ms) against its 60-token hit (5 ms)
    assert cache["baseline_ttft_s"] == pytest.approx(0.065) and cache["ttft_s"] == pytest.approx(0.005)
    assert cache["ttft_saved_s"] == pytest.approx(0.060)
    assert cache["extra_flops"] == prefill_work(cfg, P, 4, num_cached_tokens=60).total_flops - alone < 0
    assert cache["extra_memory_bytes"] == 60 * kv_per_token

    chunked = levers["chunked prefill"]  # 4 steps of 16 tokens (68 ms) against one of 64 (65 ms)
    assert chunked["baseline_ttft_s"] == pytest.approx(0.065) and chunked["ttft_s"] == pytest.approx(0.068)
    assert chunked["ttft_saved_s"] == pytest.approx(-0.003)
    assert chunked["extra_flops"] == 0 and chunked["extra_memory_bytes"] == 0  # the same causal work, cut up

    batched = levers["batching"]  # one step: the prompt and two decodes (67 ms)
    assert batched["ttft_s"] == pytest.approx(0.067) and batched["ttft_saved_s"] == pytest.approx(-0.002)
    # each decoder: an 8-token prompt and one decoded token in the cache when the prompt arrives
    assert batched["extra_flops"] == step_work(cfg, [(1, 9, 1)] * 2, 4).total_flops > 0
    assert batched["extra_memory_bytes"] == 2 * 9 * kv_per_token

    lines = format_levers(result)
    assert lines[0].split()[0] == "lever" and "+60 ms" in lines[1] and "-3 ms" in lines[2]


def test_levers_refuse_a_chunk_as_long_as_the_prompt(swept):
    engine, sweep = swept
    with pytest.raises(ValueError, match="chunk_tokens"):
        ttft_levers(engine, sweep, chunk_tokens=P)
    with pytest.raises(ValueError, match="num_decoders"):
        ttft_levers(engine, sweep, chunk_tokens=16, num_decoders=0)
    with pytest.raises(ValueError, match="warmup_runs"):
        ttft_levers(engine, sweep, chunk_tokens=16, warmup_runs=-1)


def test_the_sweep_table_reads_an_engines_sweep_with_its_cache_off_point():
    """``format_hit_rate_sweep`` on ``EngineBackend.hit_rate_sweep``'s result: the cold point is the cache
    switched off (not prompts that share nothing), and the hit rates are the engine's own record."""
    from minieng.lab.endpoint_prefix_cache import HIT_RATE_SOURCES, format_hit_rate_sweep

    def point(shared, hit, p50, cache=True):
        ttft = {"count": 4, "p50": p50, "p99": p50 * 1.1, "max": p50 * 1.2}
        return {
            "shared_tokens": shared,
            "hit_rate": hit,
            "uncached_tokens": 64 * (1 - hit),
            "ttft_ms": ttft,
            "cache": cache,
        }

    result = {
        "server": "tiny on cpu",
        "prompt_tokens": 64,
        "cold": point(0, 0.0, 40.0, cache=False),
        "points": [point(32, 0.5, 25.0), point(48, 0.75, 16.0)],
        "hit_rate_source": "engine",
    }
    lines = format_hit_rate_sweep(result)
    assert lines[0].startswith("measured: tiny on cpu") and "max of 4" in lines[1]
    assert lines[2].split()[:3] == ["cache", "off", "0.0%"] and lines[-2].endswith("2.50x")
    assert lines[-1] == f"hit rates: {HIT_RATE_SOURCES['engine']}" and not any("share nothing" in x for x in lines)
