"""KV block accounting and the prefix cache: which physical blocks each sequence holds.

Pure bookkeeping, no tensors. The KV cache (``kv_cache.py``) is a pool of ``num_blocks`` blocks
of ``block_size`` token slots. A sequence's ``block_table`` lists its blocks in token order, so
token ``i`` lives in slot ``block_table[i // block_size] * block_size + i % block_size`` (its
``slot_mapping`` entry).

Prefix cache (docs/architecture.md, The prefix cache, as vLLM's automatic prefix caching): once a block is full, its
key is a strong hash chaining the parent block's key with the block's token ids (and any extra
keys that change the KV, such as a LoRA id), so equal keys mean equal prefixes, not only equal
blocks. The block keeps its key and token ids after its sequence frees it: with ref count 0 it
waits on the free list, least recently freed first, and a later request whose prompt starts with
the same tokens takes it back instead of recomputing it. Only when the free list hands it out for
new tokens is it evicted from the cache. Only full blocks are shared, so a shared prefix shorter
than one block is never a hit (the block-size floor).

The key finds a candidate; it does not decide the hit. A block's KV depends on every token
before it, so a hit requires the block's own token ids *and* its parent to match: each cached
block records its parent's serial number (a number given to a block each time it enters the
cache, never reused) and its extra keys, and ``match_prefix`` accepts block i only if its tokens
are the prompt's block i and its parent is the block it accepted at i - 1. Any other case is a
miss. So a hash collision, even a hash that returns one value for every block, can cost hits
(the first entry of a key stays until it is evicted) but never serve KV computed for another
prefix; the tests run the cache with such a hash. A block whose parent was evicted can no longer
be reached, since its parent's serial is gone; that is rare, as a sequence frees its tail first,
so a child is evicted before its parent.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from minieng.core.sequence import Sequence
from minieng.units import cdiv


def block_hash(parent: bytes, token_ids, extra_keys: tuple = ()) -> bytes:
    """SHA-256 of the parent block's key, this block's token ids and the extra keys."""
    h = hashlib.sha256(parent)
    h.update(array("q", token_ids).tobytes())
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()


class BlockManager:
    """Allocates, shares and frees KV blocks. Raises ``RuntimeError`` when asked for blocks it lacks.

    ``enable_prefix_caching=False`` keeps the same accounting with the cache switched off: freed
    blocks carry no key and no request ever hits.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        # Blocks with ref count 0, least recently freed first (the next to be handed out).
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.block_keys: list[bytes | None] = [None] * num_blocks  # key of a full, cached block
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        # What else a cached block's KV depends on: (its parent's serial, 0 for a first block;
        # the extra keys). Serials number cache entries, 1, 2, ..., and are never reused.
        self.block_parents: list[tuple[int, tuple] | None] = [None] * num_blocks
        self.block_serials: list[int] = [0] * num_blocks  # 0: not cached
        self._next_serial = 1
        self.cached: dict[bytes, int] = {}  # key -> block id
        self.num_evictions = 0  # cached blocks handed out for new tokens (cumulative)
        # Blocks handed out since the model runner last asked (it zeroes their KV before use).
        self.fresh_blocks: list[int] = []

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    # -- the prefix cache -----------------------------------------------------------------------

    def _keys(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """Keys of ``seq``'s first ``num_blocks`` full blocks, memoized on the sequence."""
        keys, bs = seq.block_keys, self.block_size
        tokens = seq.all_token_ids if len(keys) < num_blocks else None
        while len(keys) < num_blocks:
            i = len(keys)
            keys.append(block_hash(keys[-1] if keys else b"", tokens[i * bs : (i + 1) * bs], seq.extra_keys))
        return keys[:num_blocks]

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the longest prefix of ``seq``'s tokens. Changes nothing.

        At most ``(num_tokens - 1) // block_size`` blocks: the last known token is always
        computed, so that even a fully cached prompt yields logits. A request that still owes
        prompt log-probabilities gets no block at or after the first position that owes one
        (``Sequence.prompt_logprobs_from``): those logits must be computed, as vLLM V1 skips
        reading the cache for requests with ``prompt_logprobs`` (it may still write to it).
        """
        if not self.enable_prefix_caching:
            return []
        bs, tokens = self.block_size, seq.all_token_ids
        limit = (len(tokens) - 1) // bs
        if (owed := seq.prompt_logprobs_from) is not None:
            limit = min(limit, owed // bs)
        hits, parent = [], 0
        for i, key in enumerate(self._keys(seq, limit)):
            block = self.cached.get(key)
            if block is None or not self._holds(block, tokens[i * bs : (i + 1) * bs], parent, seq.extra_keys):
                break
            hits.append(block)
            parent = self.block_serials[block]
        return hits

    def _holds(self, block: int, token_ids: list[int], parent: int, extra_keys: tuple) -> bool:
        """Whether cached ``block`` holds the KV of ``token_ids`` after the prefix whose last block
        has serial ``parent`` (0: at the start), with ``extra_keys``: the hit check, hash aside."""
        return self.block_tokens[block] == tuple(token_ids) and self.block_parents[block] == (parent, extra_keys)

    def take_prefix(self, seq: Sequence, hits: list[int]) -> None:
        """Give a sequence with nothing computed the cached blocks ``hits`` (from ``match_prefix``)."""
        assert not seq.block_table and seq.num_computed_tokens == 0, "prefix hits start a sequence"
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]
            self.ref_counts[block] += 1
        seq.block_table = list(hits)
        seq.num_computed_tokens = len(hits) * self.block_size

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks of ``seq`` that its computed tokens have filled (after a step)."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed_tokens // self.block_size
        tokens, bs = seq.all_token_ids, self.block_size
        parent = 0  # serial of the cached block that stands for the prefix before block i
        for i, key in enumerate(self._keys(seq, full)):
            block, block_tokens = seq.block_table[i], tokens[i * bs : (i + 1) * bs]
            if self.block_keys[block] is None:  # computed by this sequence, not taken from the cache
                entry = self.cached.get(key)
                if entry is None:
                    self.block_keys[block] = key
                    self.block_tokens[block] = tuple(block_tokens)
                    self.block_parents[block] = (parent, seq.extra_keys)
                    self.block_serials[block], self._next_serial = self._next_serial, self._next_serial + 1
                    self.cached[key] = block
                elif self._holds(entry, block_tokens, parent, seq.extra_keys):
                    block = entry  # an equal block was cached first: the next block chains to it
                else:
                    break  # the key serves another prefix (a collision): the first entry stays
            parent = self.block_serials[block]

    def _uncache(self, block: int) -> None:
        """Drop ``block``'s cache entry (its KV stays valid for the sequences holding it)."""
        if self.cached.get(self.block_keys[block]) == block:
            del self.cached[self.block_keys[block]]
        self.block_keys[block] = self.block_tokens[block] = self.block_parents[block] = None
        self.block_serials[block] = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (as vLLM's ``reset_prefix_cache``): experiments start cold."""
        self.cached.clear()
        self.block_keys = [None] * self.num_blocks
        self.block_tokens = [None] * self.num_blocks
        self.block_parents = [None] * self.num_blocks
        self.block_serials = [0] * self.num_blocks

    @contextmanager
    def caching(self, on: bool) -> Iterator[None]:
        """Within the block: the cache emptied and switched ``on`` (or off); the switch restored after.
        Experiments use it to start cold and to measure with and without the cache."""
        was = self.enable_prefix_caching
        self.reset_prefix_cache()
        self.enable_prefix_caching = on
        try:
            yield
        finally:
            self.enable_prefix_caching = was

    # -- allocation -----------------------------------------------------------------------------

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int, hits: list[int] = ()) -> int:
        """Free blocks ``seq`` would consume for ``num_new_tokens`` beyond its computed tokens
        (after taking the prefix ``hits``, whose idle blocks leave the free list too)."""
        held = len(seq.block_table) + len(hits)
        computed = seq.num_computed_tokens + len(hits) * self.block_size
        idle_hits = sum(1 for b in hits if self.ref_counts[b] == 0)
        return max(0, cdiv(computed + num_new_tokens, self.block_size) - held) + idle_hits

    def can_allocate(self, seq: Sequence, num_new_tokens: int, hits: list[int] = ()) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens, hits) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Append blocks to ``seq.block_table`` so ``num_new_tokens`` more tokens fit."""
        needed = self.num_blocks_needed(seq, num_new_tokens)
        if needed > self.num_free_blocks:
            raise RuntimeError(
                f"out of KV blocks: {seq.request_id} needs {needed}, "
                f"{self.num_free_blocks} free; the scheduler should have preempted"
            )
        for _ in range(needed):
            block, _ = self.free_blocks.popitem(last=False)  # least recently freed
            assert self.ref_counts[block] == 0, f"free block {block} has refs"
            if self.block_keys[block] is not None:  # evict: its KV is about to be overwritten
                self._uncache(block)
                self.num_evictions += 1
            self.ref_counts[block] = 1
            seq.block_table.append(block)
            self.fresh_blocks.append(block)

    def take_fresh_blocks(self) -> list[int]:
        """The blocks allocated since the last call (whose KV slots hold stale values), once."""
        fresh, self.fresh_blocks = self.fresh_blocks, []
        return fresh

    def free(self, seq: Sequence) -> None:
        """Release every block of ``seq`` (finish or preemption) and reset its computed tokens.

        Blocks are freed last to first, so a sequence's tail (the least shareable part) is the
        first to be evicted.
        """
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, f"block {block} freed twice"
            if self.ref_counts[block] == 0:
                self.free_blocks[block] = None
        seq.block_table = []
        seq.num_computed_tokens = 0

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Keep only the blocks that hold ``seq``'s first ``num_tokens`` tokens (speculative
        rollback: the KV of rejected draft tokens is dropped with its trailing blocks)."""
        keep = cdiv(num_tokens, self.block_size)
        for block in reversed(seq.block_table[keep:]):
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] == 0, f"trimmed block {block} is shared"
            self.free_blocks[block] = None
        del seq.block_table[keep:]
        seq.num_computed_tokens = min(seq.num_computed_tokens, num_tokens)

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Cache slots of token positions ``start..end-1`` of ``seq``."""
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def check_invariants(self, seqs: list[Sequence]) -> None:
        """Assert the accounting is consistent with the sequences holding blocks (tests).

        A free block has ref count 0; a ref count equals the block tables holding the block; every
        cache entry points at a block that still carries that key (none at a reallocated block).
        """
        holders = [0] * self.num_blocks
        for seq in seqs:
            for block in seq.block_table:
                holders[block] += 1
        for block in range(self.num_blocks):
            assert self.ref_counts[block] == holders[block], (
                f"block {block}: ref count {self.ref_counts[block]} != {holders[block]} holders"
            )
            assert (block in self.free_blocks) == (holders[block] == 0), f"block {block} free/used mismatch"
        for key, block in self.cached.items():
            assert self.block_keys[block] == key, f"cache entry points at block {block}, which was reallocated"
            assert self.block_serials[block] > 0 and self.block_parents[block] is not None, (
                f"cached block {block} has no serial or parent"
            )
