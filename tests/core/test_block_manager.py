"""The KV block allocator: ref counts, the free list, slot mapping, and its invariant checker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minieng import SamplingParams
from minieng.core.block_manager import BlockManager
from minieng.core.sequence import Sequence
from minieng.units import cdiv


def make_seq(num_tokens: int, name: str = "s") -> Sequence:
    return Sequence(name, [1] * num_tokens, SamplingParams(), 0.0)


def test_allocate_and_free_keep_ref_counts():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(10)
    assert bm.num_blocks_needed(seq, 10) == 3
    bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert all(bm.ref_counts[b] == 1 for b in seq.block_table)
    assert bm.num_free_blocks == 5 and bm.num_used_blocks == 3
    assert not set(seq.block_table) & set(bm.free_blocks)
    seq.num_computed_tokens = 10
    assert bm.num_blocks_needed(seq, 2) == 0  # 12 tokens fit the 3 blocks
    assert bm.num_blocks_needed(seq, 3) == 1
    bm.allocate(seq, 2)
    assert len(seq.block_table) == 3, "no block is allocated when the last one has room"
    bm.check_invariants([seq])
    held = list(seq.block_table)
    bm.free(seq)
    assert seq.block_table == [] and seq.num_computed_tokens == 0
    assert bm.num_free_blocks == 8 and all(r == 0 for r in bm.ref_counts)
    assert set(held) <= set(bm.free_blocks)
    bm.check_invariants([seq])


def test_two_sequences_never_share_a_block():
    bm = BlockManager(num_blocks=6, block_size=2)
    a, b = make_seq(5, "a"), make_seq(7, "b")
    bm.allocate(a, 5)
    bm.allocate(b, 6)
    assert not set(a.block_table) & set(b.block_table)
    assert bm.num_free_blocks == 0
    bm.check_invariants([a, b])


def test_out_of_blocks_is_a_runtime_error_without_side_effects():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq(9)
    assert not bm.can_allocate(seq, 9)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.allocate(seq, 9)
    assert seq.block_table == [] and bm.num_free_blocks == 2
    bm.check_invariants([seq])


def test_double_free_is_caught():
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq(4)
    bm.allocate(seq, 4)
    table = list(seq.block_table)
    bm.free(seq)
    seq.block_table = table  # a stale table freed again
    with pytest.raises(AssertionError, match="freed twice"):
        bm.free(seq)


def test_slot_mapping_follows_the_block_table():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(11)
    seq.block_table = [5, 2, 7]
    assert bm.slot_mapping(seq, 0, 11) == [20, 21, 22, 23, 8, 9, 10, 11, 28, 29, 30]
    assert bm.slot_mapping(seq, 3, 6) == [23, 8, 9]
    assert bm.slot_mapping(seq, 4, 4) == []


def test_check_invariants_catches_corruption():
    bm = BlockManager(num_blocks=4, block_size=2)
    seq = make_seq(3)
    bm.allocate(seq, 3)
    bm.check_invariants([seq])
    bm.ref_counts[seq.block_table[0]] += 1
    with pytest.raises(AssertionError, match="ref count"):
        bm.check_invariants([seq])
    bm.ref_counts[seq.block_table[0]] -= 1
    bm.free_blocks[seq.block_table[1]] = None  # a held block also on the free list
    with pytest.raises(AssertionError):
        bm.check_invariants([seq])
    del bm.free_blocks[seq.block_table[1]]
    bm.check_invariants([seq])
    with pytest.raises(AssertionError):
        bm.check_invariants([])  # the blocks have an owner the checker was not told about


def test_cdiv():
    assert [cdiv(a, 4) for a in range(9)] == [0, 1, 1, 1, 1, 2, 2, 2, 2]


ops = st.lists(st.tuples(st.sampled_from(["grow", "free"]), st.integers(0, 5), st.integers(1, 12)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(1, 24), block_size=st.integers(1, 8), ops=ops)
def test_random_allocate_and_free_keep_the_invariants(num_blocks, block_size, ops):
    bm = BlockManager(num_blocks, block_size)
    seqs = [make_seq(1, str(i)) for i in range(6)]
    for op, i, n in ops:
        seq = seqs[i]
        if op == "grow":
            # The engine's pattern: room for n new tokens, then they are computed.
            seq.prompt_token_ids = [1] * (seq.num_computed_tokens + n)
            if bm.can_allocate(seq, n):
                before = bm.num_free_blocks
                bm.allocate(seq, n)
                seq.num_computed_tokens += n
                assert len(seq.block_table) == cdiv(seq.num_computed_tokens, block_size)
                assert bm.num_free_blocks == before - (
                    len(seq.block_table) - cdiv(seq.num_computed_tokens - n, block_size)
                )
            else:
                with pytest.raises(RuntimeError):
                    bm.allocate(seq, n)
        else:
            bm.free(seq)
        bm.check_invariants(seqs)
        assert bm.num_free_blocks + sum(len(s.block_table) for s in seqs) == num_blocks
    for seq in seqs:
        bm.free(seq)
    assert bm.num_free_blocks == num_blocks and all(r == 0 for r in bm.ref_counts)
