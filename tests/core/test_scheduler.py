"""The scheduler against a mock runner: budgets, order, preemption, liveness, and block accounting.

``simulate`` plays the engine without a model: it calls ``Scheduler.schedule()``, checks the
plan, then does the engine's bookkeeping (``num_computed_tokens += n``, a fake token appended
when a chunk reaches the end of the known tokens, finished after ``max_tokens`` or at
``max_model_len``), and asserts the block manager's invariants after every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from minieng import EngineConfig, SamplingParams
from minieng.core.block_manager import BlockManager
from minieng.core.scheduler import Scheduler, SchedulerOutput
from minieng.core.sequence import Sequence, SequenceStatus
from minieng.units import cdiv

FAKE_TOKEN = 7


@dataclass
class Trace:
    steps: list[list[tuple[Sequence, int, bool]]] = field(default_factory=list)  # (seq, n, is_prefill)
    preempted: list[list[Sequence]] = field(default_factory=list)
    seqs: list[Sequence] = field(default_factory=list)

    @property
    def num_preemptions(self) -> int:
        return sum(len(p) for p in self.preempted)


def simulate(
    config: EngineConfig,
    num_blocks: int,
    requests: list[tuple[int, int, int]],
    max_model_len: int,
    max_steps: int = 20000,
) -> Trace:
    """Run ``requests`` = [(prompt_len, max_tokens, arrival_step)] to completion, checking every step."""
    bm = BlockManager(num_blocks, config.block_size)
    sched = Scheduler(config, bm)
    seqs = [
        Sequence(str(i), [i % 50 + 1] * plen, SamplingParams(max_tokens=out), 0.0)
        for i, (plen, out, _) in enumerate(requests)
    ]
    arrivals = sorted(range(len(requests)), key=lambda i: requests[i][2])
    trace = Trace(seqs=seqs)
    budget, max_seqs = config.max_num_batched_tokens, config.max_num_seqs
    step = 0
    while arrivals or sched.has_unfinished():
        while arrivals and requests[arrivals[0]][2] <= step:
            sched.add(seqs[arrivals.pop(0)])
        step += 1
        assert step <= max_steps, f"no progress after {max_steps} steps: {sched.running} {list(sched.waiting)}"
        waiting_before = list(sched.waiting)
        due_decodes = [s for s in sched.running if s.output_token_ids and s.num_uncomputed_tokens == 1]

        out = sched.schedule()
        plan = [(seq, n, SchedulerOutput.is_prefill(seq, n)) for seq, n in out.scheduled]  # before bookkeeping
        trace.steps.append(plan)
        trace.preempted.append(list(out.preempted))

        # The plan.
        flags = [p for _, _, p in plan]
        assert flags == sorted(flags), "decodes must come first in `scheduled`"
        assert len({s.request_id for s, _, _ in plan}) == len(plan), "a sequence scheduled twice"
        assert len(plan) <= max_seqs and len(sched.running) <= max_seqs
        tokens = sum(n for _, n, _ in plan)
        alone = not config.enable_chunked_prefill and len(plan) == 1 and plan[0][2]
        assert tokens <= budget or alone, f"{tokens} tokens over the budget {budget}"
        if not plan:
            assert not sched.has_unfinished(), "an idle step while requests wait"
        for seq, n, is_prefill in plan:
            assert seq.status is SequenceStatus.RUNNING and seq in sched.running
            assert 1 <= n <= seq.num_uncomputed_tokens
            assert len(seq.block_table) * config.block_size >= seq.num_computed_tokens + n, "no room reserved"
            if not config.enable_chunked_prefill and is_prefill:
                assert n == seq.num_uncomputed_tokens, "prefill-first never splits a prompt"
        if not config.enable_chunked_prefill and any(flags):
            assert all(flags), "prefill-first: a step with a prefill has no decodes"
        if config.enable_chunked_prefill:
            scheduled = {s.request_id for s, _, _ in plan}
            for seq in due_decodes:
                assert seq.request_id in scheduled or seq in out.preempted, "a running decode was skipped"
        admitted = [s for s, _, _ in plan if s in waiting_before]
        assert admitted == waiting_before[: len(admitted)], "admission is first come, first served"
        # Preempted sequences go back to the front of the queue, ahead of newer requests (the
        # last preempted, the earliest admitted, first), so they are readmitted before them.
        assert list(sched.waiting)[: len(out.preempted)] == out.preempted[::-1], "preempted not re-queued first"
        for seq in out.preempted:
            assert seq.status is SequenceStatus.WAITING and seq in sched.waiting
            assert seq.block_table == [] and seq.num_computed_tokens == 0
            assert seq not in [s for s, _, _ in plan]

        # The engine's bookkeeping, with a fake token.
        for seq, n, _ in plan:
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == seq.num_tokens:
                seq.output_token_ids.append(FAKE_TOKEN)
                if len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= max_model_len:
                    sched.finish(seq, SequenceStatus.FINISHED_LENGTH)
        bm.check_invariants(seqs)
        for seq in seqs:
            assert seq.num_computed_tokens <= seq.num_tokens

    assert all(s.is_finished for s in seqs)
    for seq, (plen, out, _) in zip(seqs, requests):
        assert len(seq.output_token_ids) == min(out, max_model_len - plen)
    assert bm.num_free_blocks == num_blocks and all(r == 0 for r in bm.ref_counts), "blocks leaked"
    return trace


def config(**kw) -> EngineConfig:
    return EngineConfig(device="cpu", **kw)


# -- hand-made workloads ----------------------------------------------------------------------------


def test_every_request_finishes_with_a_roomy_pool():
    cfg = config(block_size=4, max_num_seqs=4, max_num_batched_tokens=16)
    trace = simulate(cfg, 64, [(10, 5, 0), (3, 8, 0), (30, 2, 0), (1, 6, 2), (12, 4, 5), (7, 7, 5)], max_model_len=64)
    assert trace.num_preemptions == 0
    # Chunked prefill mixed prefill chunks with decodes in some step.
    assert any(any(p for *_, p in s) and not all(p for *_, p in s) for s in trace.steps)


def test_long_prompt_is_chunked_to_the_budget():
    cfg = config(block_size=4, max_num_seqs=2, max_num_batched_tokens=8)
    trace = simulate(cfg, 32, [(30, 3, 0)], max_model_len=64)
    chunks = [n for s in trace.steps for _, n, p in s if p]
    assert chunks == [8, 8, 8, 6]


def test_prefill_first_long_prompt_runs_alone_and_pauses_decodes():
    cfg = config(block_size=4, max_num_seqs=4, max_num_batched_tokens=8, enable_chunked_prefill=False)
    trace = simulate(cfg, 64, [(5, 10, 0), (20, 3, 3), (6, 3, 3)], max_model_len=64)
    over = [s for s in trace.steps if sum(n for _, n, _ in s) > 8]
    assert over and all(len(s) == 1 for s in over), "a prompt over the budget runs alone"
    # Request 0 was decoding when the others arrived: its decodes paused for their prefills.
    first_prefill_later = next(i for i, s in enumerate(trace.steps) if i > 0 and any(p for *_, p in s))
    assert all(p for *_, p in trace.steps[first_prefill_later])


def test_preemption_with_a_tiny_pool():
    cfg = config(block_size=4, max_num_seqs=6, max_num_batched_tokens=32)
    trace = simulate(cfg, 8, [(10, 20, 0)] * 6, max_model_len=32)
    assert trace.num_preemptions > 0
    assert any(s.times.num_preemptions for s in trace.seqs)


def test_preemption_takes_the_most_recently_admitted_first():
    cfg = config(block_size=4, max_num_seqs=4, max_num_batched_tokens=16)
    bm = BlockManager(num_blocks=4, block_size=4)
    sched = Scheduler(cfg, bm)
    a, b, c = (Sequence(n, [1] * 4, SamplingParams(max_tokens=8), 0.0) for n in "abc")
    for seq in (a, b, c):
        sched.add(seq)
    out = sched.schedule()
    assert [s for s, _ in out.scheduled] == [a, b, c] and bm.num_free_blocks == 1
    for seq in (a, b, c):
        seq.num_computed_tokens += 4
        seq.output_token_ids.append(FAKE_TOKEN)
    out = sched.schedule()  # each decode needs a second block; one is free
    assert out.preempted == [c]
    assert [s for s, _ in out.scheduled] == [a, b]
    assert sched.waiting[0] is c and c.num_computed_tokens == 0 and c.times.num_preemptions == 1
    bm.check_invariants([a, b, c])


def test_preemption_evicts_the_newest_and_keeps_the_oldest_running():
    """Four one-block requests fill a four-block pool; each decode needs a second block. The
    oldest two run; the newest two are evicted, newest first (a victim chosen oldest-first, or at
    random, would evict b or a). Both go back to the head of the queue, the older one first."""
    cfg = config(block_size=4, max_num_seqs=4, max_num_batched_tokens=16)
    bm = BlockManager(num_blocks=4, block_size=4)
    sched = Scheduler(cfg, bm)
    a, b, c, d = (Sequence(n, [1] * 4, SamplingParams(max_tokens=8), 0.0) for n in "abcd")
    for seq in (a, b, c, d):
        sched.add(seq)
    out = sched.schedule()
    assert [s for s, _ in out.scheduled] == [a, b, c, d] and bm.num_free_blocks == 0
    for seq in (a, b, c, d):
        seq.num_computed_tokens += 4
        seq.output_token_ids.append(FAKE_TOKEN)
    out = sched.schedule()
    assert out.preempted == [d, c]
    assert [s for s, _ in out.scheduled] == [a, b] and sched.running == [a, b]
    assert list(sched.waiting) == [c, d]
    assert [len(s.block_table) for s in (a, b, c, d)] == [2, 2, 0, 0]
    bm.check_invariants([a, b, c, d])


def test_a_preempted_sequence_is_readmitted_before_newer_requests():
    """Preemption re-queues at the front: a request that arrived later must not overtake it."""
    cfg = config(block_size=4, max_num_seqs=4, max_num_batched_tokens=16)
    bm = BlockManager(num_blocks=4, block_size=4)
    sched = Scheduler(cfg, bm)
    a, b, c, d = (Sequence(n, [1] * 4, SamplingParams(max_tokens=8), 0.0) for n in "abcd")
    for seq in (a, b, c):
        sched.add(seq)
    sched.schedule()
    for seq in (a, b, c):
        seq.num_computed_tokens += 4
        seq.output_token_ids.append(FAKE_TOKEN)
    sched.add(d)  # arrives after c was admitted: it waits (a single free block, kept for the decodes)
    out = sched.schedule()
    assert out.preempted == [c] and list(sched.waiting) == [c, d]
    sched.finish(a, SequenceStatus.FINISHED_LENGTH)  # room again: 2 blocks free
    out = sched.schedule()
    admitted = [s for s, n in out.scheduled if SchedulerOutput.is_prefill(s, n)]
    assert admitted[:1] == [c] and list(sched.waiting) == ([d] if d not in admitted else [])
    bm.check_invariants([a, b, c, d])


def test_finish_of_a_waiting_request_removes_it():
    cfg = config(block_size=4, max_num_seqs=1, max_num_batched_tokens=8)
    bm = BlockManager(num_blocks=4, block_size=4)
    sched = Scheduler(cfg, bm)
    a, b = (Sequence(n, [1] * 4, SamplingParams(), 0.0) for n in "ab")
    sched.add(a)
    sched.add(b)
    sched.schedule()  # only a fits max_num_seqs=1
    sched.finish(b, SequenceStatus.FINISHED_ABORTED)
    assert b not in sched.waiting and b.status is SequenceStatus.FINISHED_ABORTED
    sched.finish(a, SequenceStatus.FINISHED_ABORTED)
    assert not sched.has_unfinished() and bm.num_free_blocks == 4


# -- randomized workloads ---------------------------------------------------------------------------


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    max_model_len = draw(st.integers(2, 64))
    num_blocks = cdiv(max_model_len, block_size) + draw(st.integers(0, 20))
    max_num_seqs = draw(st.integers(1, 8))
    cfg = config(
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_seqs + draw(st.integers(0, 64)),
        enable_chunked_prefill=draw(st.booleans()),
    )
    requests = draw(
        st.lists(
            st.tuples(st.integers(1, max_model_len - 1), st.integers(1, 20), st.integers(0, 10)),
            min_size=1,
            max_size=12,
        )
    )
    return cfg, num_blocks, requests, max_model_len


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_random_workloads(workload):
    cfg, num_blocks, requests, max_model_len = workload
    trace = simulate(cfg, num_blocks, requests, max_model_len)
    event(f"preempted: {trace.num_preemptions > 0}")


@pytest.mark.parametrize("chunked", [True, False])
def test_random_workloads_do_preempt_when_the_pool_is_tight(chunked):
    """The randomized test above must reach preemption often, or it proves little about it."""
    cfg = config(block_size=2, max_num_seqs=8, max_num_batched_tokens=24, enable_chunked_prefill=chunked)
    trace = simulate(cfg, 16, [(3 + 5 * (i % 4), 12, i % 3) for i in range(10)], max_model_len=32)
    assert trace.num_preemptions > 0
