"""probes: the warm-up, the two phases timed on the engine's own records, the device probe and its estimate."""

from __future__ import annotations

import pytest
from helpers import make_engine

from minieng.lab.probes import estimate_s, minieng_decode, minieng_prefill, probe_speed, warm_up
from minieng.measure.sweep_plan import prefill_sweep_lengths


def test_the_phases_return_their_own_steps(worded, fake_clock):
    engine = fake_clock(make_engine(worded, max_num_seqs=4))
    warm_up(engine, output_tokens=2)
    warm_steps = len(engine.step_records)
    assert warm_steps == 2  # one prefill, one decode
    ttft_s, prefills = minieng_prefill(engine, [list(range(3, 11)), list(range(5, 13))])
    assert ttft_s == pytest.approx(1e-3 * (1 + 8))  # one step of 8 tokens on the fake clock
    assert len(prefills) == 2 and all(s.num_prefill_tokens == 8 for s in prefills)
    tpot_s, decodes = minieng_decode(engine, [list(range(3, 7)), list(range(7, 11))], output_tokens=4)
    assert tpot_s == pytest.approx(1e-3 * (1 + 2))  # two decodes a step
    assert len(decodes) == 3 and all(s.num_prefill_tokens == 0 for s in decodes)


def test_estimate_adds_overhead_per_prefill():
    probe = {"prefill_tok_s": 1000.0, "overhead_s": 0.01, "decode_step_s": 0.05}
    assert estimate_s(probe, prefill_tokens=2000, decode_steps=10, prefills=4) == pytest.approx(0.04 + 2 + 0.5)
    assert estimate_s({"prefill_tok_s": 100.0, "decode_step_s": 0.1}, 100, 1) == pytest.approx(1.1)


@pytest.mark.real_model
def test_probe_speed_warms_up_restores_the_engine_and_sizes_a_sweep(real_engine):
    engine = real_engine(max_num_batched_tokens=64, enable_prefix_caching=True)
    probe = probe_speed(engine, max_prompt_tokens=128, budget_s=5, repeats=1)
    assert engine.config.max_num_batched_tokens == 64 and engine.block_manager.enable_prefix_caching
    assert probe["max_prompt_tokens"] == 128 and probe["prefill_points"][0][0] == 64
    assert all(probe[k] > 0 for k in ("prefill_tok_s", "decode_step_s"))
    single_step = [s for s in engine.step_records if s.num_prefill_tokens == 128]
    assert single_step or probe["prefill_points"][-1][0] < 128  # 128-token prompts ran unchunked
    lengths = prefill_sweep_lengths(probe, 3)
    assert lengths and lengths[-1] <= 128
