"""Notebook 00's plumbing: the ceilings against the datasheet, each phase's bound, the pencil problem's answer."""

from __future__ import annotations

from minieng.lab.hardware import against_datasheet, ceilings_answer, phase_bounds, phase_bounds_answer, step_table
from minieng.measure.flops_bytes import StepWork
from minieng.measure.peaks import Peak

MEASURED = Peak("measured cuda bfloat16", 700, 2800, "measured")
SHEET = Peak("H100 SXM", 989, 3350, "datasheet")
PREFILL = StepWork(matmul_flops=600e9, weight_bytes=1e9)  # 600 FLOP/byte
DECODE = StepWork(matmul_flops=1e9, weight_bytes=1e9)  # 1 FLOP/byte


def test_against_datasheet_gives_the_ridge_and_the_shares():
    lines = against_datasheet(MEASURED, SHEET)
    assert "ridge point    250.0 FLOP/byte" in lines[0]
    assert "ridge 295 FLOP/byte" in lines[1]
    assert lines[2] == "measured = 71% of the datasheet's FLOP/s, 84% of its bandwidth"
    assert "no datasheet" in against_datasheet(MEASURED, None)[-1]


def test_each_phase_bound_follows_the_ridge():
    assert phase_bounds(PREFILL, DECODE, 250) == "prefill compute, decode memory"
    assert phase_bounds(PREFILL, DECODE, 0.5) == "prefill compute, decode compute"
    assert phase_bounds(PREFILL, DECODE, 1000) == "prefill memory, decode memory"
    table = step_table([("prefill 512 tok", PREFILL), ("decode batch 1", DECODE)], 250)
    assert "600.0  compute" in table and "1.0  memory" in table


def test_the_ceilings_answer_uses_the_datasheet_or_works_a_cpu_out():
    assert "**295 FLOP/byte**" in ceilings_answer(SHEET, 16, "bfloat16")
    cpu = ceilings_answer(None, 4, "float32")
    assert "4 x 3e9 x 32 = **384 GFLOP/s**" in cpu and "**15 FLOP/byte**" in cpu


def test_the_phase_bounds_answer_sets_each_intensity_against_the_ridge():
    answer = phase_bounds_answer(PREFILL, DECODE, 250)
    assert "ridge of **250 FLOP/byte**" in answer
    assert "**600 FLOP/byte**, right of the ridge: compute-bound" in answer
    assert "**1 FLOP/byte**, left of the ridge: memory-bound" in answer
    assert "So **prefill compute, decode memory**" in answer
    assert "So **prefill memory, decode memory**" in phase_bounds_answer(PREFILL, DECODE, 1000)
