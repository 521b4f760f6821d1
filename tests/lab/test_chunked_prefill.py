"""chunked_experiment: a long prompt arriving while others decode, with chunked prefill off and on.

Runs on CPU over the tiny random Llama. Wall-clock speed is never asserted: where a figure's value
matters, the engine's clock is replaced by a fake one that advances 1 ms per step plus 1 ms per
token the step runs, so every gap and TTFT is known in advance.
"""

from __future__ import annotations

import math

import pytest
from helpers import random_prompts

from minieng import ModelConfig
from minieng.lab.chunked_prefill import (
    budget_for,
    budget_sweep,
    budget_tradeoff_verdict,
    choice_in_words,
    choose_long_prompt,
    decode_first_verdict,
    decode_protection_verdict,
    estimate_sweep_s,
    long_prompt_run,
    measure_setting,
    predict_prefill_s,
    read_result,
    steps_without_decodes,
)

B, P, L = 3, 8, 96  # decoders, their prompt tokens, the long prompt's tokens


def prompts(tiny_llama, long_tokens=L, decoders=B, decoder_tokens=P):
    vocab = tiny_llama[1].model.config.vocab_size
    ids = random_prompts([decoder_tokens] * decoders + [long_tokens], vocab, seed=1)
    return ids[:-1], ids[-1]


def test_chunking_off_stalls_every_decoder_once_for_the_whole_prompt(tiny_engine, tiny_llama, fake_clock):
    engine = fake_clock(tiny_engine(max_num_seqs=4, max_num_batched_tokens=256))
    decoders, long_prompt = prompts(tiny_llama)
    r = long_prompt_run(engine, decoders, long_prompt, None, inject_after_steps=3, tail_steps=2)
    assert not r["chunked"] and r["budget_tokens"] is None and r["num_decoders"] == B
    assert r["baseline_itl_ms"] == pytest.approx(1 + B)  # a decode step: 1 ms + one token per decoder
    # The prompt runs alone (decodes paused), then the decodes: one gap of both steps.
    assert r["worst_itl_ms"] == pytest.approx((1 + L) + (1 + B))
    assert r["ttft_ms"] == pytest.approx(1 + L)
    assert r["prefill_steps"] == 1 and r["steps_without_decodes"] == 1 and r["chunk_step_ms"] == pytest.approx(1 + L)
    assert r["slowed_gaps"] == B  # one per decoder
    assert r["decoder_delay_ms"] == pytest.approx(1 + L)  # each decoder lost exactly the prefill step
    for trace in r["traces"]:
        times = [t for t, _ in trace]
        assert times == sorted(times) and sum(t <= 0 for t in times) == 3
        assert sum(t > 0 for t in times) == 3  # the stalled gap and the tail's two
    assert engine.config.enable_chunked_prefill and engine.config.max_num_batched_tokens == 256  # restored
    assert not engine.has_unfinished_requests() and engine.block_manager.num_used_blocks == 0


def test_chunking_on_bounds_every_gap_by_one_budget_and_never_skips_a_decode(tiny_engine, tiny_llama, fake_clock):
    engine = fake_clock(tiny_engine(max_num_seqs=4, max_num_batched_tokens=256, enable_chunked_prefill=False))
    decoders, long_prompt = prompts(tiny_llama)
    budget = 19  # 16 prompt tokens beside the 3 decodes: 6 chunks
    r = long_prompt_run(engine, decoders, long_prompt, budget, inject_after_steps=2, tail_steps=1)
    chunks = math.ceil(L / (budget - B))
    assert r["chunked"] and r["prefill_steps"] == chunks and r["steps_without_decodes"] == 0
    assert r["worst_itl_ms"] == pytest.approx(1 + budget)  # a full step: the decodes and one chunk
    assert r["chunk_step_ms"] == pytest.approx(1 + budget)
    assert r["ttft_ms"] == pytest.approx(chunks * (1 + B) + L)  # each chunk step also ran the decodes
    assert r["decoder_delay_ms"] == pytest.approx(L)  # the same prompt tokens, spread over the steps
    # Decode-first: every step after the arrival ran all decodes and at most budget - B prompt tokens.
    after = [s for s in r["steps"] if s[0] >= 0]
    assert all(d == B and p <= budget - B for _, _, p, d in after)
    assert not engine.config.enable_chunked_prefill  # restored


def test_reading_off_against_on_and_the_decode_protection_verdict(tiny_engine, tiny_llama, fake_clock):
    engine = fake_clock(tiny_engine(max_num_seqs=4, max_num_batched_tokens=256))
    decoders, long_prompt = prompts(tiny_llama)
    off = long_prompt_run(engine, decoders, long_prompt, None, inject_after_steps=1, tail_steps=0)
    on = long_prompt_run(engine, decoders, long_prompt, 19, inject_after_steps=1, tail_steps=0)
    reading = read_result(off, on)
    assert reading["itl_protection_x"] == pytest.approx((2 + L + B) / 20)
    assert reading["ttft_price_x"] == pytest.approx((6 * (1 + B) + L) / (1 + L))
    assert reading["delay_ratio_x"] == pytest.approx(L / (1 + L))
    assert reading["ttft_extra_ms"] == pytest.approx(6 * (1 + B) - 1)
    assert reading["extra_per_step_ms"] == pytest.approx((6 * (1 + B) - 1) / 6)
    assert reading["overhead_share"] == 0 and not reading["overhead_bound"]
    assert decode_protection_verdict(reading) == "holds"
    # A per-step overhead of 15 ms is most of a 20 ms chunk step: overhead-bound.
    heavy = read_result(off, on, overhead_s=15e-3)
    assert heavy["overhead_share"] == pytest.approx(0.75) and heavy["overhead_bound"]


@pytest.mark.parametrize(
    "protection,price,bound,expected",
    [
        (5.0, 1.2, False, "holds"),
        (
            5.0,
            3.0,
            True,
            "partly: decodes protected, but TTFT costs 3.0x (every chunk step pays the per-step overhead)",
        ),
        (5.0, 3.0, False, "partly: decodes protected, but TTFT costs 3.0x"),
        (
            1.3,
            4.0,
            True,
            (
                "does not hold here: worst gap only 1.3x shorter: a chunk step costs about the whole prefill, "
                "overhead-bound"
            ),
        ),
    ],
)
def test_decode_protection_verdict_in_words(protection, price, bound, expected):
    assert (
        decode_protection_verdict({"itl_protection_x": protection, "ttft_price_x": price, "overhead_bound": bound})
        == expected
    )


def test_decode_first_verdict_counts_the_steps_that_skipped_the_decodes():
    assert (
        decode_first_verdict(1, 0)
        == "holds: no chunked step skipped the decodes; chunking off paused them for 1 step(s)"
    )
    assert decode_first_verdict(1, 2).startswith("does not hold here: 2 chunked step(s)")
    assert decode_first_verdict(0, 0).startswith("does not hold here: chunking off never paused")


def test_budget_tradeoff_verdict_needs_shorter_gaps_and_a_longer_ttft():
    assert budget_tradeoff_verdict(20.0, 80.0, 300.0, 200.0, overhead_bound=False) == (
        "holds: 4.0x shorter gaps for 1.50x the TTFT"
    )
    assert budget_tradeoff_verdict(20.0, 80.0, 300.0, 200.0, overhead_bound=True).endswith(
        "(overhead-bound chunk steps)"
    )
    assert budget_tradeoff_verdict(80.0, 80.0, 300.0, 200.0, overhead_bound=False).startswith(
        "does not hold here: the smallest budget did not shorten the worst gap"
    )
    assert budget_tradeoff_verdict(20.0, 80.0, 200.0, 200.0, overhead_bound=False).startswith(
        "does not hold here: the smallest budget cost the newcomer no TTFT"
    )


def test_the_same_tokens_whatever_the_policy(tiny_engine, tiny_llama):
    """The experiment changes when tokens come, never which: the decoders' outputs agree."""
    decoders, long_prompt = prompts(tiny_llama)
    outs = []
    for budget in (None, 19, 40):
        engine = tiny_engine(max_num_seqs=4, max_num_batched_tokens=256)
        long_prompt_run(engine, decoders, long_prompt, budget, inject_after_steps=2, tail_steps=2)
        outs.append([engine.output(i).token_ids for i in list(engine.requests)[:B]])
    n = min(len(t) for out in outs for t in out)
    assert n >= 5 and [[t[:n] for t in out] for out in outs] == [[t[:n] for t in outs[0]]] * 3


def test_measure_and_sweep_keep_every_run_and_take_medians(tiny_engine, tiny_llama):
    engine = tiny_engine(max_num_seqs=4, max_num_batched_tokens=256)
    decoders, long_prompt = prompts(tiny_llama, long_tokens=32)
    row = measure_setting(
        engine, decoders, long_prompt, 19, repeats=3, warmup_runs=1, inject_after_steps=1, tail_steps=0
    )
    assert row["chunked"] and row["budget_tokens"] == 19 and len(row["runs"]) == 3
    assert row["ttft_ms"] == sorted(r["ttft_ms"] for r in row["runs"])[1]
    seen = []
    sweep = budget_sweep(
        engine, decoders, long_prompt, [40, 19], inject_after_steps=1, tail_steps=0, progress=seen.append
    )
    assert sweep["off"]["budget_tokens"] is None and [r["budget_tokens"] for r in sweep["on"]] == [19, 40]
    assert seen == ["chunked prefill: off", "chunked prefill: budget 19 tokens", "chunked prefill: budget 40 tokens"]
    assert sweep["long_prompt_tokens"] == 32 and sweep["num_decoders"] == B
    # chunking off prefills the prompt in a step of its own; decode-first never skips the decodes
    assert steps_without_decodes(sweep) == (1, 0)
    with pytest.raises(ValueError, match="repeats"):
        measure_setting(engine, decoders, long_prompt, 19, repeats=0)


def test_refuses_what_would_not_measure_the_policy(tiny_engine, tiny_llama):
    decoders, long_prompt = prompts(tiny_llama)
    engine = tiny_engine(max_num_seqs=4, max_num_batched_tokens=256)
    with pytest.raises(ValueError, match="must exceed the 3 decoders"):
        long_prompt_run(engine, decoders, long_prompt, B)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):  # EngineConfig: budget >= max_num_seqs
        long_prompt_run(tiny_engine(max_num_seqs=8, max_num_batched_tokens=256), decoders, long_prompt, 6)
    with pytest.raises(ValueError, match="max_num_seqs >= 4"):
        long_prompt_run(tiny_engine(max_num_seqs=3, max_num_batched_tokens=256), decoders, long_prompt, 19)
    with pytest.raises(ValueError, match="inject_after_steps"):
        long_prompt_run(engine, decoders, long_prompt, 19, inject_after_steps=0)
    engine.add_request(decoders[0])
    with pytest.raises(ValueError, match="idle engine"):
        long_prompt_run(engine, decoders, long_prompt, 19)


def test_decoders_too_long_to_last_the_run(tiny_engine, tiny_llama):
    # Room for 39 output tokens each; the first decoder has about 28 when the newcomer arrives, whose
    # 96 tokens take 24 steps at 4 tokens a step: the decoders run out while it is half prefilled.
    decoders, long_prompt = prompts(tiny_llama, decoder_tokens=70)
    engine = tiny_engine(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=110)
    with pytest.raises(ValueError, match="max_model_len before the run ended"):
        long_prompt_run(engine, decoders, long_prompt, 7, inject_after_steps=2)
    newcomer = engine.requests[list(engine.requests)[-1]].seq
    assert newcomer.num_prompt_tokens == L and newcomer.status.value == "abort" and not newcomer.times.emissions
    assert not engine.has_unfinished_requests() and engine.config.max_num_batched_tokens == 256


def test_a_pool_too_small_preempts_and_is_refused(tiny_engine, tiny_llama):
    decoders, long_prompt = prompts(tiny_llama)
    # 30 blocks of 4 tokens: the long prompt (96) and three growing decoders do not fit.
    engine = tiny_engine(max_num_seqs=4, max_num_batched_tokens=256, num_kv_blocks=30, max_model_len=120)
    with pytest.raises(RuntimeError, match="preempted"):
        long_prompt_run(engine, decoders, long_prompt, 19, inject_after_steps=4, tail_steps=4)


# -- sizing (pure) --------------------------------------------------------------------------------

SMOLLM2 = ModelConfig("llama", 49152, 576, 1536, 30, 9, 3, 64, 1e-5, 8192, True)  # the embedded default's shape
# A 2-core CPU: about 500 tok/s from 64 tokens on, no fixed cost to speak of, 40 ms a decode step.
PROBE = {
    "prefill_points": [[64, 0.128], [128, 0.256], [256, 0.52]],
    "prefill_tok_s": 500.0,
    "overhead_s": 0.0,
    "decode_step_s": 0.04,
    "knee_tokens": 64,
    "knee_reached": True,
    "max_prompt_tokens": 8191,
}
# An H200-like probe: tok/s still growing at the longest prompt, a prefill step's floor of 13 ms against
# a 2.5 ms decode step (CUDA graphs).
GPU_PROBE = {
    "prefill_points": [[64, 0.013], [512, 0.0135], [2048, 0.0145], [8191, 0.021]],
    "overhead_s": 0.013,
    "decode_step_s": 0.0025,
    "knee_tokens": 8191,
    "knee_reached": False,
    "max_prompt_tokens": 8191,
}


def test_the_prefill_prediction_meets_the_probe_and_grows_faster_than_linearly():
    assert predict_prefill_s(PROBE, SMOLLM2, 128) == pytest.approx(0.256, rel=0.02)  # the best point itself
    # Attention's n^2 share: 8,192 tokens cost more than 64 x 128 tokens would.
    assert predict_prefill_s(PROBE, SMOLLM2, 8192) > 1.2 * 64 * predict_prefill_s(PROBE, SMOLLM2, 128)
    assert predict_prefill_s(GPU_PROBE, SMOLLM2, 8191) == pytest.approx(0.021, rel=0.01)


def test_long_prompt_long_enough_to_stall_many_decode_steps():
    c = choose_long_prompt(PROBE, SMOLLM2, stall_steps=32)
    n = c["long_prompt_tokens"]
    assert c["limited_by"] == "stall_steps" and n % 16 == 0 and 512 <= n <= 704
    assert predict_prefill_s(PROBE, SMOLLM2, n) >= 32 * 0.04 > predict_prefill_s(PROBE, SMOLLM2, n - 16)
    assert c["predicted_stall_steps"] == pytest.approx(predict_prefill_s(PROBE, SMOLLM2, n) / 0.04)
    assert c["overhead_share"] == 0
    words = choice_in_words(c, PROBE)
    assert (
        words
        == f"long prompt: {n} tokens, so that its prefill alone lasts about {c['predicted_stall_steps']:.0f} decode steps."
    )


def test_long_prompt_past_the_knee_and_within_the_caps():
    knee = choose_long_prompt(PROBE, SMOLLM2, stall_steps=2)  # 80 ms of prefill: under 4 x the knee
    assert knee["limited_by"] == "knee" and knee["long_prompt_tokens"] == 256
    capped = choose_long_prompt(PROBE, SMOLLM2, stall_steps=32, max_prompt_tokens=500)
    assert capped["long_prompt_tokens"] == 496 and capped["limited_by"] == "max_prompt_tokens"
    timed = choose_long_prompt(PROBE, SMOLLM2, runs=10, stall_steps=32, budget_s=6.0)
    n = timed["long_prompt_tokens"]
    assert timed["limited_by"] == "time_budget" and n % 16 == 0
    assert 10 * predict_prefill_s(PROBE, SMOLLM2, n) <= 6.0 < 10 * predict_prefill_s(PROBE, SMOLLM2, n + 16)


def test_a_launch_bound_device_takes_the_longest_prompt_and_says_the_stall_is_overhead():
    c = choose_long_prompt(GPU_PROBE, SMOLLM2, stall_steps=32)
    assert c["long_prompt_tokens"] == 8176 and c["limited_by"] == "max_prompt_tokens"
    assert c["overhead_share"] == pytest.approx(0.013 / predict_prefill_s(GPU_PROBE, SMOLLM2, 8176))
    assert c["overhead_share"] > 0.5 and c["predicted_stall_steps"] < 32  # the target was out of reach
    words = choice_in_words(c, GPU_PROBE)
    assert "the longest prompt the engine takes" in words and "launch-bound" in words
    assert f"About {c['overhead_share']:.0%} of that prefill is the step's fixed cost" in words


def test_sizing_refuses_nonsense():
    with pytest.raises(ValueError):
        choose_long_prompt(PROBE, SMOLLM2, stall_steps=0)
    with pytest.raises(ValueError):
        choose_long_prompt(PROBE, SMOLLM2, max_prompt_tokens=8)
    with pytest.raises(ValueError):
        budget_for(640, 4, 0)


def test_budget_for_cuts_the_prompt_into_about_that_many_chunks():
    assert budget_for(640, 4, 8) == 96  # 4 decodes + 80 prompt tokens, rounded up to 16
    for chunks in (2, 4, 8, 16, 32):
        b = budget_for(640, 4, chunks)
        assert b % 16 == 0 and math.ceil(640 / (b - 4)) <= chunks


def test_estimate_counts_every_chunk_step():
    probe = dict(PROBE, overhead_s=0.01)
    prefill = predict_prefill_s(probe, SMOLLM2, 640)
    off = estimate_sweep_s(probe, SMOLLM2, 640, [None], 4, 64, inject_after_steps=8, tail_steps=8)
    assert off == pytest.approx(prefill + 0.01 + 256 / 500 + 17 * 0.04, rel=0.01)  # best rate: 500 tok/s
    on = estimate_sweep_s(probe, SMOLLM2, 640, [84], 4, 64, inject_after_steps=8, tail_steps=8, runs_per_setting=2)
    assert on == pytest.approx(2 * (prefill + 8 * 0.01 + 256 / 500 + 24 * 0.04), rel=0.01)  # 8 chunks of 80 tokens
