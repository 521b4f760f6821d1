"""Static batching (``EngineConfig(batching="static")``): the baseline continuous batching replaced.

Semantics checked against a mock runner and a fake clock: a batch is admitted only when no batch
runs and a full batch waits (or the oldest waiting request has waited ``batch_timeout_s``); it
runs until its longest request finishes; nobody joins it mid-way. Then on a model: greedy outputs
are those of continuous batching, and the batches ran one after another.
"""

from __future__ import annotations

import math
import time

import pytest
from helpers import assert_same_or_near_tie, hf_next_logits, make_engine, random_prompts
from hypothesis import given, settings
from hypothesis import strategies as st

from minieng import EngineConfig, SamplingParams
from minieng.core.block_manager import BlockManager
from minieng.core.scheduler import Scheduler, SchedulerOutput
from minieng.core.sequence import Sequence, SequenceStatus
from minieng.lab.replay import run_workload
from minieng.measure.workloads import RequestSpec
from minieng.units import cdiv

FAKE_TOKEN = 7


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def static_config(**kw) -> EngineConfig:
    fields = dict(device="cpu", block_size=4, max_num_seqs=3, max_num_batched_tokens=64, batching="static")
    fields.update(kw)
    return EngineConfig(**fields)


def make_scheduler(cfg: EngineConfig, num_blocks: int = 64):
    clock = FakeClock()
    bm = BlockManager(num_blocks, cfg.block_size)
    return Scheduler(cfg, bm, clock=clock), bm, clock


def new_seq(name: str, prompt_len: int, max_tokens: int, arrival_s: float) -> Sequence:
    return Sequence(name, [1] * prompt_len, SamplingParams(max_tokens=max_tokens), arrival_s)


def run_step(sched: Scheduler, max_model_len: int = 10_000) -> SchedulerOutput:
    """One step with the engine's bookkeeping and a fake token (as test_scheduler's simulate)."""
    out = sched.schedule()
    advance(sched, out, max_model_len)
    return out


def advance(sched: Scheduler, out: SchedulerOutput, max_model_len: int) -> None:
    """The engine's bookkeeping after a step: computed tokens, a fake token, finishing."""
    for seq, n in out.scheduled:
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == seq.num_tokens:
            seq.output_token_ids.append(FAKE_TOKEN)
            if len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= max_model_len:
                sched.finish(seq, SequenceStatus.FINISHED_LENGTH)


# -- configuration ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        (dict(batching="dynamic"), "batching='dynamic'"),
        (dict(batch_timeout_s=-1.0), "batch_timeout_s=-1.0"),
        (dict(batch_timeout_s=float("nan")), "batch_timeout_s=nan"),
    ],
)
def test_bad_batching_config(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        EngineConfig(**kwargs)


def test_continuous_is_the_default():
    assert EngineConfig().batching == "continuous"


# -- admission --------------------------------------------------------------------------------------


def test_a_full_batch_starts_at_once():
    sched, _, _ = make_scheduler(static_config(batch_timeout_s=math.inf))
    seqs = [new_seq(str(i), 5, 4, 0.0) for i in range(4)]
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule()
    assert [s for s, _ in out.scheduled] == seqs[:3], "the first max_num_seqs waiting form the batch"
    assert list(sched.waiting) == seqs[3:]


def test_a_partial_batch_waits_for_the_timeout():
    sched, _, clock = make_scheduler(static_config(batch_timeout_s=5.0))
    a, b = new_seq("a", 5, 4, 0.0), new_seq("b", 5, 4, 1.0)
    sched.add(a)
    sched.add(b)
    for now in (0.0, 2.5, 4.999):
        clock.now = now
        assert sched.schedule().scheduled == [], f"a partial batch started at t={now} s, before the timeout"
    clock.now = 5.0  # the oldest (a) has waited 5 s
    assert [s for s, _ in sched.schedule().scheduled] == [a, b]


def test_an_infinite_timeout_waits_for_a_full_batch():
    sched, _, clock = make_scheduler(static_config(batch_timeout_s=math.inf))
    sched.add(new_seq("a", 5, 4, 0.0))
    clock.now = 1e9
    assert sched.schedule().scheduled == []
    sched.add(new_seq("b", 5, 4, 1e9))
    sched.add(new_seq("c", 5, 4, 1e9))
    assert len(sched.schedule().scheduled) == 3


def test_zero_timeout_starts_with_whatever_waits():
    sched, _, _ = make_scheduler(static_config(batch_timeout_s=0.0))
    sched.add(new_seq("a", 5, 4, 0.0))
    assert len(sched.schedule().scheduled) == 1


def test_nobody_joins_mid_batch_and_the_longest_request_holds_the_batch():
    sched, _, _ = make_scheduler(static_config(batch_timeout_s=0.0))
    short, long = new_seq("short", 4, 2, 0.0), new_seq("long", 4, 6, 0.0)
    sched.add(short)
    sched.add(long)
    run_step(sched)  # both prefilled, one token each
    late = new_seq("late", 4, 3, 0.0)
    sched.add(late)  # arrives mid-batch, with room to spare (max_num_seqs=3, plenty of blocks)
    steps = 1
    while not long.is_finished:
        out = run_step(sched)
        steps += 1
        assert late not in [s for s, _ in out.scheduled], f"admitted mid-batch at step {steps}"
        if short.is_finished:
            assert sched.running == ([long] if not long.is_finished else [])
    assert short.is_finished and steps == 6, "the batch runs until its longest request's 6th token"
    out = run_step(sched)
    assert [s for s, _ in out.scheduled] == [late], "the next batch starts once the last member finished"


def test_aborting_a_member_ends_its_membership():
    sched, _, _ = make_scheduler(static_config(batch_timeout_s=0.0))
    a, b = new_seq("a", 4, 5, 0.0), new_seq("b", 4, 5, 0.0)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    sched.add(new_seq("c", 4, 5, 0.0))
    sched.finish(a, SequenceStatus.FINISHED_ABORTED)
    sched.finish(b, SequenceStatus.FINISHED_ABORTED)
    assert sched.batch == set()
    assert [s.request_id for s, _ in sched.schedule().scheduled] == ["c"]


def test_a_preempted_member_is_readmitted_before_the_next_batch():
    # 4 blocks of 4 tokens: three 4-token prompts take 3 blocks; each decode needs a second block.
    cfg = static_config(batch_timeout_s=0.0)
    sched, bm, _ = make_scheduler(cfg, num_blocks=4)
    members = [new_seq(n, 4, 3, 0.0) for n in "abc"]
    for seq in members:
        sched.add(seq)
    run_step(sched)
    outsider = new_seq("d", 1, 1, 0.0)
    sched.add(outsider)
    preempted = []
    while any(not s.is_finished for s in members):
        out = run_step(sched)
        preempted += out.preempted
        assert outsider not in [s for s, _ in out.scheduled], "a non-member joined the batch"
        bm.check_invariants(members + [outsider])
    assert preempted, "the tiny pool never preempted"
    assert [s for s, _ in run_step(sched).scheduled] == [outsider]


# -- randomized workloads ---------------------------------------------------------------------------


@st.composite
def static_workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = draw(st.integers(2, 48))
    max_num_seqs = draw(st.integers(1, 6))
    cfg = static_config(
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_seqs + draw(st.integers(0, 48)),
        enable_chunked_prefill=draw(st.booleans()),
        batch_timeout_s=float(draw(st.sampled_from([0, 1, 3, 10]))),
    )
    num_blocks = cdiv(max_model_len, block_size) + draw(st.integers(0, 16))
    requests = draw(
        st.lists(
            st.tuples(st.integers(1, max_model_len - 1), st.integers(1, 12), st.integers(0, 15)),
            min_size=1,
            max_size=12,
        )
    )
    return cfg, num_blocks, requests, max_model_len


@settings(max_examples=300, deadline=None)
@given(static_workloads())
def test_random_workloads_run_as_whole_batches(workload):
    """Every step: only members of the current batch run; a batch forms only when the previous one
    has finished, from the first max_num_seqs waiting, once that many wait or the oldest has
    waited the timeout; every request finishes with all its tokens and no block leaks."""
    cfg, num_blocks, requests, max_model_len = workload
    sched, bm, clock = make_scheduler(cfg, num_blocks)
    seqs = [new_seq(str(i), plen, out, float(at)) for i, (plen, out, at) in enumerate(requests)]
    arrivals = sorted(range(len(seqs)), key=lambda i: requests[i][2])
    batches: list[set[str]] = []
    step = 0
    while arrivals or sched.has_unfinished():
        clock.now = float(step)
        while arrivals and requests[arrivals[0]][2] <= step:
            sched.add(seqs[arrivals.pop(0)])
        waiting_before = list(sched.waiting)
        out = sched.schedule()
        current = set(sched.batch)  # before this step's tokens finish anyone
        if current and not (batches and current & batches[-1]):  # a batch formed in this step
            assert not batches or all(seqs[int(r)].is_finished for r in batches[-1]), "a batch formed mid-batch"
            assert (
                len(waiting_before) >= cfg.max_num_seqs
                or clock.now - waiting_before[0].times.arrival_s >= cfg.batch_timeout_s
            ), "formed before full or timeout"
            assert current == {s.request_id for s in waiting_before[: cfg.max_num_seqs]}, "not the first waiting"
            batches.append(current)
        if not out.scheduled and sched.has_unfinished() and not sched.running:
            assert not current, "an idle step while a batch's members wait with the pool free"
        for seq, _ in out.scheduled:
            assert seq.request_id in batches[-1], f"{seq.request_id} ran outside its batch"
        assert len(out.scheduled) <= cfg.max_num_seqs
        advance(sched, out, max_model_len)
        step += 1
        assert step < 5000, "no progress"
        bm.check_invariants(seqs)
    for seq, (plen, out, _) in zip(seqs, requests):
        assert seq.is_finished and len(seq.output_token_ids) == min(out, max_model_len - plen)
    assert sorted(r for b in batches for r in b) == sorted(s.request_id for s in seqs), "each request in one batch"
    assert bm.num_free_blocks == num_blocks


# -- on a model -------------------------------------------------------------------------------------


def check_ran_as_batches(outputs, batch_size: int) -> None:
    """Requests queued together in order run in batches of ``batch_size``: each batch's first
    admission comes after the previous batch's last token."""
    batches = [outputs[i : i + batch_size] for i in range(0, len(outputs), batch_size)]
    for previous, batch in zip(batches, batches[1:]):
        assert min(o.times.first_scheduled_s for o in batch) >= max(o.times.finished_s for o in previous)


def test_tiny_static_outputs_equal_continuous(tiny_llama):
    hf, loaded = tiny_llama
    prompts = random_prompts([3, 40, 17, 1, 29, 9, 50, 12], loaded.model.config.vocab_size, seed=5)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (4, 20, 9, 30, 2, 16, 7, 12)]
    continuous = make_engine(loaded, max_num_seqs=3).generate(prompts, params)
    static_engine = make_engine(loaded, max_num_seqs=3, batching="static")
    static = static_engine.generate(prompts, params)
    for i, (c, s) in enumerate(zip(continuous, static)):
        assert s.finished and len(s.token_ids) == params[i].max_tokens
        assert_same_or_near_tie(c.token_ids, s.token_ids, prompts[i], hf_next_logits(hf), what=f"request {i}")
    check_ran_as_batches(static, 3)
    # Continuous batching let a later request in before the first batch's longest finished.
    assert min(o.times.first_scheduled_s for o in continuous[3:6]) < max(o.times.finished_s for o in continuous[:3])


@pytest.mark.real_model
def test_real_static_outputs_equal_continuous(default_model, hf_default, real_engine):
    from minieng.measure.workloads import text_prompts

    prompts = [p[:n] for p, n in zip(text_prompts(default_model.tokenizer, 48, 5), (48, 9, 30, 17, 40))]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (12, 3, 8, 16, 5)]
    continuous = real_engine(max_num_seqs=2).generate(prompts, params)
    static = real_engine(max_num_seqs=2, batching="static").generate(prompts, params)
    for i, (c, s) in enumerate(zip(continuous, static)):
        assert_same_or_near_tie(c.token_ids, s.token_ids, prompts[i], hf_next_logits(hf_default), what=f"request {i}")
    check_ran_as_batches(static, 2)


def test_a_served_partial_batch_waits_for_the_timeout(tiny_llama):
    """In real time: three requests arrive at once for batches of four; they start together after
    the timeout, and a fourth, arriving later, waits for that batch to finish."""
    loaded = tiny_llama[1]
    engine = make_engine(loaded, max_num_seqs=4, batching="static", batch_timeout_s=0.2)
    specs = [RequestSpec(0.0, 5, 6)] * 3 + [RequestSpec(0.25, 5, 2)]
    prompts = random_prompts([5] * 4, loaded.model.config.vocab_size, seed=2)
    result = run_workload(engine, specs, prompts)
    first, late = result.outputs[:3], result.outputs[3]
    assert all(o.finished and len(o.token_ids) == s.output_tokens for o, s in zip(result.outputs, specs))
    # First tokens, not ``first_scheduled_s``: the engine stamps that at the start of the step,
    # just before the scheduler reads its clock and forms the batch.
    ttft = [o.times.emissions[0][0] - o.times.arrival_s for o in result.outputs]
    assert min(ttft[:3]) >= 0.2, f"a partial batch started before the timeout: TTFT {ttft[:3]} s"
    assert late.times.emissions[0][0] > max(o.times.finished_s for o in first)
    assert ttft[3] >= 0.2, "alone, it waits the timeout too"


# -- waiting for a partial batch: asleep, not stepping ----------------------------------------------


def count_steps(engine) -> list:
    """Record every ``engine.step()`` call (the engine, ``generate`` and the server's loop call
    the attribute, so wrapping it counts them all)."""
    calls = []
    step = engine.step

    def counted():
        calls.append(len(step_outputs := step()))
        return step_outputs

    engine.step = counted
    return calls


def test_generate_sleeps_while_a_partial_batch_waits(tiny_llama):
    """Two prompts for batches of four wait 0.3 s for the timeout: in steps, the wait costs at
    most one (before it, the loop made thousands of empty ``step()`` calls)."""
    loaded = tiny_llama[1]
    engine = make_engine(loaded, max_num_seqs=4, batching="static", batch_timeout_s=0.3)
    calls = count_steps(engine)
    outs = engine.generate(
        random_prompts([5, 7], loaded.model.config.vocab_size, seed=4),
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
    )
    assert all(o.finished and len(o.token_ids) == 5 for o in outs)
    assert min(o.times.emissions[0][0] - o.times.arrival_s for o in outs) >= 0.3, "the batch waited the timeout"
    assert len(calls) <= 5 + 1, f"{len(calls)} step() calls for 5 tokens: it stepped while waiting"
    assert engine.idle_wait_s() == math.inf, "nothing left to run"


def test_generate_refuses_a_batch_that_can_never_fill(tiny_llama):
    """An infinite timeout and fewer prompts than max_num_seqs: nothing else can arrive during
    generate(), so it raises (it used to spin forever) and leaves none of its requests behind."""
    loaded = tiny_llama[1]
    engine = make_engine(loaded, max_num_seqs=4, batching="static", batch_timeout_s=math.inf)
    prompts = random_prompts([5] * 6, loaded.model.config.vocab_size, seed=6)
    with pytest.raises(ValueError, match=r"batch_timeout_s=inf.*max_num_seqs=4.*only 2"):
        engine.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    assert not engine.has_unfinished_requests()
    assert len(engine.requests) == 4, "the full batch ran; the two left over were aborted and released"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_replayed_workload_sleeps_while_a_partial_batch_waits(tiny_llama):
    """``serving.run_workload`` (the notebooks' replay) drives the engine as the server does: two
    requests for batches of four wait 0.3 s for the timeout without a step (before, it polled
    every 0.5 ms); with an infinite timeout and no more arrivals it refuses instead of spinning,
    leaving nothing queued."""
    loaded = tiny_llama[1]
    engine = make_engine(loaded, max_num_seqs=4, batching="static", batch_timeout_s=0.3)
    calls = count_steps(engine)
    specs = [RequestSpec(0.0, 5, 4), RequestSpec(0.01, 7, 4)]
    result = run_workload(engine, specs, random_prompts([5, 7], loaded.model.config.vocab_size, seed=4))
    assert all(o.finished and len(o.token_ids) == 4 for o in result.outputs)
    assert len(calls) <= 4 + 1, f"{len(calls)} step() calls for 4 tokens: it stepped while waiting"
    stuck = make_engine(loaded, max_num_seqs=4, batching="static", batch_timeout_s=math.inf)
    with pytest.raises(ValueError, match="can never fill"):
        run_workload(stuck, specs, random_prompts([5, 7], loaded.model.config.vocab_size, seed=4))
    assert not stuck.has_unfinished_requests()


def _serve_static(loaded, **config):
    pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from minieng.serve.server import ServerThread, build_app

    engine = make_engine(loaded, batching="static", **config)
    calls = count_steps(engine)
    return engine, calls, ServerThread(build_app(engine, "tiny"))


def _post_later(pool, server, prompt: list[int], max_tokens: int):
    import httpx

    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return pool.submit(httpx.post, f"{server.base_url}/completions", json=body, timeout=60)


def _wait_until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.01)
    return predicate()


def test_a_served_partial_batch_sleeps_until_an_arrival_fills_it(tiny_llama):
    """The server's loop, batches of two, an infinite timeout: one request waits without a step
    taken (the loop used to burn a core stepping for nothing), and the arrival of a second wakes
    the loop at once to run the full batch."""
    from concurrent.futures import ThreadPoolExecutor

    engine, calls, server = _serve_static(tiny_llama[1], max_num_seqs=2, batch_timeout_s=math.inf)
    with server, ThreadPoolExecutor(2) as pool:
        first = _post_later(pool, server, [1, 2, 3], 4)
        assert _wait_until(engine.has_unfinished_requests)
        time.sleep(0.3)  # however long it waits, it must not step
        assert calls == [] and not first.done()
        second = _post_later(pool, server, [4, 5, 6], 4)
        answers = [first.result(), second.result()]
    assert [a.json()["usage"]["completion_tokens"] for a in answers] == [4, 4]
    assert len(calls) == 4 and all(n > 0 for n in calls), f"steps taken: {calls}"


def test_a_served_partial_batch_starts_at_its_timeout_without_stepping_before(tiny_llama):
    from concurrent.futures import ThreadPoolExecutor

    engine, calls, server = _serve_static(tiny_llama[1], max_num_seqs=4, batch_timeout_s=0.4)
    with server, ThreadPoolExecutor(1) as pool:
        answer = _post_later(pool, server, [1, 2, 3], 3).result()
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    assert len(calls) <= 3 + 1, f"{len(calls)} step() calls for 3 tokens: the loop stepped while waiting"
