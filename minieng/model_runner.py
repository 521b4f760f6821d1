"""From a scheduled batch to sampled tokens: builds the step's tensors, runs the model, samples.

The runner decides nothing: the scheduler said which sequences run with how many tokens; the
runner lays them out (decodes first, then prefill chunks), computes slots from the block
tables, runs one forward pass and samples one token for every sequence whose chunk reached the
end of its known tokens. A prefill chunk that stops mid-prompt produces no token.
"""

from __future__ import annotations

import torch

from .attention import build_metadata
from .block_manager import BlockManager
from .kv_cache import KVCache
from .model import LlamaForCausalLM
from .sampling import sample
from .scheduler import SchedulerOutput
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, block_manager: BlockManager,
                 device: torch.device):
        self.model = model
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.device = device

    def prepare(self, scheduled: list[tuple[Sequence, int]]):
        """Lay out a step. ``scheduled``: (sequence, new tokens), decodes (1 token) first.

        Returns input_ids, positions, metadata, logits_indices, and the sequences that sample.
        """
        input_ids, positions, slot_mapping = [], [], []
        decodes, prefills = [], []
        logits_indices, sampling_seqs = [], []
        for seq, n in scheduled:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            input_ids.extend(seq.all_token_ids[start:end])
            positions.extend(range(start, end))
            slot_mapping.extend(self.block_manager.slot_mapping(seq, start, end))
            if not SchedulerOutput.is_prefill(seq, n):
                assert not prefills, "decodes must come before prefill chunks"
                decodes.append((seq.block_table, end))
            else:
                prefills.append((n, seq.block_table, end))
            if end == seq.num_tokens:  # the chunk reaches the newest token: sample the next one
                logits_indices.append(len(input_ids) - 1)
                sampling_seqs.append(seq)
        dev = self.device
        meta = build_metadata(slot_mapping, decodes, prefills, self.block_manager.block_size, dev)
        return (torch.tensor(input_ids, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev),
                meta, torch.tensor(logits_indices, dtype=torch.long, device=dev), sampling_seqs)

    def execute(self, scheduled: list[tuple[Sequence, int]]) -> dict[str, int]:
        """Run one step; return the sampled token of each sequence that samples, by request id."""
        input_ids, positions, meta, logits_indices, seqs = self.prepare(scheduled)
        logits = self.model(input_ids, positions, self.kv_cache, meta, logits_indices)
        tokens = sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        return {seq.request_id: tok for seq, tok in zip(seqs, tokens)}
