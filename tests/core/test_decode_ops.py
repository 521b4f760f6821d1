"""A decode step's dispatched ops, counted (a budget, not a timing): each op is host time, and a
kernel launch on a GPU, whatever the bytes it moves. Counted in float32 (the CPU's dtype) and in
bfloat16 (every GPU's): the same budget, on the eager forward and on the one the CUDA graphs
capture (``DecodeGraphs`` with ``capture=False`` runs it on the CPU)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from helpers import make_engine, random_prompts

from minieng import SamplingParams
from minieng.measure.op_count import OpCounter, count_layer_ops

COMPUTING_PER_LAYER = 14  # 4 products, 2 RMSNorms, 2 residual adds, RoPE, K/V write, K/V gather, SDPA, SiLU, x up
ALL_PER_LAYER = 24  # and 10 views


def decoding_engine(loaded, batch: int, dtype: torch.dtype = torch.float32):
    if dtype != torch.float32:
        loaded = dataclasses.replace(loaded, model=copy.deepcopy(loaded.model).to(dtype))
    engine = make_engine(loaded, max_num_seqs=8)
    for prompt in random_prompts([9, 14, 5, 11, 7, 3, 12, 6][:batch], loaded.model.config.vocab_size, seed=3):
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.step()  # the prefills
    return engine


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("batch", [1, 8])
def test_a_decode_layer_dispatches_at_most_14_computing_ops_and_24_in_all(tiny_llama, batch, dtype):
    engine = decoding_engine(tiny_llama[1], batch, dtype)
    model = engine.model
    with count_layer_ops(model.layers) as counter:
        engine.step()
    assert engine.step_records[-1].num_decode_seqs == batch and engine.step_records[-1].num_prefill_tokens == 0
    layers = len(model.layers)
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


def test_the_graphed_decode_forward_keeps_the_budget_in_bf16_and_sdpa_never_sees_a_bool_mask(tiny_llama):
    """The forward a CUDA graph captures (the static buffers, run eagerly on the CPU), in bf16: 14
    computing ops a layer, and every mask SDPA gets is additive in the model's dtype."""
    from torch.nn import functional as F

    from minieng.wings.fast_paths.cuda_graph import DecodeGraphs

    engine = decoding_engine(tiny_llama[1], 4, torch.bfloat16)
    model = engine.model
    graphs = DecodeGraphs(model, engine.runner.kv_cache, 8, 64, 1 << 20, capture=False)
    lay = engine.runner.layout([(seq, 1) for seq in engine.scheduler.running])
    masks = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)

    with count_layer_ops(model.layers) as counter:
        F.scaled_dot_product_attention = spy
        try:
            assert graphs.run(lay) is not None
        finally:
            F.scaled_dot_product_attention = sdpa
    layers = len(model.layers)
    assert counter.result().computing <= COMPUTING_PER_LAYER * layers, counter.result().ops
    assert masks and all(m is not None and m.dtype == torch.bfloat16 for m in masks)
