"""Notebooks 03 and 11's prefill experiments on the tiny model: prompts prefilled together in one step
(claim S16), and the same engine at two thread counts (claim S17)."""

from __future__ import annotations

import pytest
import torch
from helpers import make_engine

from minieng.lab.phase_levers import prefill_batch_sweep, thread_knob
from minieng.measure.peaks import Peak

PEAK = Peak("measured cpu float32", 0.07, 15.0, "measured")


def test_prefill_batch_sweep_runs_each_batch_in_one_step(worded):
    # A token budget of 16: without the sweep raising it, two 16-token prompts would take two steps.
    engine = make_engine(worded, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=True)
    rows = prefill_batch_sweep(engine, 16, [1, 2], peaks=[PEAK], warmup=True)
    assert [r["batch_size"] for r in rows] == [1, 2]
    for r in rows:
        assert r["prompt_tokens"] == 16 and r["step_s"] > 0
        assert r["tok_s"] == pytest.approx(r["batch_size"] * 16 / r["step_s"])
        util = r["utilization"]
        assert util["num_steps"] == 1 and util["measured"]["mfu_percent"] > 0
    # The second row's one step prefilled both prompts.
    last = [s for s in engine.step_records if s.num_prefill_tokens > 0][-1]
    assert last.num_prefill_tokens == 32 and last.num_prefill_seqs == 2
    # The engine's own settings come back.
    assert engine.config.max_num_batched_tokens == 16 and engine.block_manager.enable_prefix_caching


def test_prefill_batch_sweep_refuses_what_cannot_run_in_one_step(worded):
    engine = make_engine(worded, max_num_seqs=2, num_kv_blocks=8, max_model_len=32)  # 8 blocks of 4 tokens
    with pytest.raises(ValueError, match="max_num_seqs"):
        prefill_batch_sweep(engine, 8, [1, 4])
    with pytest.raises(ValueError, match="KV blocks"):
        prefill_batch_sweep(engine, 16, [1, 2])
    with pytest.raises(ValueError, match="batch sizes"):
        prefill_batch_sweep(engine, 8, [])


def test_thread_knob_measures_each_count_and_restores_the_threads(worded):
    engine = make_engine(worded)
    before = torch.get_num_threads()
    rows = thread_knob(
        engine, 16, 3, threads=[1, before], decode_prompt_tokens=8, repeats=1, matmul_n=64, copy_bytes=1 << 20
    )
    assert [r["threads"] for r in rows] == [1, before]
    for r in rows:
        assert r["matmul_flop_s"] > 0 and r["copy_bytes_s"] > 0 and r["ttft_s"] > 0 and r["tpot_s"] > 0
    assert torch.get_num_threads() == before


def test_thread_knob_restores_the_threads_when_it_raises(worded, monkeypatch):
    engine = make_engine(worded)
    before = torch.get_num_threads()

    def broken(*args, **kwargs):
        raise RuntimeError("the matmul failed")

    monkeypatch.setattr("minieng.lab.phase_levers.measure_matmul", broken)
    with pytest.raises(RuntimeError, match="matmul failed"):
        thread_knob(engine, 16, 3, threads=[1], decode_prompt_tokens=8, repeats=1)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="TPOT needs 2"):
        thread_knob(engine, 16, 1)
    with pytest.raises(ValueError, match="each >= 1"):
        thread_knob(engine, 16, 3, threads=[0])
