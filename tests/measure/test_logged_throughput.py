"""vLLM's logged throughputs (S1, part b) from hand-built records: the interval arithmetic of
``LoggingStatLogger``, a prefix-cache hit counted in the prompt throughput, generation summed over the
running requests, the line's wording, and a real run's records replayed."""

from __future__ import annotations

import math

import pytest
from helpers import random_prompts

from minieng import SamplingParams
from minieng.core.outputs import RequestOutput, StepRecord
from minieng.core.sequence import RequestTimes
from minieng.measure.logged_throughput import StatLogger, emission_tokens, logged_intervals


def step(start_s, duration_s, prefill_tokens, running, waiting, used_blocks, lookups=()):
    return StepRecord(
        start_s=start_s,
        duration_s=duration_s,
        num_prefill_tokens=prefill_tokens,
        num_prefill_seqs=int(prefill_tokens > 0),
        num_decode_seqs=running - int(prefill_tokens > 0),
        num_preempted=0,
        num_running=running,
        num_waiting=waiting,
        num_used_blocks=used_blocks,
        prefix_cache_lookups=list(lookups),
    )


def output(request_id, prompt_tokens, emissions, cached=0):
    tokens = [7] * sum(n for _, n in emissions)
    times = RequestTimes(arrival_s=0.0, emissions=list(emissions))
    return RequestOutput(request_id, [1] * prompt_tokens, tokens, [], "", "", True, "length", times, cached)


# Request A: a 100-token prompt of which the prefix cache holds 96; prefilled in 0..1 s (4 tokens
# computed), then one token a step. Request B: 50 tokens, no hit, admitted at 11 s beside A.
STEPS = [
    step(0, 1, 4, running=1, waiting=1, used_blocks=7, lookups=[(100, 96)]),
    step(1, 1, 0, running=1, waiting=1, used_blocks=7),
    step(2, 1, 0, running=1, waiting=1, used_blocks=7),
    step(11, 1, 50, running=2, waiting=0, used_blocks=11, lookups=[(50, 0)]),
    step(12, 1, 0, running=2, waiting=0, used_blocks=11),
]
A = output("a", 100, [(1.0, 1), (2.0, 1), (3.0, 1), (12.0, 1), (13.0, 1)], cached=96)
B = output("b", 50, [(12.0, 1), (13.0, 1)])


def test_s1_interval_arithmetic_counts_whole_prompts_and_every_running_request():
    first, second = logged_intervals(STEPS, [A, B], interval_s=10.0, num_blocks=100)
    # (0, 10]: A's prefill completed: its whole prompt counts, the 96 cached tokens included.
    assert (first.end_s, first.interval_s) == (10.0, 10.0)
    assert first.num_prompt_tokens == 100 and first.num_computed_prompt_tokens == 4
    assert first.prompt_throughput_tok_s == pytest.approx(10.0)
    assert first.num_generation_tokens == 3 and first.generation_throughput_tok_s == pytest.approx(0.3)
    assert first.prompt_to_generation_ratio == pytest.approx(100 / 3)
    assert (first.num_running_reqs, first.num_waiting_reqs, first.kv_cache_usage) == (1, 1, 0.07)
    assert first.prefix_cache_hit_rate == pytest.approx(0.96)
    # (10, 13]: the last log at the last event; B's prompt, and the tokens of A and B summed.
    assert (second.end_s, second.interval_s) == (13.0, 3.0)
    assert second.num_prompt_tokens == 50 and second.num_generation_tokens == 2 + 2
    assert second.generation_throughput_tok_s == pytest.approx(4 / 3)
    assert (second.num_running_reqs, second.num_waiting_reqs, second.kv_cache_usage) == (2, 0, 0.11)
    # The hit rate is vLLM's window of recent requests, not this interval's alone.
    assert second.prefix_cache_hit_rate == pytest.approx(96 / 150)


def test_s1_the_line_is_vllms_wording():
    first = logged_intervals(STEPS, [A, B], interval_s=10.0, num_blocks=100)[0]
    assert first.line() == (
        "Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 0.3 tokens/s, "
        "Running: 1 reqs, Waiting: 1 reqs, GPU KV cache usage: 7.0%, Prefix cache hit rate: 96.0%"
    )
    d = first.to_dict()
    assert d["prompt_throughput_tok_s"] == pytest.approx(10.0) and d["prompt_to_generation_ratio"] == pytest.approx(
        100 / 3
    )


def test_one_interval_over_the_run_is_the_loads_token_mix():
    (whole,) = logged_intervals(STEPS, [A, B], interval_s=math.inf)
    assert (whole.interval_s, whole.num_prompt_tokens, whole.num_generation_tokens) == (13.0, 150, 7)
    assert whole.prompt_to_generation_ratio == pytest.approx(150 / 7)
    assert whole.kv_cache_usage is None and "GPU KV cache usage: 0.0%" in whole.line()


def test_quiet_intervals_are_logged_with_zero_and_the_window_forgets_old_requests():
    lines = logged_intervals(STEPS, [A, B], interval_s=4.0, max_recent_requests=1)
    assert [x.end_s for x in lines] == [4.0, 8.0, 12.0, 13.0]
    assert lines[1].num_prompt_tokens == lines[1].num_generation_tokens == 0
    assert lines[1].prompt_to_generation_ratio is None
    assert lines[1].num_running_reqs == 1  # the last step's snapshot stands until the next step
    assert lines[2].num_prompt_tokens == 50 and lines[2].num_generation_tokens == 2  # the 12 s tokens, at 12 s
    assert lines[2].prefix_cache_hit_rate == 0.0  # one request kept: B, which hit nothing


def test_emission_tokens_brings_the_prompt_with_the_first_emission_only():
    assert emission_tokens(A, 0) == (1.0, 100, 1)
    assert emission_tokens(A, 1) == (2.0, 0, 1)
    assert emission_tokens(B) == (13.0, 0, 1)
    assert emission_tokens(output("c", 9, [(5.0, 3)])) == (5.0, 9, 3)  # -1 is the first of one


def test_the_online_logger_counts_what_the_replay_counts():
    logger = StatLogger(start_s=0.0, num_blocks=100)
    assert logger.idle
    grown = output("a", 100, [], cached=96)
    for record, emitted in zip(STEPS[:3], [(1.0, 1), (2.0, 1), (3.0, 1)]):
        grown.times.emissions.append(emitted)
        logger.record(record, [grown])
    stats = logger.log(10.0)
    assert (stats.num_prompt_tokens, stats.num_generation_tokens, stats.prefix_cache_hit_rate) == (100, 3, 0.96)
    assert not logger.idle
    assert logger.log(20.0).num_prompt_tokens == 0 and not logger.idle  # the line before had tokens
    assert logger.log(30.0).interval_s == 10.0 and logger.idle  # two quiet lines: vLLM logs at DEBUG


def test_refusals():
    with pytest.raises(ValueError, match="interval_s"):
        logged_intervals(STEPS, [A], interval_s=0)
    with pytest.raises(ValueError, match="outside"):
        logged_intervals(STEPS, [A], end_s=5.0)
    with pytest.raises(ValueError, match="num_blocks"):
        StatLogger(0.0, num_blocks=0)
    assert logged_intervals([], []) == []


def test_a_real_runs_records_replay_into_prompts_hits_and_tokens(tiny_engine):
    engine = tiny_engine(max_num_seqs=4)
    shared = random_prompts([16], 300, seed=1)[0]  # four blocks of 4 tokens
    prompts = [shared + p for p in random_prompts([5, 6, 7], 300, seed=2)]
    engine.generate(prompts[:1], SamplingParams.fixed_length(2))  # leaves the shared blocks cached
    first = len(engine.step_records)
    outs = engine.generate(prompts, SamplingParams.fixed_length(3))
    (whole,) = logged_intervals(engine.step_records[first:], outs, math.inf, num_blocks=engine.block_manager.num_blocks)
    assert whole.num_prompt_tokens == sum(len(p) for p in prompts)  # hits included
    assert whole.num_computed_prompt_tokens == sum(len(p) for p in prompts) - sum(o.num_cached_tokens for o in outs)
    assert whole.num_generation_tokens == 3 * len(prompts)
    assert [o.num_cached_tokens for o in outs] == [20, 16, 16]  # the first prompt's last block too
    assert whole.prefix_cache_hit_rate == pytest.approx(52 / sum(len(p) for p in prompts))
    assert whole.num_running_reqs == 0 and whole.kv_cache_usage == 0.0
