"""step_flops: the engine's own steps under FlopCounterMode, a mixed batch, against ``step_work``.

FlopCounterMode counts matrix products only (aten.mm, addmm, bmm, ...): not biases, norms,
RoPE, softmax or SiLU. ``flops_bytes.step_work`` counts the same things, so the comparisons are
like for like: a bias inside ``addmm`` is counted by neither.
"""

from __future__ import annotations

import pytest
import torch

from minieng.config import ModelConfig
from minieng.lab.step_flops import counted_steps


def tiny_engine():
    from transformers import LlamaConfig

    from minieng import EngineConfig, LLMEngine
    from minieng.model.loader import LoadedModel, build_model, randomize

    hf = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
    )
    model = build_model(ModelConfig.from_hf(hf), torch.float32, torch.device("cpu"), 256)
    randomize(model)
    config = EngineConfig(device="cpu", num_kv_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=16)
    return LLMEngine(config, loaded=LoadedModel(model, None, hf, set(), None))


def test_engine_steps_match_the_counted_flops():
    """Every step of a continuous batch (prefill chunks beside decodes), counted by FlopCounterMode:
    the linear FLOPs that ran equal step_work of the step's ``StepRecord.chunks``; attention,
    counted as SDPA's dense rectangle (``flop_count.register_flop_formulas`` adds the CPU kernel's
    formula), is step_work's causal count plus the masked triangles, and for decodes at least the
    causal count (keys padded to whole blocks)."""
    engine = tiny_engine()
    rows = counted_steps(engine, [list(range(1, 12)), list(range(3, 30)), [5, 6, 7]], max_tokens=4)
    saw_mixed = False
    for row in rows:
        assert row["counted_linear_flops"] == row["linear_flops"] > 0
        assert row["counted_attention_flops"] >= row["attention_flops"] + row["masked_attention_flops"] > 0
        if all(n > 1 for n, _, _ in row["chunks"]):  # prefill chunks only: no padding, exact
            assert row["counted_attention_flops"] == row["attention_flops"] + row["masked_attention_flops"]
        assert row["other_flops"] == {}
        saw_mixed |= any(n == 1 for n, _, _ in row["chunks"]) and any(n > 1 for n, _, _ in row["chunks"])
    assert saw_mixed, "the workload should mix decodes and prefill chunks in one step"
    assert any(all(n > 1 for n, _, _ in row["chunks"]) for row in rows)


def test_counting_refuses_a_busy_engine():
    from minieng import SamplingParams

    engine = tiny_engine()
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="idle"):
        counted_steps(engine, [[4, 5]], 2)


def test_the_printout_splits_attention_into_causal_masked_and_padding():
    from minieng.lab.step_flops import counting_engine, format_counted_steps

    engine = tiny_engine()
    assert counting_engine(engine, 64) is engine  # an eager engine counts itself
    rows = counted_steps(engine, [list(range(1, 13))], max_tokens=2)
    lines = format_counted_steps(rows, engine.model_config)
    assert lines[0] == "prefill of 12 tokens:" and "(equal)" in lines[1]
    assert "causal" in lines[2] and "masked triangle" in lines[2] and lines[3].startswith("decode after 12 tokens")
    rows[0]["counted_linear_flops"] += 2
    assert "(DIFFERENT)" in format_counted_steps(rows, engine.model_config)[1]
