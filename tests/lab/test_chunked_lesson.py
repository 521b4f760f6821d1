"""chunked_lesson: notebook 06's plan, tables and closing table, over the tiny Llama on a fake clock
(1 ms per step plus 1 ms per token), so every figure is known in advance."""

from __future__ import annotations

import math

import pytest
from helpers import make_engine

from minieng.course.closing import chunked_prefill as closing_06
from minieng.lab.chunked_lesson import (
    budget_line,
    napkin_budget_answer,
    plan_long_prompt,
    reading_lines,
    step_lines,
    sweep_table,
)

B, P, L = 3, 8, 96  # decoders, their prompt tokens, the long prompt's tokens
PROBE = {
    "overhead_s": 0.0005,
    "decode_step_s": 0.004,
    "prefill_tok_s": 1000.0,
    "prefill_points": [[32, 0.033], [64, 0.065]],
}


@pytest.fixture
def plan(worded, fake_clock):
    engine = fake_clock(
        make_engine(worded, max_num_seqs=B + 1, max_num_batched_tokens=256, enable_prefix_caching=False)
    )
    return plan_long_prompt(
        engine,
        PROBE,
        num_decoders=B,
        decoder_prompt_tokens=P,
        long_prompt_tokens=L,
        chunks=4,
        sweep_chunks=[2, 8],
        repeats=1,
        stall_steps=32,
        budget_s=60,
        max_prompt_tokens=255,
        inject_after_steps=2,
        tail_steps=1,
    )


def test_the_plan_cuts_the_prompt_and_keys_the_cache_on_what_sets_the_figures(plan):
    assert len(plan.decoders) == B and all(len(p) == P for p in plan.decoders) and plan.long_prompt_tokens == L
    assert plan.budget == 32 and plan.budgets == [16, 32, 64]  # 24, 48 and 12 prompt tokens beside 3 decodes
    assert [plan.chunks_at(b) for b in plan.budgets] == [math.ceil(L / (b - B)) for b in plan.budgets] == [8, 4, 2]
    assert plan.warmup_runs == 0 and plan.choice == ""  # a CPU engine, a length given
    key = plan.cache_key("tiny")
    assert key["long_tokens"] == L and key["budgets"] == [16, 32, 64] and key["inject_after_steps"] == 2
    assert plan.cache_key("tiny") != plan.cache_key("other")
    assert plan.estimate_s() > plan.estimate_s([None]) > 0
    assert any(f"{L}-token newcomer" in line for line in plan.lines())


def test_the_sweep_tables_and_the_reading_on_a_fake_clock(plan):
    sweep = plan.sweep()
    off, taught = sweep["off"], plan.taught(sweep)
    assert off["ttft_ms"] == pytest.approx(1 + L) and taught["budget_tokens"] == 32
    assert taught["ttft_ms"] == pytest.approx(4 * (1 + B) + L)  # each chunk step also ran the decodes
    table = sweep_table(sweep)
    assert table[1].strip().startswith("chunking off") and len(table) == 2 + 1 + len(plan.budgets)
    assert f"{(1 + L) + (1 + B):.0f}" in table[1]  # the stalled gap: the prefill step, then a decode step
    steps = step_lines(off["runs"][0])
    assert any(line.split()[-2:] == [str(L), "0"] for line in steps)  # the prefill step ran no decode
    line = budget_line(off, taught, PROBE["overhead_s"])
    assert "budget    32" in line and f"{((1 + L) + (1 + B)) / (1 + 32):.1f}x shorter" in line
    reading = reading_lines(off, taught, PROBE["overhead_s"])
    assert reading[0].startswith(f"newcomer's TTFT: {4 * (1 + B) - 1:.0f} ms more over 4 chunk steps")
    assert reading[-1].startswith("=> compute-bound")  # 0.5 ms of a 33 ms step
    assert reading_lines(off, taught, 0.030)[-1].startswith("=> overhead-bound")
    run = plan.run_once(16)
    assert run["prefill_steps"] == 8 and not plan.engine.has_unfinished_requests()


def test_the_napkin_answer_applies_its_formula_at_every_budget(plan):
    answer = napkin_budget_answer(plan, prefill_ms=40.0, decode_ms=2.0)
    assert "| 16 | 8 | 7.00 | 56.00 |" in answer  # 40 / 8 + 2 and 40 + 8 x 2
    assert "| 64 | 2 | 22.00 | 44.00 |" in answer


def test_the_closing_table_judges_s7_and_the_budget_trade_off(plan, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path))
    sweep = plan.sweep()
    rows = closing_06.closing(sweep, plan)._repr_mimebundle_()
    rows = next(iter(rows.values()))["rows"]
    assert [r[0][:3] for r in rows] == ["S7:", "dec", "a s"]
    # Worst gap 101 -> 33 ms (3.1x shorter), TTFT 97 -> 113 ms (1.16x): protected, a small price.
    assert rows[0][3].startswith("holds") and "3.1x shorter" in rows[0][2]
    assert rows[1][3].startswith("holds")  # decode-first never skipped the decodes
    assert rows[2][3].startswith("holds")  # budget 16: shorter gaps, longer TTFT than budget 64
