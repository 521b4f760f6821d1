"""Continuous batching: which sequences run in the next step, and with how many tokens.

Policy only: the scheduler moves ``Sequence`` objects between ``waiting`` and ``running`` and
asks the block manager for room; it never touches a tensor. Requests join and leave between
steps, so a step may mix prefill chunks and decodes (continuous batching, Orca/vLLM).

Two policies (docs/architecture.md, The scheduler):

- decode-first with chunked prefill (default, vLLM V1): every running decode gets its 1 token,
  then partially prefilled sequences continue, then waiting requests are admitted in arrival
  order, their prompts cut to the token budget left (``max_num_batched_tokens``).
- prefill-first without chunking (vLLM V0): when a prompt waits, the step prefills whole prompts
  only and the running decodes pause, which is what makes their inter-token gaps spike.

Prompts that ask for their log-probabilities (``prompt_logprobs``) take at most
``PROMPT_ROWS_PER_STEP`` tokens a step, all together (chunked, they are cut to it; without
chunking, one that does not fit waits): no step computes more rows of logits than that.

When blocks run out, the most recently admitted running sequence is preempted: its blocks are
freed and it goes back to the front of the queue, to be recomputed (prefilled again) later.

Either policy batches continuously. ``batching="static"`` is the baseline it replaced (a server
that batches requests as a whole, as TF Serving's batcher does): when no batch runs, the first
``max_num_seqs`` waiting requests become the batch, once that many wait or the oldest has waited
``batch_timeout_s``; only its members are admitted (a preempted member comes back), and the next
batch forms when every member has finished. Finished members leave their slots empty, so the
batch shrinks until its longest request ends. The clock that the timeout reads is
``time.perf_counter`` (the engine's arrival times), replaceable for tests.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from minieng.config import EngineConfig
from minieng.core.block_manager import BlockManager
from minieng.core.sequence import Sequence, SequenceStatus

# Prompt positions whose logits one step computes for prompt log-probabilities, all requests
# together: those requests' prompt chunks are cut to it, so a long prompt's logits ([prompt tokens,
# vocab] float32: 1 GiB for 2,048 tokens of a 128k vocabulary) never exist at once, and the memory
# profile can count them.
PROMPT_ROWS_PER_STEP = 256


@dataclass
class SchedulerOutput:
    """The plan of one step: ``(sequence, number of new tokens)`` pairs, decodes first."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for seq, n in self.scheduled if self.is_prefill(seq, n))

    @property
    def num_decode_seqs(self) -> int:
        return sum(1 for seq, n in self.scheduled if not self.is_prefill(seq, n))

    @staticmethod
    def is_prefill(seq: Sequence, num_new_tokens: int) -> bool:
        """A chunk is prefill unless it is a decode: the newest token of a sequence with output
        (followed by k speculative tokens, if any)."""
        return not (seq.output_token_ids and seq.num_computed_tokens == seq.num_tokens - 1)


class Scheduler:
    def __init__(
        self, config: EngineConfig, block_manager: BlockManager, clock: Callable[[], float] = time.perf_counter
    ):
        self.config = config
        self.block_manager = block_manager
        self.clock = clock  # seconds, on the clock of ``RequestTimes.arrival_s``
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        # Static batching: request ids of the current batch's unfinished members (empty: no batch).
        self.batch: set[str] = set()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.config.batching == "static" and not self.batch:
            self._form_batch()
        if self.config.enable_chunked_prefill:
            self._schedule_decode_first(out)
        elif not self._schedule_prefill_first(out):
            self._schedule_decodes(out, set())
        # Decodes first in the batch (the model runner batches them together), then decodes
        # carrying speculative tokens, then prefill chunks.
        out.scheduled.sort(key=lambda item: (prefill := SchedulerOutput.is_prefill(*item), not prefill and item[1] > 1))
        return out

    # -- policies -------------------------------------------------------------------------------

    def _schedule_decode_first(self, out: SchedulerOutput) -> None:
        scheduled: set[str] = set()
        budget = self.config.max_num_batched_tokens - self._schedule_decodes(out, scheduled)
        prompt_rows = PROMPT_ROWS_PER_STEP  # tokens left this step for prompts owing log-probabilities
        # Sequences admitted earlier whose prompt is only partly in the cache continue.
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.request_id in scheduled or seq.status is not SequenceStatus.RUNNING:
                continue
            n = self._cut_to_rows(seq, min(seq.num_uncomputed_tokens, budget), prompt_rows)
            if n == 0:
                continue  # its prompt's rows wait for the next step
            if self._reserve(seq, n, scheduled, out):
                out.scheduled.append((seq, n))
                scheduled.add(seq.request_id)
                budget -= n
                prompt_rows -= self._rows(seq, seq.num_computed_tokens, n)
            else:
                self._preempt(seq, out)
        if not out.preempted:  # blocks are short: admitting now would only preempt again
            self._admit(out, budget, chunk=True, prompt_rows=prompt_rows)

    def _schedule_prefill_first(self, out: SchedulerOutput) -> bool:
        """Admit whole prompts; return False (nothing admitted) to fall back to a decode step."""
        budget = self.config.max_num_batched_tokens
        self._admit(out, budget, chunk=False, prompt_rows=PROMPT_ROWS_PER_STEP)
        return bool(out.scheduled)

    def _schedule_decodes(self, out: SchedulerOutput, scheduled: set[str]) -> int:
        """Every running sequence whose prompt is fully computed: its newest token, plus its k
        speculative tokens if any (k + 1 in all). Returns the tokens used."""
        used = 0
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING or seq.num_uncomputed_tokens != 1:
                continue  # preempted in this loop, or still prefilling
            n = 1 + len(seq.spec_token_ids)
            if used + n > self.config.max_num_batched_tokens - (len(self.running) - len(scheduled) - 1):
                seq.spec_token_ids, n = [], 1  # no budget left to check speculative tokens
            if self._reserve(seq, n, scheduled, out):
                out.scheduled.append((seq, n))
                scheduled.add(seq.request_id)
                used += n
            else:
                self._preempt(seq, out)
        return used

    def _form_batch(self) -> None:
        """Static batching, no batch running: the first ``max_num_seqs`` waiting requests become
        the batch once that many wait, or once the oldest has waited ``batch_timeout_s``."""
        if self.waiting and self._fill_wait_s() == 0:
            self.batch = {seq.request_id for seq in list(self.waiting)[: self.config.max_num_seqs]}

    def _fill_wait_s(self) -> float:
        """Static batching, no batch running, someone waiting: seconds before a batch forms (0: now)."""
        if len(self.waiting) >= self.config.max_num_seqs:
            return 0.0
        return max(0.0, self.config.batch_timeout_s - (self.clock() - self.waiting[0].times.arrival_s))

    def batch_wait_s(self) -> float:
        """Seconds (on ``clock``) during which ``schedule`` will plan nothing because a static batch
        is filling: until the oldest waiting request's ``batch_timeout_s`` runs out (``math.inf``
        for an infinite timeout; an arrival that fills the batch ends it sooner). 0 otherwise:
        under continuous batching, while a batch runs, or when a batch forms at once."""
        if self.config.batching != "static" or self.batch or self.running or not self.waiting:
            return 0.0
        return self._fill_wait_s()

    def _admissible(self, seq: Sequence) -> bool:
        """Continuous batching admits anyone; static batching only members of the current batch."""
        return self.config.batching != "static" or seq.request_id in self.batch

    def _admit(self, out: SchedulerOutput, budget: int, chunk: bool, prompt_rows: int) -> None:
        """Admit waiting sequences in arrival order while budget, blocks and ``max_num_seqs`` allow
        (and, under static batching, while the next is a member of the current batch).

        A prompt owing log-probabilities takes at most ``prompt_rows`` tokens, what is left of the
        step's ``PROMPT_ROWS_PER_STEP``: chunked, it is cut to them (the next waits when none are
        left); whole, it waits for a step with room. Without chunking a prompt is never split: one
        longer than the budget runs alone.
        """
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if not self._admissible(seq):
                break
            hits = bm.match_prefix(seq)  # full blocks of its prefix already in the cache
            start = seq.num_computed_tokens + len(hits) * bm.block_size
            n = seq.num_tokens - start
            if chunk:
                n = self._cut_to_rows(seq, min(n, budget), prompt_rows, start)
                if n == 0:
                    break  # no rows left this step for its prompt's log-probabilities
            elif n > budget and out.scheduled:
                break
            elif self._rows(seq, start, n) > prompt_rows:
                break  # whole, its rows wait for a step with room (add_request keeps it within one step's)
            if not bm.can_allocate(seq, n, hits):
                break  # admission never preempts: wait for blocks to come back
            self.waiting.popleft()
            bm.take_prefix(seq, hits)
            if seq.times.num_preemptions == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
            bm.allocate(seq, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
            prompt_rows -= self._rows(seq, start, n)

    # -- rows of logits ---------------------------------------------------------------------------

    @staticmethod
    def _rows(seq: Sequence, start: int, n: int) -> int:
        """Rows of logits ``n`` tokens of ``seq`` from position ``start`` compute for its prompt's
        log-probabilities (``Sequence.owed_prompt_positions``)."""
        return len(seq.owed_prompt_positions(start, start + n))

    @classmethod
    def _cut_to_rows(cls, seq: Sequence, n: int, rows: int, start: int | None = None) -> int:
        """``n`` tokens of ``seq`` from ``start`` (default: its first uncomputed), cut so that they
        owe at most ``rows`` rows: the positions before its first owed one cost none."""
        start = seq.num_computed_tokens if start is None else start
        owed = seq.owed_prompt_positions(start, start + n)
        return n if len(owed) <= rows else owed.start - start + rows

    # -- blocks and preemption ------------------------------------------------------------------

    def _reserve(self, seq: Sequence, n: int, scheduled: set[str], out: SchedulerOutput) -> bool:
        """Allocate room for ``n`` tokens of ``seq``, preempting the newest unscheduled sequences."""
        while not self.block_manager.can_allocate(seq, n):
            victim = next((s for s in reversed(self.running) if s is not seq and s.request_id not in scheduled), None)
            if victim is None:
                return False
            self._preempt(victim, out)
        self.block_manager.allocate(seq, n)
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)  # num_computed_tokens -> 0: recompute on readmission
        seq.spec_token_ids = []
        seq.status = SequenceStatus.WAITING
        seq.times.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """Remove a finished (or aborted) sequence and return its blocks."""
        assert status.finished
        self.detach(seq)
        seq.status = status

    def detach(self, seq: Sequence) -> None:
        """Take ``seq`` out of this scheduler and return its blocks (its full blocks stay in the
        prefix cache); its status is the caller's to set: finished, or in transit to another
        engine (``kv_transfer.export_prefilled``)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        self.batch.discard(seq.request_id)  # static batching: it no longer holds its batch open

    # -- sequences whose KV arrives from elsewhere (disaggregated prefill) -------------------------

    def can_join_running(self) -> bool:
        """Whether a sequence with its KV already in the pool may join the running batch now: a
        free place under ``max_num_seqs`` and no preempted sequence waiting (those go first)."""
        return not self.waiting and len(self.running) < self.config.max_num_seqs

    def join_running(self, seq: Sequence) -> None:
        """Add a sequence whose blocks are allocated and whose ``num_computed_tokens`` are in the
        cache (``kv_transfer.admit_prefilled``) to the running batch, as the newest: it decodes
        from the next step and is the first preempted if blocks run out."""
        assert seq.block_table and seq.num_uncomputed_tokens >= 1, f"{seq} has no KV to decode from"
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
