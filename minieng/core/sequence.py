"""A request's state as the scheduler and the engine see it, and the timestamps it leaves behind.

A ``Sequence`` is plain bookkeeping: token ids, how many of them are already in the KV cache
(``num_computed_tokens``), the blocks that hold them (``block_table``) and when things happened.
It owns no tensors. Preemption by recompute simply sets ``num_computed_tokens`` back to 0: the
prompt and the tokens generated so far are prefilled again when the request is readmitted.

Log-probabilities a request asked for are kept here too, beside the tokens they belong to
(``output_logprobs``, ``prompt_logprobs``). A recompute never computes them twice: the prompt's
are kept across a preemption, and only the positions still owed ask the runner for logits
(``prompt_logprobs_from``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from minieng.config import SamplingParams

if TYPE_CHECKING:  # the scheduler and the block manager read sequences without torch
    from minieng.core.sampling import KeyedRandom


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"  # EOS, a stop token id or a stop string
    FINISHED_LENGTH = "length"  # max_tokens or max_model_len reached
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")


@dataclass
class RequestTimes:
    """Wall-clock times (``time.perf_counter`` seconds) recorded by the engine for one request.

    ``emissions`` holds one ``(time_s, num_tokens)`` per step in which the request emitted
    tokens; a step may emit several (speculative decoding), and that is one ITL gap.
    """

    arrival_s: float
    first_scheduled_s: float | None = None
    emissions: list[tuple[float, int]] = field(default_factory=list)
    finished_s: float | None = None
    num_preemptions: int = 0


class Sequence:
    """One request: prompt, output so far, KV placement and timestamps."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_s: float,
        rng: "KeyedRandom | None" = None,
    ):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.rng = rng  # its random numbers, keyed by output position; None for greedy requests
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first admission
        self.block_table: list[int] = []  # physical block ids, in token order
        self.block_keys: list[bytes] = []  # prefix-cache keys of its full blocks (memoized)
        self.extra_keys: tuple = ()  # anything besides the tokens that changes the KV (a LoRA id)
        self.spec_token_ids: list[int] = []  # draft tokens to verify in the next step
        # Log-probabilities (dicts of ``outputs.Logprob``), None where the request did not ask: one
        # per output token, appended with it; one per prompt token computed so far, the first None.
        self.output_logprobs: list[dict] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[dict | None] | None = [None] if params.prompt_logprobs is not None else None
        self.times = RequestTimes(arrival_s=arrival_s)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids(self, start: int, end: int) -> list[int]:
        """Token ids ``[start, end)`` of prompt + output, without building the whole list (a decode
        step reads one token per sequence; ``all_token_ids`` would copy the whole context)."""
        p = len(self.prompt_token_ids)
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        if end <= p:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to be run through the model: the prompt at first, 1 when decoding."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def prompt_logprobs_from(self) -> int | None:
        """The first position whose logits still owe a prompt log-probability (the logits at
        position p give prompt token p + 1's), or None when none is owed (all computed, or none
        asked). The prefix cache serves no block at or after it (``BlockManager.match_prefix``)."""
        if self.prompt_logprobs is None or len(self.prompt_logprobs) >= self.num_prompt_tokens:
            return None
        return len(self.prompt_logprobs) - 1

    def owed_prompt_positions(self, start: int, end: int) -> range:
        """The positions of the chunk ``[start, end)`` whose logits give a prompt log-probability
        still owed (position p gives prompt token p + 1's): a row of logits each. Empty when none."""
        owed = self.prompt_logprobs_from
        if owed is None:
            return range(0)
        return range(max(start, owed), max(max(start, owed), min(end, self.num_prompt_tokens - 1)))

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
            f"output={len(self.output_token_ids)}, computed={self.num_computed_tokens})"
        )
