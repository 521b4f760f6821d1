"""Speculative decoding attached to an engine at its two seams.

``Speculator.propose`` runs before each schedule (``EngineCore.step``): the drafter proposes up to
k tokens for every decoding sequence (``seq.spec_token_ids``), and the scheduler runs them beside
its newest token. ``Speculator.verify`` runs in place of sampling for those sequences
(``ModelRunner.verify``): the target's k + 1 rows of logits decide which drafts it keeps
(``verification.py``). ``release`` hears of every sequence that stops running (preempted, finished,
aborted), to free its draft state and count its last verification over the tokens it emitted.
"""

from __future__ import annotations

import torch

from minieng.core.sampling import probabilities
from minieng.core.sequence import Sequence
from minieng.device import synchronize
from minieng.wings.speculative.verification import verify_coupled, verify_greedy


class Speculator:
    """One engine's speculative decoding: its ``drafter`` (``drafters.py``) and its records; the
    build sets it as ``engine.speculator`` and its ``verify`` as ``engine.runner.verify``.

    ``records``: one row per verification, (step index, request id, drafts proposed, drafts
    accepted), counted over the tokens the request emits (``release``): ``engine.spec_records``.
    """

    def __init__(self, engine, drafter):
        self.engine, self.drafter = engine, drafter
        self.records: list[tuple[int, str, int, int]] = []
        self._verified: dict[str, int] = {}  # this step's rows: request id -> index in records

    def propose(self, engine) -> float:
        """Ask the drafter for up to k tokens for every running sequence that is decoding, never
        more than its ``max_tokens`` or ``max_model_len`` leaves room for (k drafts emit k + 1).
        Returns the seconds it took."""
        start = engine.clock()
        self._verified = {}
        k = engine.config.num_speculative_tokens
        decoding = [s for s in engine.scheduler.running if s.output_token_ids and s.num_uncomputed_tokens == 1]
        room = [
            max(0, min(k, s.params.max_tokens - len(s.output_token_ids) - 1, engine.max_model_len - s.num_tokens - 1))
            for s in decoding
        ]
        for seq, tokens in zip(decoding, self.drafter.propose(decoding, room)):
            seq.spec_token_ids = tokens
        synchronize(engine.device)
        return engine.clock() - start

    def verify(self, seq: Sequence, logits: torch.Tensor) -> list[int]:
        """``verify``, recorded as a row of ``records``."""
        tokens = verify(seq, logits)
        self.records.append((len(self.engine.step_records), seq.request_id, len(seq.spec_token_ids), len(tokens) - 1))
        self._verified[seq.request_id] = len(self.records) - 1
        return tokens

    def release(self, seq: Sequence, num_kept: int | None) -> None:
        """``seq`` stopped running: free its draft state; if it finished in a step that verified
        drafts, count that verification over the ``num_kept`` tokens the step emitted.

        The convention: acceptance over the tokens a request emits. A verification that ends the
        request (EOS, a stop token or string) emits ``num_kept`` tokens; the drafts accepted past
        them never reach the output (as vLLM's and llama.cpp's servers drop them), so a draft
        position past the end counts neither as proposed nor as accepted: the row becomes
        (min(proposed, kept), min(accepted, kept)). Every figure is then about the output the user
        got; ``max_tokens`` and ``max_model_len`` never cut a run (``propose`` leaves them room)."""
        self.drafter.free(seq.request_id)
        i = self._verified.get(seq.request_id)
        if i is not None and num_kept is not None:
            step, rid, proposed, accepted = self.records[i]
            self.records[i] = (step, rid, min(proposed, num_kept), min(accepted, num_kept))


def verify(seq: Sequence, logits: torch.Tensor) -> list[int]:
    """The tokens ``seq`` emits from the target's ``logits`` [k + 1, vocab] over its k drafts
    (``seq.spec_token_ids``): greedy, or coupled with the request's keyed noise (``verification.py``
    says why not the rejection rule)."""
    drafts = seq.spec_token_ids
    if seq.params.greedy:
        return verify_greedy(drafts, logits)
    first = len(seq.output_token_ids)  # the output position the first draft stands at
    noise = torch.stack([seq.rng.exponentials(first + i, logits.shape[-1]) for i in range(len(drafts) + 1)])
    return verify_coupled(drafts, probabilities(logits, seq.params), noise)
