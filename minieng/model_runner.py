"""From a scheduled batch to sampled tokens: builds the step's tensors, runs the model, samples.

The runner decides nothing: the scheduler said which sequences run with how many tokens; the
runner lays them out (decodes first, then prefill chunks), computes slots from the block
tables, runs one forward pass and samples one token for every sequence whose chunk reached the
end of its known tokens. A prefill chunk that stops mid-prompt produces no token. A decode that
carries k draft tokens gets logits at all k + 1 positions and emits what verification accepts.
"""

from __future__ import annotations

import time

import torch

from .attention import build_metadata
from .hardware import synchronize
from .block_manager import BlockManager
from .kv_cache import KVCache
from .model import LlamaForCausalLM
from .rejection import verify_coupled, verify_greedy
from .sampling import probabilities, sample
from .scheduler import SchedulerOutput
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, block_manager: BlockManager,
                 device: torch.device):
        self.model = model
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.device = device
        self.last_forward_s = 0.0

    def prepare(self, scheduled: list[tuple[Sequence, int]]):
        """Lay out a step. ``scheduled``: (sequence, new tokens): single-token decodes first, then
        decodes with draft tokens (the newest token + its drafts), then prefill chunks.

        Returns input_ids, positions, metadata, logits_indices, and per sequence that samples
        ``(sequence, number of logits rows)``: 1, or k + 1 for a decode verifying k drafts.
        """
        input_ids, positions, slot_mapping = [], [], []
        decodes, chunks = [], []
        logits_indices, sampling = [], []
        for seq, n in scheduled:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            known = seq.all_token_ids[start:end]
            input_ids.extend(known + seq.spec_token_ids[: n - len(known)])
            positions.extend(range(start, end))
            slot_mapping.extend(self.block_manager.slot_mapping(seq, start, end))
            if n == 1 and not SchedulerOutput.is_prefill(seq, n):
                assert not chunks, "single-token decodes must come first"
                decodes.append((seq.block_table, end))
            else:  # a prefill chunk, or a decode verifying drafts: several queries, causal
                chunks.append((n, seq.block_table, end))
            if end >= seq.num_tokens:  # the chunk reaches the newest token: sample after it
                rows = end - seq.num_tokens + 1  # 1, or k + 1 when verifying k drafts
                logits_indices.extend(range(len(input_ids) - rows, len(input_ids)))
                sampling.append((seq, rows))
        dev = self.device
        meta = build_metadata(slot_mapping, decodes, chunks, self.block_manager.block_size, dev)
        return (torch.tensor(input_ids, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev),
                meta, torch.tensor(logits_indices, dtype=torch.long, device=dev), sampling)

    def execute(self, scheduled: list[tuple[Sequence, int]]) -> dict[str, list[int]]:
        """Run one step; return the tokens each sampling sequence emits, by request id: one token,
        or, for a decode with drafts, the accepted drafts and one more (``rejection.py``)."""
        input_ids, positions, meta, logits_indices, sampling = self.prepare(scheduled)
        start = time.perf_counter()
        logits = self.model(input_ids, positions, self.kv_cache, meta, logits_indices)
        synchronize(self.device)
        self.last_forward_s = time.perf_counter() - start  # the model alone: the rest is bookkeeping
        plain = [(i, seq) for i, (seq, rows) in enumerate(sampling) if rows == 1]
        out: dict[str, list[int]] = {}
        if plain:
            rows = torch.tensor([self._row(sampling, i) for i, _ in plain], device=logits.device)
            tokens = sample(logits[rows], [s.params for _, s in plain], [s.rng for _, s in plain],
                            [len(s.output_token_ids) for _, s in plain])
            out.update({seq.request_id: [tok] for (_, seq), tok in zip(plain, tokens)})
        for i, (seq, rows) in enumerate(sampling):
            if rows > 1:
                first = self._row(sampling, i)
                out[seq.request_id] = verify(seq, logits[first:first + rows])
        return out

    @staticmethod
    def _row(sampling: list[tuple[Sequence, int]], i: int) -> int:
        """The first logits row of the ``i``-th sampling sequence."""
        return sum(rows for _, rows in sampling[:i])


def verify(seq: Sequence, logits: torch.Tensor) -> list[int]:
    """Check ``seq``'s draft tokens against the target's ``logits`` [k + 1, vocab]: greedy, or
    coupled with the request's keyed noise (``rejection.py`` says why not the rejection rule)."""
    drafts = seq.spec_token_ids
    if seq.params.greedy:
        return verify_greedy(drafts, logits)
    first = len(seq.output_token_ids)  # the output position the first draft stands at
    noise = torch.stack([seq.rng.exponentials(first + i, logits.shape[-1]) for i in range(len(drafts) + 1)])
    return verify_coupled(drafts, probabilities(logits, seq.params), noise)
