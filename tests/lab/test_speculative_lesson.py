"""Notebook 09's helpers (``step_weight_bytes``, ``draft_alone_engine``) and its closing table, over the
tiny Llama with its own weights in int8 as the draft."""

from __future__ import annotations

import pytest
from helpers import make_engine

from minieng import SamplingParams
from minieng.course.closing import speculative as closing_09
from minieng.lab.speculative import draft_alone_engine, step_weight_bytes


@pytest.fixture(scope="module")
def spec_engine(tiny_llama):
    return make_engine(tiny_llama[1], num_speculative_tokens=2, speculative_method="draft", draft_quantization="w8a8")


def test_the_int8_draft_reads_about_a_quarter_of_the_fp32_targets_weight_bytes(spec_engine):
    target, draft = step_weight_bytes(spec_engine.model), step_weight_bytes(spec_engine.drafter.model)
    matrices = sum(p.numel() for n, p in spec_engine.model.named_parameters() if "embed" not in n and "norm" not in n)
    assert target == 4 * matrices  # fp32: four bytes a weight of every matrix, the LM head's included
    assert 0.25 < draft / target < 0.3  # one byte a weight, and a float32 scale per output channel


def test_the_draft_alone_decodes_with_the_drafts_weights_not_the_targets(spec_engine):
    alone = draft_alone_engine(spec_engine, kv_cache_memory_gib=0.01)
    assert alone.model is spec_engine.drafter.model and alone.config.num_speculative_tokens == 0
    out = alone.generate([[1, 5, 9, 2]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert len(out.token_ids) == 6


def _rows(table) -> list[list[str]]:
    return next(iter(table._repr_mimebundle_().values()))["rows"]


def test_the_closing_table_judges_the_fastest_k_and_the_tokens(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path))
    rows = [
        {"k": 1, "tokens_per_step": 1.8, "v": 1.1, "c": 0.3, "measured_speedup_x": 1.2},
        {"k": 4, "tokens_per_step": 3.1, "v": 1.3, "c": 0.3, "measured_speedup_x": 1.5},
    ]
    table = _rows(closing_09.closing({"rows": rows}, [1, 2, 3], [1, 2, 3], "torch.float32"))
    assert "k=4: 3.10 tokens/step" in table[0][2] and table[0][3].startswith("holds")
    assert table[1] == [
        "greedy speculative output equals the target's",
        "lossless",
        "3 of 3 tokens identical",
        "holds: all 3 tokens identical",
    ]
    slower = [r | {"measured_speedup_x": 0.8} for r in rows]
    table = _rows(closing_09.closing({"rows": slower}, [1, 2, 4], [1, 2, 3], "torch.bfloat16"))
    assert table[0][3].startswith("does not hold here") and table[1][3].startswith("does not hold here")
    assert "2 of 3 tokens identical" in table[1][2] and "bfloat16" in table[1][3]
