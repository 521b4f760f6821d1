"""Greedy fp32 output does not depend on how the engine batches a request.

The same request must produce the same tokens alone, among 16 other requests, with chunked
prefill off or at any token budget, and when it is preempted and recomputed. Batching changes
the shapes of the matrix products, so fp32 results may differ in the last bits; the only
acceptable divergence is therefore at an exact near-tie, which ``assert_same_or_near_tie`` checks
against transformers' logits instead of loosening the comparison.

Each scenario runs on a tiny random Llama (fast) and on the embedded default model (real_model).
"""

from __future__ import annotations

import pytest
from helpers import (
    REAL_TEXTS,
    check_all,
    check_budget,
    chat_ids,
    hf_next_logits,
    make_engine,
    num_split_prompts,
    random_prompts,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minieng import EngineConfig, LLMEngine, SamplingParams

TINY_OUT = 24
VOCAB_TINY = 300
REAL_OUT = 24
GREEDY_TINY = SamplingParams(temperature=0, max_tokens=TINY_OUT, ignore_eos=True)
GREEDY_REAL = SamplingParams(temperature=0, max_tokens=REAL_OUT, ignore_eos=True)


# -- tiny random Llama ------------------------------------------------------------------------------

TINY_LENGTHS = [3, 60, 17, 1, 44, 9, 31, 25, 52, 5, 38, 12, 21, 47, 2, 29, 15]


@pytest.fixture(scope="module")
def tiny_setup(tiny_llama):
    hf, loaded = tiny_llama
    prompts = random_prompts(TINY_LENGTHS, loaded.model.config.vocab_size, seed=11)
    engine = make_engine(loaded)
    alone = {tuple(p): engine.generate([p], GREEDY_TINY)[0].token_ids for p in prompts}
    return hf, loaded, prompts, alone


def test_tiny_alone_vs_among_sixteen(tiny_setup):
    hf, loaded, prompts, alone = tiny_setup
    engine = make_engine(loaded)
    outputs = engine.generate(prompts, GREEDY_TINY)
    assert max(len(r.chunks) for r in engine.step_records) >= 10, "the requests never ran together"
    check_all(prompts, [alone[tuple(p)] for p in prompts], outputs, hf_next_logits(hf), "tiny batch of 17")


@pytest.mark.parametrize("chunked,budget", [(False, 64), (True, 16), (True, 33), (True, 64), (True, 512)])
def test_tiny_chunked_prefill_invariance(tiny_setup, chunked, budget):
    hf, loaded, prompts, alone = tiny_setup
    engine = make_engine(
        loaded, enable_chunked_prefill=chunked, max_num_batched_tokens=budget, max_num_seqs=min(16, budget)
    )
    outputs = engine.generate(prompts, GREEDY_TINY)
    check_budget(engine)
    if chunked and budget < max(TINY_LENGTHS):
        assert num_split_prompts(engine) > 0, "no prompt was split into chunks"
    check_all(
        prompts, [alone[tuple(p)] for p in prompts], outputs, hf_next_logits(hf), f"chunked={chunked} budget={budget}"
    )


def test_tiny_preemption_invariance(tiny_setup):
    hf, loaded, prompts, alone = tiny_setup
    # 12 blocks of 4 tokens: one sequence of max_model_len 48 fits, 17 do not.
    chosen = [p for p in prompts if len(p) + TINY_OUT <= 48]
    engine = make_engine(loaded, num_kv_blocks=12, max_model_len=48)
    outputs = engine.generate(chosen, GREEDY_TINY)
    assert sum(r.num_preempted for r in engine.step_records) > 0, "the tiny pool never preempted"
    assert any(o.times.num_preemptions for o in outputs)
    assert engine.block_manager.num_free_blocks == 12
    check_all(chosen, [alone[tuple(p)] for p in chosen], outputs, hf_next_logits(hf), "preemption")


def test_tiny_preempted_requests_keep_every_token_once(tiny_llama):
    """Preemption recomputes a request's tokens; it must not lose or redo any. Under greedy
    decoding a dropped newest token would be regenerated identically, so outputs alone cannot
    tell; what does: the streamed deltas concatenate to the final text (a redone token streams
    twice), the emissions count exactly the tokens, and a seeded sampled request gives, token for
    token, its unpreempted output (its draws are keyed by output position)."""
    from helpers import bos_tokenizer

    from minieng.model.loader import LoadedModel

    loaded = LoadedModel(tiny_llama[1].model, bos_tokenizer(), tiny_llama[1].hf_config, set(), None)
    prompts = random_prompts([3, 17, 9, 25, 5, 11], VOCAB_TINY, seed=13)
    params = [
        SamplingParams(temperature=0.9 if i % 2 else 0, seed=i, max_tokens=20, ignore_eos=True)
        for i in range(len(prompts))
    ]
    alone = [make_engine(loaded).generate([p], sp)[0] for p, sp in zip(prompts, params)]
    # 12 blocks of 4 tokens: one sequence of max_model_len 48 fits, six do not.
    engine = make_engine(loaded, num_kv_blocks=12, max_model_len=48)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    deltas = {rid: [] for rid in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas[out.request_id].append(out.delta)
    outs = [engine.output(rid) for rid in ids]
    preempted = [i for i, o in enumerate(outs) if o.times.num_preemptions]
    assert any(params[i].temperature > 0 for i in preempted), "no sampled request was preempted"
    assert any(params[i].temperature == 0 for i in preempted), "no greedy request was preempted"
    for i, (out, ref) in enumerate(zip(outs, alone)):
        streamed = "".join(deltas[out.request_id])
        decoded = loaded.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        assert streamed == out.text == decoded, f"request {i}: the stream repeats or loses text"
        assert sum(n for _, n in out.times.emissions) == len(out.token_ids) == 20, f"request {i}: emissions"
        assert out.text == ref.text and out.token_ids == ref.token_ids, f"request {i}: tokens changed"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    max_num_seqs=st.integers(1, 8),
    extra_budget=st.integers(0, 64),
    chunked=st.booleans(),
    spare_blocks=st.integers(0, 40),
    picks=st.lists(st.integers(0, len(TINY_LENGTHS) - 1), min_size=1, max_size=8),
)
def test_tiny_any_schedule_gives_the_alone_output(
    tiny_setup, block_size, max_num_seqs, extra_budget, chunked, spare_blocks, picks
):
    hf, loaded, prompts, alone = tiny_setup
    max_model_len = 96
    num_blocks = -(-max_model_len // block_size) + spare_blocks
    engine = make_engine(
        loaded,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_seqs + extra_budget,
        enable_chunked_prefill=chunked,
        num_kv_blocks=num_blocks,
        max_model_len=max_model_len,
    )
    chosen = [prompts[i] for i in picks]
    outputs = engine.generate(chosen, GREEDY_TINY)
    check_budget(engine)
    assert engine.block_manager.num_free_blocks == num_blocks
    check_all(
        chosen,
        [alone[tuple(p)] for p in chosen],
        outputs,
        hf_next_logits(hf),
        f"block_size={block_size} seqs={max_num_seqs} budget={max_num_seqs + extra_budget} "
        f"chunked={chunked} blocks={num_blocks}",
    )


# -- the embedded default model ---------------------------------------------------------------------


def real_engine_for(loaded, **overrides) -> LLMEngine:
    fields = dict(device="cpu", max_model_len=512, num_kv_blocks=64)
    fields.update(overrides)
    return LLMEngine(EngineConfig(**fields), loaded=loaded)


@pytest.fixture(scope="module")
def real_setup(default_model, hf_default):
    prompts = [chat_ids(default_model.tokenizer, t) for t in REAL_TEXTS]
    engine = real_engine_for(default_model)
    alone = [engine.generate([p], GREEDY_REAL)[0].token_ids for p in prompts]
    return prompts, alone, hf_next_logits(hf_default)


@pytest.mark.real_model
def test_real_alone_vs_among_sixteen(default_model, real_setup):
    prompts, alone, next_logits = real_setup
    assert len({len(p) for p in prompts}) >= 10, "prompt lengths should differ"
    engine = real_engine_for(default_model)
    outputs = engine.generate(prompts, GREEDY_REAL)
    assert max(len(r.chunks) for r in engine.step_records) == len(prompts), "the requests never ran together"
    check_all(prompts, alone, outputs, next_logits, "real batch of 17")


@pytest.mark.real_model
@pytest.mark.parametrize("chunked,budget", [(False, 512), (True, 16), (True, 33), (True, 64), (True, 512)])
def test_real_chunked_prefill_invariance(default_model, real_setup, chunked, budget):
    prompts, alone, next_logits = real_setup
    chosen = [4, 6, 8, 11, 14, 0]  # the longest prompts, and a short one
    engine = real_engine_for(
        default_model, enable_chunked_prefill=chunked, max_num_batched_tokens=budget, max_num_seqs=min(16, budget)
    )
    outputs = engine.generate([prompts[i] for i in chosen], GREEDY_REAL)
    check_budget(engine)
    if chunked and budget < max(len(prompts[i]) for i in chosen):
        assert num_split_prompts(engine) > 0, "no prompt was split into chunks"
    check_all(
        [prompts[i] for i in chosen],
        [alone[i] for i in chosen],
        outputs,
        next_logits,
        f"chunked={chunked} budget={budget}",
    )


@pytest.mark.real_model
def test_real_preemption_invariance(default_model, real_setup):
    prompts, alone, next_logits = real_setup
    max_model_len, num_blocks = 128, 8  # 8 blocks of 16 tokens: exactly one full-length sequence
    chosen = [i for i, p in enumerate(prompts) if len(p) + REAL_OUT <= max_model_len][:8]
    assert len(chosen) == 8
    engine = real_engine_for(default_model, max_model_len=max_model_len, num_kv_blocks=num_blocks)
    outputs = engine.generate([prompts[i] for i in chosen], GREEDY_REAL)
    assert sum(r.num_preempted for r in engine.step_records) > 0, "the tiny pool never preempted"
    assert any(o.times.num_preemptions for o in outputs)
    assert engine.block_manager.num_free_blocks == num_blocks
    check_all([prompts[i] for i in chosen], [alone[i] for i in chosen], outputs, next_logits, "preemption")
