"""A decode step's dispatched ops, counted (a budget, not a timing): each op is host time, and a
kernel launch on a GPU, whatever the bytes it moves."""

from __future__ import annotations

import pytest
import torch
from helpers import make_engine, random_prompts

from minieng import SamplingParams
from minieng.measure.op_count import OpCounter, count_layer_ops

COMPUTING_PER_LAYER = 14  # 4 products, 2 RMSNorms, 2 residual adds, RoPE, K/V write, K/V gather, SDPA, SiLU, x up
ALL_PER_LAYER = 24  # and 10 views


def decoding_engine(loaded, batch: int):
    engine = make_engine(loaded, max_num_seqs=8)
    for prompt in random_prompts([9, 14, 5, 11, 7, 3, 12, 6][:batch], loaded.model.config.vocab_size, seed=3):
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.step()  # the prefills
    return engine


@pytest.mark.parametrize("batch", [1, 8])
def test_a_decode_layer_dispatches_at_most_14_computing_ops_and_24_in_all(tiny_llama, batch):
    loaded = tiny_llama[1]
    engine = decoding_engine(loaded, batch)
    with count_layer_ops(loaded.model.layers) as counter:
        engine.step()
    assert engine.step_records[-1].num_decode_seqs == batch and engine.step_records[-1].num_prefill_tokens == 0
    layers = len(loaded.model.layers)
    count = counter.result()
    assert count.ops["scaled_dot_product_attention"] == layers  # one attention per layer: the count is of the layers
    assert count.computing <= COMPUTING_PER_LAYER * layers, count.ops
    assert count.total <= ALL_PER_LAYER * layers, count.ops
    # the ops the budget names: one K/V write and one K/V gather per layer, no repeat of K/V for GQA
    assert count.ops["index_copy_"] == layers and count.ops["index_select"] == layers
    assert "repeat_interleave" not in count.ops and "roll" not in count.ops


def test_the_whole_step_adds_a_bounded_number_of_ops_around_the_layers(tiny_llama):
    loaded = tiny_llama[1]
    engine = decoding_engine(loaded, 4)
    with OpCounter() as counter:
        engine.step()
    layers = len(loaded.model.layers)
    assert counter.result().total <= ALL_PER_LAYER * layers + 60, counter.result().ops  # embedding, tables, head


def test_the_counter_splits_views_from_computing_ops():
    x = torch.ones(4, 6)
    with OpCounter() as counter:
        (x.view(2, 12).transpose(0, 1) * 2).sum()
    count = counter.result()
    assert count.ops["view"] == 1 and count.ops["transpose"] == 1
    assert count.views == 2 and count.computing == 2  # mul, sum
