"""Disaggregated prefill and decode: the KV hand-off between pools, and the model's clocks.

The hand-off must be invisible in the outputs: a request prefilled by one engine and decoded by
another gives the tokens a single colocated engine gives (greedy fp32; the batches differ, so an
exact near-tie is the only divergence accepted, ``assert_same_or_near_tie``), and leaves both
pools' accounting exact (``BlockManager.check_invariants``, every block free at the end, the
prefix caches still serving hits). The model's timestamps are checked as arithmetic on what was
recorded (a transfer starts when the first token is out, lasts bytes / bandwidth, and the decode
engine starts no earlier than its end), never against how fast this machine is.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import time
import weakref

import pytest
import torch
from helpers import assert_same_or_near_tie, hf_next_logits, make_engine, random_prompts

from minieng import LLMEngine, SamplingParams
from minieng.wings.parallel.kv_transfer import (
    admit_prefilled,
    can_admit,
    export_prefilled,
    is_prefilled,
    read_blocks,
    write_blocks,
)
from minieng.lab.disagg_simulation import (
    COLOCATED,
    DECODE,
    PREFILL,
    VirtualClock,
    colocated_replay,
    disaggregated_replay,
    interleave,
)
from minieng.lab.disaggregation import (
    compare_disaggregation,
    comparison_pool,
    estimate_comparison_s,
    format_comparison,
    run_metrics,
    simulated_runs,
)
from minieng.measure.metrics import SLO, serving_metrics
from minieng.measure.workloads import RequestSpec, poisson_workload
from minieng.viz import request_phases

VOCAB = 300  # the tiny Llama's
BLOCK = 4  # make_engine's block_size


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def alone(replay):
    """A replay driven to its ``ClusterRun`` on its own."""
    return interleave([replay])[0]


def check_pool(engine) -> None:
    engine.block_manager.check_invariants([r.seq for r in engine.requests.values()])


def all_free(engine) -> bool:
    return engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def prefill_all(engine, ids: list[str]) -> None:
    """Step ``engine`` until every request of ``ids`` has its prompt computed and its first token."""
    while not all(is_prefilled(engine.requests[i].seq) for i in ids):
        assert engine.step() or engine.has_unfinished_requests()
        check_pool(engine)


def decode_all(engine) -> None:
    while engine.has_unfinished_requests():
        engine.step()
        check_pool(engine)


# -- the hand-off itself ---------------------------------------------------------------------------

# Prompt lengths: shorter than a block, exactly one and two blocks, and ragged.
LENGTHS = [3, 4, 8, 11, 17]


def test_handoff_gives_the_colocated_outputs_and_frees_every_block(tiny_llama):
    hf, loaded = tiny_llama
    prompts = random_prompts(LENGTHS, VOCAB, seed=5)
    reference = make_engine(loaded).generate(prompts, greedy(9))
    prefill, decode = make_engine(loaded), make_engine(loaded)
    ids = [prefill.add_request(p, greedy(9), request_id=f"r{i}") for i, p in enumerate(prompts)]
    prefill_all(prefill, ids)
    for rid, prompt in zip(ids, prompts):
        used_before = prefill.block_manager.num_used_blocks
        handoff = export_prefilled(prefill, rid)
        # The source forgets the request and takes its blocks back at once.
        assert rid not in prefill.requests
        assert prefill.block_manager.num_used_blocks == used_before - math.ceil(len(prompt) / BLOCK)
        assert handoff.num_computed_tokens == len(prompt) and handoff.k.shape[1] == math.ceil(len(prompt) / BLOCK)
        assert handoff.kv_bytes == len(prompt) * loaded.model.config.kv_bytes_per_token(4)
        check_pool(prefill)
        admit_prefilled(decode, handoff)
        seq = decode.requests[rid].seq
        assert seq.num_computed_tokens == len(prompt) and len(seq.block_table) == math.ceil(len(prompt) / BLOCK)
        check_pool(decode)
    assert all_free(prefill) and not prefill.has_unfinished_requests()
    decode_all(decode)
    assert all_free(decode)
    for rid, prompt, ref in zip(ids, prompts, reference):
        out = decode.output(rid)
        assert out.finished and len(out.token_ids) == 9
        assert_same_or_near_tie(
            ref.token_ids, out.token_ids, prompt, hf_next_logits(hf), what=f"prompt of {len(prompt)}"
        )
        # One emission per token, the first from the prefill engine, in time order.
        assert [n for _, n in out.times.emissions] == [1] * 9


def test_seeded_sampling_continues_on_the_decode_engine(tiny_llama):
    """The request's generator travels with it: keyed by output position, the draws are the
    colocated engine's."""
    _, loaded = tiny_llama
    prompts = random_prompts([6, 13], VOCAB, seed=8)
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=s, max_tokens=7, ignore_eos=True) for s in (1, 2)]
    reference = make_engine(loaded).generate(prompts, params)
    prefill, decode = make_engine(loaded), make_engine(loaded)
    ids = [prefill.add_request(p, sp) for p, sp in zip(prompts, params)]
    prefill_all(prefill, ids)
    for rid in ids:
        admit_prefilled(decode, export_prefilled(prefill, rid))
    decode_all(decode)
    assert [decode.output(r).token_ids for r in ids] == [r.token_ids for r in reference]


def test_prefix_caches_stay_right_on_both_sides(tiny_llama):
    """Two prompts sharing three full blocks: the decode engine shares those blocks between them
    (ref count 2, not copied twice), and the prefill engine still serves the prefix afterwards."""
    hf, loaded = tiny_llama
    shared = random_prompts([3 * BLOCK], VOCAB, seed=1)[0]
    tails = random_prompts([3, 6, 5], VOCAB, seed=2)
    prompts = [shared + t for t in tails]
    reference = make_engine(loaded).generate(prompts, greedy(6))
    prefill, decode = make_engine(loaded), make_engine(loaded)
    a = prefill.add_request(prompts[0], greedy(6), request_id="a")
    prefill_all(prefill, [a])
    admit_prefilled(decode, export_prefilled(prefill, a))
    b = prefill.add_request(prompts[1], greedy(6), request_id="b")
    prefill_all(prefill, [b])
    assert prefill.requests[b].seq.num_cached_tokens == 3 * BLOCK  # the source's cache survived the export
    handoff = export_prefilled(prefill, b)
    assert can_admit(decode, handoff)
    used = decode.block_manager.num_used_blocks
    admit_prefilled(decode, handoff)
    seq_a, seq_b = decode.requests[a].seq, decode.requests[b].seq
    assert seq_a.block_table[:3] == seq_b.block_table[:3]
    assert all(decode.block_manager.ref_counts[blk] == 2 for blk in seq_b.block_table[:3])
    assert decode.block_manager.num_used_blocks == used + len(seq_b.block_table) - 3
    check_pool(decode)
    decode_all(decode)
    assert all_free(decode)
    # A third prompt with the prefix, colocated on the prefill engine after both hand-offs.
    c = prefill.generate([prompts[2]], greedy(6))[0]
    assert c.num_cached_tokens == 3 * BLOCK
    check_pool(prefill)
    assert all_free(prefill)
    for prompt, ref, out in zip(prompts, reference, [decode.output(a), decode.output(b), c]):
        assert_same_or_near_tie(ref.token_ids, out.token_ids, prompt, hf_next_logits(hf), what="shared prefix")


def test_export_refuses_what_is_not_a_finished_prefill(tiny_llama):
    _, loaded = tiny_llama
    engine = make_engine(loaded, max_num_batched_tokens=8, max_num_seqs=4)
    long_id = engine.add_request(random_prompts([20], VOCAB, seed=3)[0], greedy(4))
    with pytest.raises(ValueError, match="not a finished prefill"):
        export_prefilled(engine, long_id)  # still waiting
    engine.step()  # 8 of its 20 prompt tokens
    with pytest.raises(ValueError, match="not a finished prefill"):
        export_prefilled(engine, long_id)
    with pytest.raises(KeyError):
        export_prefilled(engine, "no-such-request")
    check_pool(engine)


def test_admit_refuses_incompatible_or_full_engines(tiny_llama):
    _, loaded = tiny_llama
    prefill = make_engine(loaded)
    ids = [prefill.add_request(p, greedy(3)) for p in random_prompts([10, 10], VOCAB, seed=4)]
    prefill_all(prefill, ids)
    first, second = (export_prefilled(prefill, i) for i in ids)
    with pytest.raises(ValueError, match="block_size"):
        admit_prefilled(make_engine(loaded, block_size=8), first)
    full = make_engine(loaded, max_num_seqs=1, max_num_batched_tokens=8)
    admit_prefilled(full, first)
    assert not can_admit(full, second)  # max_num_seqs reached
    with pytest.raises(RuntimeError, match="no room"):
        admit_prefilled(full, second)
    check_pool(full)
    with pytest.raises(ValueError, match="already in use"):
        admit_prefilled(full, first)
    spec = make_engine(loaded, speculative_method="ngram", num_speculative_tokens=2)
    with pytest.raises(ValueError, match="speculative"):
        admit_prefilled(spec, second)


def test_kv_cache_blocks_round_trip(tiny_llama):
    _, loaded = tiny_llama
    engine = make_engine(loaded, num_kv_blocks=8, max_model_len=32)
    cache = engine.kv_cache
    cache.k.normal_()
    cache.v.normal_()
    k, v = read_blocks(cache, [5, 2])
    assert k.shape == (cache.k.shape[0], 2, *cache.k.shape[2:])
    assert torch.equal(k[:, 0], cache.k[:, 5]) and torch.equal(v[:, 1], cache.v[:, 2])
    write_blocks(cache, [0, 7], k, v)
    assert torch.equal(cache.k[:, 0], cache.k[:, 5]) and torch.equal(cache.v[:, 7], cache.v[:, 2])
    k[:] = 0  # a copy, not a view
    assert not torch.equal(cache.k[:, 5], k[:, 0])
    with pytest.raises(ValueError, match="this pool takes"):
        write_blocks(cache, [1], k, v)


# -- the model -------------------------------------------------------------------------------------


def test_virtual_clock_starts_exactly_where_set_and_runs_with_real_time():
    clock = VirtualClock()
    clock.set(12.5)
    first = clock()
    assert first == 12.5
    later = clock()
    assert later >= first
    clock.set(3.0)
    assert clock() == 3.0


def assert_each_engine_is_one_device(run) -> None:
    """An engine's steps never overlap on its own clock."""
    for steps in run.steps:
        for a, b in itertools.pairwise(steps):
            assert b.start_s >= a.start_s + a.duration_s


def test_one_request_pays_the_transfer_exactly_once(tiny_llama):
    """A constructed case: one request, idle engines, a slow link. The transfer starts at the first
    token, lasts kv_bytes / bandwidth, and the decode engine's first step starts at its end."""
    _, loaded = tiny_llama
    prefill, decode = make_engine(loaded), make_engine(loaded)
    spec = RequestSpec(0.25, 10, 5)
    bandwidth_gbps = 1e-6  # 1 kB/s: the transfer is seconds long, whatever the machine's speed
    run = alone(
        disaggregated_replay(
            [prefill], [decode], [spec], random_prompts([10], VOCAB, seed=6), link_bandwidth_gbps=bandwidth_gbps
        )
    )
    out, tr = run.outputs[0], run.transfers["req-0"]
    (p_step,), d_steps = run.steps  # the prefill engine ran one step
    times = [t for t, _ in out.times.emissions]
    assert out.times.arrival_s == 0.25 and p_step.start_s == 0.25  # an idle engine starts at the arrival
    assert times[0] == pytest.approx(p_step.start_s + p_step.duration_s, abs=1e-12)
    assert tr.ready_s == times[0] and tr.start_s == tr.ready_s  # the link was free
    assert tr.kv_bytes == 10 * loaded.model.config.kv_bytes_per_token(4)
    assert tr.end_s - tr.start_s == pytest.approx(tr.kv_bytes / (bandwidth_gbps * 1e9), rel=1e-12)
    assert tr.admitted_s == tr.end_s and d_steps[0].start_s == tr.end_s  # added once: no second wait
    assert len(d_steps) == 4 and times[1] == pytest.approx(d_steps[0].start_s + d_steps[0].duration_s, abs=1e-12)
    assert times[1] - times[0] >= tr.end_s - tr.start_s
    # The first token's time does not depend on the link; every later gap is a decode step alone.
    for step, t in zip(d_steps, times[1:]):
        assert t == pytest.approx(step.start_s + step.duration_s, abs=1e-12)
    assert run.timeline()[0]["transfer_end_s"] == tr.end_s and run.num_devices == 2
    assert all_free(prefill) and all_free(decode)


@pytest.fixture(scope="module")
def workload():
    specs = poisson_workload(10, 40.0, 9, 6, seed=3)
    specs = [RequestSpec(s.arrival_s, 5 + 3 * (i % 4), 2 + i % 5) for i, s in enumerate(specs)]  # mixed sizes
    return specs, random_prompts([s.prompt_tokens for s in specs], VOCAB, seed=12)


def test_disaggregated_replay_matches_colocated_and_keeps_causality(tiny_llama, workload):
    hf, loaded = tiny_llama
    specs, prompts = workload
    colocated_engine = make_engine(loaded)
    colocated = alone(colocated_replay([colocated_engine], specs, prompts))
    engines = [make_engine(loaded) for _ in range(4)]
    bandwidth_gbps = 1e-4
    run = alone(disaggregated_replay(engines[:2], engines[2:], specs, prompts, link_bandwidth_gbps=bandwidth_gbps))
    assert run.roles == [PREFILL, PREFILL, DECODE, DECODE]
    assert all(all_free(e) and not e.has_unfinished_requests() for e in engines + [colocated_engine])
    for spec, prompt, ref, out in zip(specs, prompts, colocated.outputs, run.outputs):
        assert out.prompt_token_ids == prompt and out.finish_reason == "length"
        assert len(out.token_ids) == spec.output_tokens
        assert_same_or_near_tie(ref.token_ids, out.token_ids, prompt, hf_next_logits(hf), what="disaggregated")
        assert out.times.arrival_s == spec.arrival_s and out.times.first_scheduled_s >= spec.arrival_s
    # Every request with a second token was handed off, and round-robin used every engine.
    assert set(run.transfers) == {o.request_id for o in run.outputs if len(o.token_ids) > 1}
    assert {t.source for t in run.transfers.values()} == {0, 1}
    assert {t.destination for t in run.transfers.values()} == {2, 3}
    for out in run.outputs:
        tr = run.transfers.get(out.request_id)
        if tr is None:
            continue
        times = [t for t, _ in out.times.emissions]
        assert tr.ready_s == times[0] <= tr.start_s
        assert tr.end_s - tr.start_s == pytest.approx(tr.kv_bytes / (bandwidth_gbps * 1e9), rel=1e-12)
        assert tr.end_s <= tr.admitted_s < times[1]  # decode never starts before prefill + transfer
    for source in (0, 1):  # one FIFO link per prefill engine: its transfers never overlap
        link = sorted((t for t in run.transfers.values() if t.source == source), key=lambda t: t.start_s)
        assert all(b.start_s >= a.end_s for a, b in itertools.pairwise(link))
    assert_each_engine_is_one_device(run)
    assert_each_engine_is_one_device(colocated)
    # A decode engine never runs a prefill chunk (no preemption here), a prefill engine no decode.
    assert all(s.num_prefill_tokens == 0 for steps in run.steps[2:] for s in steps)
    assert all(s.num_decode_seqs == 0 for steps in run.steps[:2] for s in steps)
    # The engines are back on the wall clock.
    assert all(e.clock is time.perf_counter for e in engines)


def test_replay_refuses_busy_engines_and_a_pool_too_small(tiny_llama):
    _, loaded = tiny_llama
    busy = make_engine(loaded)
    busy.add_request([1, 2, 3], greedy(2))
    with pytest.raises(ValueError, match="in flight"):
        alone(colocated_replay([busy], [RequestSpec(0.0, 3, 2)], [[4, 5, 6]]))
    with pytest.raises(ValueError, match="link_bandwidth_gbps"):
        alone(
            disaggregated_replay(
                [make_engine(loaded)],
                [make_engine(loaded)],
                [RequestSpec(0.0, 3, 2)],
                [[4, 5, 6]],
                link_bandwidth_gbps=0,
            )
        )
    # The decode engine's context cannot take this request past its first token: an error, not a hang.
    small, prefill = (
        make_engine(loaded, num_kv_blocks=3, max_model_len=12, max_num_batched_tokens=64),
        make_engine(loaded),
    )
    with pytest.raises(ValueError, match="max_model_len=12"):
        alone(disaggregated_replay([prefill], [small], [RequestSpec(0.0, 12, 4)], random_prompts([12], VOCAB, 1)))
    assert small.clock is time.perf_counter and prefill.clock is time.perf_counter  # their own clocks back


def test_compare_is_json_and_consistent(tiny_llama, workload):
    _, loaded = tiny_llama
    specs, prompts = workload
    slo = SLO(ttft_ms=1e6, tpot_ms=1e6)  # met by all: goodput = completed / duration
    lines = []
    result = compare_disaggregation(
        make_engine(loaded),
        specs,
        slo,
        prompts,
        real_time_baseline=True,
        decode_overrides={"max_num_seqs": 8},
        progress=lines.append,
    )
    json.dumps(result)
    names = [r["name"] for r in result["runs"]]
    assert names == ["colocated", "colocated_x2", "disaggregated", "colocated_real_time"] and len(lines) == 2
    assert [r["num_devices"] for r in result["runs"]] == [1, 2, 2, 1]
    assert result["outputs_identical"] == {"compared": len(specs), "identical": len(specs)}
    for r in result["runs"]:
        m = r["metrics"]
        assert m["completed"] == m["num_good_requests"] == len(specs)
        assert r["goodput_per_device_req_s"] == pytest.approx(m["goodput_req_s"] / r["num_devices"])
        assert run_metrics(r, slo).to_dict() == m  # the per-request records reproduce the summary
    disagg = result["runs"][2]
    assert disagg["step_ms"]["decode_only"]["count"] > 0
    assert result["transfers"]["count"] == sum(s.output_tokens > 1 for s in specs)
    assert (
        result["transfers"]["total_bytes"]
        == sum(s.prompt_tokens for s in specs if s.output_tokens > 1) * result["assumptions"]["kv_bytes_per_token"]
    )
    assert len(result["timeline"]) == len(specs) and result["wall_s"] > 0
    text = "\n".join(format_comparison(result))
    assert "2 colocated replicas" in text and f"{len(specs)}/{len(specs)}" in text
    # a handful of requests supports no P99: the table names each tail the max of its sample
    assert "TTFT P50/max ms" in text and f"TTFT max of {len(specs)}" in text and "TTFT P50/P99" not in text
    assert f"link P50 {result['transfers']['link_ms']['p50']:.2f} ms, max of {result['transfers']['count']}:" in text
    fig = request_phases(result["timeline"])
    assert fig.axes[0].patches  # bars were drawn
    # A stricter SLO from the same records never counts more good requests.
    strict = run_metrics(disagg, SLO(ttft_ms=1e-3))
    assert strict.num_good_requests == 0 and strict.completed == len(specs)


def test_comparison_pool_holds_the_whole_workload_and_no_more(tiny_llama):
    _, loaded = tiny_llama
    engine = make_engine(loaded)  # 256 blocks of 4, max_model_len 256
    specs = [RequestSpec(0.0, 9, 3), RequestSpec(1.0, 4, 1), RequestSpec(2.0, 30, 10)]
    assert comparison_pool(engine, specs) == {"max_model_len": 41, "num_kv_blocks": 3 + 2 + 10}
    one = [RequestSpec(0.0, 2, 2)]  # one sequence of max_model_len always fits
    assert comparison_pool(engine, one) == {"max_model_len": 5, "num_kv_blocks": 2}
    big = [RequestSpec(0.0, 100, 100)] * 10
    assert comparison_pool(engine, big)["num_kv_blocks"] == 256  # never more than the engine's own


def engines_in(runs: dict[str, list[str]]) -> int:
    return sum(len(roles) for roles in runs.values())


def test_simulated_runs_follow_the_counts():
    assert simulated_runs(2, 3) == {
        "colocated": [COLOCATED],
        "colocated_x5": [COLOCATED] * 5,
        "disaggregated": [PREFILL, PREFILL, DECODE, DECODE, DECODE],
    }
    assert [engines_in(simulated_runs(p, d)) for p, d in [(1, 1), (2, 1), (2, 3)]] == [5, 7, 11]  # 2 (p + d) + 1
    with pytest.raises(ValueError, match="must be >= 1"):
        simulated_runs(0, 1)


@pytest.mark.parametrize("num_prefill", [1, 2])
def test_comparison_holds_its_runs_engines_at_once_and_releases_each_set(
    tiny_llama, workload, num_prefill, monkeypatch
):
    """What a GPU must hold (notebook 10 on a T4: ``tests/course/test_t4_memory.py`` reads it): every
    engine built is counted while it lives, with the cycle collector off, so an engine kept only
    by a reference cycle counts as held (its pool too, on a GPU, until a collection)."""
    _, loaded = tiny_llama
    specs, prompts = workload
    served = make_engine(loaded)
    alive, counts = weakref.WeakSet(), []
    build = LLMEngine.__init__

    def counted(self, *args, **kwargs):
        build(self, *args, **kwargs)
        alive.add(self)
        assert self.loaded is served.loaded  # the served engine's weights, not a copy
        assert self.block_manager.num_blocks <= served.block_manager.num_blocks  # comparison_pool's cap
        counts.append(len(alive))

    monkeypatch.setattr(LLMEngine, "__init__", counted)
    gc.disable()
    try:
        result = compare_disaggregation(
            served, specs[:6], None, prompts[:6], num_prefill=num_prefill, real_time_baseline=True
        )
    finally:
        gc.enable()
    runs = simulated_runs(num_prefill, 1)
    # the warm-up's engine alone; then the runs' engines, all held together; then the real-time one alone
    assert counts == [1, *range(1, engines_in(runs) + 1), 1]
    assert [r["num_devices"] for r in result["runs"][:3]] == [len(roles) for roles in runs.values()]
    assert [r["name"] for r in result["runs"][:3]] == list(runs)


def test_runtime_estimate_grows_with_the_work():
    probe = {"prefill_tok_s": 1000.0, "decode_step_s": 0.01, "overhead_s": 0.001}
    small = [RequestSpec(0.1 * i, 32, 8) for i in range(4)]
    big = [RequestSpec(0.1 * i, 64, 16) for i in range(8)]
    assert 0 < estimate_comparison_s(probe, small) < estimate_comparison_s(probe, big)
    assert estimate_comparison_s(probe, small, real_time_baseline=True) > estimate_comparison_s(probe, small)
    assert estimate_comparison_s(probe, []) == 0.0


@pytest.mark.real_model
def test_real_model_handoff_keeps_text(real_engine):
    """The embedded model with its tokenizer: the detokenizer travels with the request, so text
    and tokens of a disaggregated replay equal the colocated ones."""
    specs = [RequestSpec(0.0, 20, 4), RequestSpec(0.01, 33, 3)]
    colocated = alone(colocated_replay([real_engine()], specs))
    engines = [real_engine(), real_engine()]
    run = alone(disaggregated_replay(engines[:1], engines[1:], specs))
    assert [o.token_ids for o in run.outputs] == [o.token_ids for o in colocated.outputs]
    assert [o.text for o in run.outputs] == [o.text for o in colocated.outputs] and all(o.text for o in run.outputs)
    assert serving_metrics(run.outputs).completed == len(specs) and all(all_free(e) for e in engines)
