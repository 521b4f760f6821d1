"""Drafters for speculative decoding: a small draft model, or prompt lookup (n-gram matching).

A drafter proposes up to k tokens per running sequence before a step; the target then verifies
them all in that one step (``verification.py``), so one read of the target's weights can yield
several tokens. Both drafters answer ``propose(seqs, k)`` with the draft tokens of each sequence.

For a sampled request the draft model draws its token at output position j as the race
argmax q_j / E_j with the request's own keyed noise E_j (``sampling.KeyedRandom``), the noise the
target's draw at j uses too: the draft is right as often as the two races agree, and the
verification (``verification.verify_coupled``) emits the target's draw either way. So what a seed
promises holds under speculation: a seeded request's tokens do not depend on how many drafts
were proposed, which varies with free draft blocks, the step budget and preemption.

The draft model keeps its own paged KV cache and block tables (``DraftSequence``). After each
verification the engine's sequence may have dropped some drafts; the drafter compares what its
cache holds with the sequence's tokens and rolls its cache back to their common prefix
(freeing trailing blocks) before drafting again.
"""

from __future__ import annotations

import torch

from minieng.config import EngineConfig, SamplingParams
from minieng.core.model_runner import ModelRunner, check_finite
from minieng.core.sampling import probabilities, race
from minieng.core.sequence import Sequence

GREEDY = SamplingParams(temperature=0)


class PromptLookupDrafter:
    """Prompt lookup decoding (Saxena 2023; vLLM's "ngram"): find the latest earlier occurrence of the
    sequence's last n tokens (n from ``ngram_max`` down to ``ngram_min``) and propose what followed it."""

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"ngram sizes must satisfy 1 <= ngram_min ({ngram_min}) <= ngram_max ({ngram_max})")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min

    def propose(self, seqs: list[Sequence], k: list[int]) -> list[list[int]]:
        return [self.lookup(s.all_token_ids, n) for s, n in zip(seqs, k)]

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):  # latest match first
                if tokens[start : start + n] == tail:
                    return tokens[start + n : start + n + k]
        return []

    def free(self, request_id: str) -> None:
        pass


class DraftSequence(Sequence):
    """The draft model's view of one request: the tokens its cache holds, in its own blocks."""

    def __init__(self, request_id: str):
        super().__init__(request_id, [], GREEDY, 0.0)


class DraftModelDrafter:
    """A draft model with its own paged KV cache, proposing k tokens by k batched single-token steps.

    ``runner``: the draft's ``ModelRunner``, with its own KV pool and block manager
    (``DraftModelDrafter.build`` makes it). The draft shares the target's tokenizer and vocabulary
    (``loader.check_same_tokenizer``).
    """

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.model = runner.model
        self.kv_cache = runner.kv_cache
        self.block_manager = runner.block_manager
        self.seqs: dict[str, DraftSequence] = {}

    def _forward(self, scheduled: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, list[tuple[Sequence, int]]]:
        """The draft model's forward over ``scheduled``: logits, and the rows' sequences in order."""
        lay = self.runner.layout(scheduled)
        logits = self.runner.run_layout(lay, self.block_manager.take_fresh_blocks())
        check_finite(logits, self.model)
        return logits, lay.sampling

    def free(self, request_id: str) -> None:
        """Forget a finished or preempted request's draft cache."""
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.block_manager.free(seq)

    def _sync(self, seq: Sequence) -> DraftSequence:
        """Roll the draft cache back to the longest prefix it shares with ``seq``'s tokens."""
        draft = self.seqs.setdefault(seq.request_id, DraftSequence(seq.request_id))
        tokens = seq.all_token_ids
        held = draft.prompt_token_ids
        same = 0
        limit = min(draft.num_computed_tokens, len(tokens) - 1)  # the newest token always runs
        while same < limit and held[same] == tokens[same]:
            same += 1
        self.block_manager.trim(draft, same)
        draft.prompt_token_ids = list(tokens)
        return draft

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], k: list[int]) -> list[list[int]]:
        """Up to ``k[i]`` draft tokens for ``seqs[i]``: greedy, or for a sampled request the race of
        its draft distribution q against the request's keyed noise. A sequence whose draft cache
        cannot grow gets fewer (or no) proposals, which changes the speed, not the output."""
        drafts = [self._sync(s) for s in seqs]
        tokens: list[list[int]] = [[] for _ in seqs]
        active = [i for i, n in enumerate(k) if n > 0]
        # When every draft was accepted, the last draft and the bonus token both lack draft KV:
        # run the first of the two alone, so that every draft forward below is a step of one token
        # per sequence (a decode step, a CUDA graph on a GPU) rather than a mixed, eager one.
        lagging = [
            drafts[i]
            for i in active
            if drafts[i].num_uncomputed_tokens == 2 and self.block_manager.can_allocate(drafts[i], 1)
        ]
        if lagging:
            for d in lagging:
                self.block_manager.allocate(d, 1)
            self._forward([(d, 1) for d in lagging])  # KV only: no position of it samples
            for d in lagging:
                d.num_computed_tokens += 1
        for step in range(max(k, default=0)):
            batch = []  # (index, draft sequence, tokens to run): its catch-up, then one at a time
            for i in active:
                d = drafts[i]
                n = d.num_uncomputed_tokens
                if step < k[i] and self.block_manager.can_allocate(d, n):
                    self.block_manager.allocate(d, n)
                    batch.append((i, d, n))
            if not batch:
                break
            logits, sampling = self._forward([(d, n) for _, d, n in batch])
            row_of = {id(d): row for row, (d, _) in enumerate(sampling)}  # the runner's row order
            for i, d, n in batch:
                row = row_of[id(d)]
                d.num_computed_tokens += n
                seq = seqs[i]
                if seq.params.greedy:
                    token = int(logits[row].argmax())
                else:  # the output position this draft stands at: the target races there too
                    position = len(seq.output_token_ids) + step
                    token = int(
                        race(probabilities(logits[row], seq.params), seq.rng.exponentials(position, logits.shape[-1]))
                    )
                tokens[i].append(token)
                d.prompt_token_ids.append(token)
            active = [i for i in active if len(tokens[i]) == step + 1]
        return tokens


def make_drafter(config: EngineConfig, draft_runner: ModelRunner | None):
    """The engine's drafter: prompt lookup (no ``draft_runner``), or the draft model that
    ``draft_runner`` runs over its own KV pool."""
    if draft_runner is None:
        return PromptLookupDrafter(config.ngram_max)
    return DraftModelDrafter(draft_runner)
