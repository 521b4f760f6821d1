"""KV block accounting: which physical blocks each sequence holds. Pure bookkeeping, no tensors.

The KV cache (``kv_cache.py``) is a pool of ``num_blocks`` blocks of ``block_size`` token slots.
A sequence's ``block_table`` lists its blocks in token order, so token ``i`` lives in slot
``block_table[i // block_size] * block_size + i % block_size`` (its ``slot_mapping`` entry).
Blocks carry ref counts so that a later prefix cache can share them between sequences.
"""

from __future__ import annotations

from collections import deque

from .sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """Allocates and frees KV blocks. Raises ``RuntimeError`` when asked for blocks it lacks."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_block_ids)

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks ``seq`` must gain to hold ``num_new_tokens`` beyond its computed tokens."""
        total = cdiv(seq.num_computed_tokens + num_new_tokens, self.block_size)
        return max(0, total - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Append blocks to ``seq.block_table`` so ``num_new_tokens`` more tokens fit."""
        needed = self.num_blocks_needed(seq, num_new_tokens)
        if needed > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: {seq.request_id} needs {needed}, "
                               f"{self.num_free_blocks} free; the scheduler should have preempted")
        for _ in range(needed):
            block_id = self.free_block_ids.popleft()
            assert self.ref_counts[block_id] == 0, f"free block {block_id} has refs"
            self.ref_counts[block_id] = 1
            seq.block_table.append(block_id)

    def free(self, seq: Sequence) -> None:
        """Release every block of ``seq`` (finish or preemption) and reset its computed tokens."""
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            assert self.ref_counts[block_id] >= 0, f"block {block_id} freed twice"
            if self.ref_counts[block_id] == 0:
                self.free_block_ids.append(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Cache slots of token positions ``start..end-1`` of ``seq``."""
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def check_invariants(self, seqs: list[Sequence]) -> None:
        """Assert the accounting is consistent with the sequences holding blocks (tests)."""
        holders = [0] * self.num_blocks
        for seq in seqs:
            for block_id in seq.block_table:
                holders[block_id] += 1
        free = set(self.free_block_ids)
        assert len(free) == len(self.free_block_ids), "a block is on the free list twice"
        for block_id in range(self.num_blocks):
            assert self.ref_counts[block_id] == holders[block_id], (
                f"block {block_id}: ref count {self.ref_counts[block_id]} != {holders[block_id]} holders")
            assert (block_id in free) == (holders[block_id] == 0), f"block {block_id} free/used mismatch"
