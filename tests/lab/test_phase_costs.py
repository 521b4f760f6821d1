"""Claim S14's experiment (notebook 01): three requests timed as TTFT and decode time."""

from __future__ import annotations

import pytest
from helpers import make_engine

from minieng.lab.phase_costs import CASES, phase_cost_grid


def test_the_grid_times_each_case_with_its_own_lengths_in_rounds_after_a_warm_up(worded):
    engine = make_engine(worded, enable_prefix_caching=False)  # the test text repeats its words: no cache
    grid = phase_cost_grid(engine, (8, 32), (3, 12), repeats=2)
    assert tuple(grid) == CASES
    assert (grid["long_prompt"]["prompt_tokens"], grid["long_prompt"]["output_tokens"]) == (32, 3)
    assert (grid["long_output"]["prompt_tokens"], grid["long_output"]["output_tokens"]) == (8, 12)
    assert all(c["ttft_s"] > 0 and c["decode_s"] > 0 for c in grid.values())
    # each case ran its own requests, at its lengths, one untimed round first: 3 x (8 + 32 + 8)
    # prompt tokens, and every output token after the first from a decode step: 3 x (2 + 2 + 11)
    steps = engine.step_records
    assert sum(s.num_prefill_tokens for s in steps) == 144
    assert sum(s.num_decode_seqs for s in steps) == 45
    # in rounds, each case once per round (a load that comes and goes touches them alike)
    assert [s.num_prefill_tokens for s in steps if s.num_prefill_tokens] == [8, 32, 8] * 3


@pytest.mark.parametrize("prompts,outputs", [((32, 8), (3, 12)), ((8, 32), (1, 12)), ((8, 32), (12, 12))])
def test_lengths_out_of_order_are_refused(worded, prompts, outputs):
    with pytest.raises(ValueError, match="short < long"):
        phase_cost_grid(make_engine(worded), prompts, outputs)


def test_the_engine_backend_times_each_phase_from_the_engines_records(worded, monkeypatch, capsys):
    """``lesson_backend(None, ...)``: the engine's prefill, decode and grid, their utilization from its
    steps, the cache called with the model, device and dtype in its key, and every engine-only figure allowed."""
    from types import SimpleNamespace

    from minieng import EngineConfig
    from minieng.lab import backend as lab_backend
    from minieng.lab.model_for_device import CourseModel
    from minieng.lab.phase_costs import format_phases, phase_result
    from minieng.measure.peaks import Peak

    ceilings = SimpleNamespace(peak=Peak("here", 1.0, 10.0, "measured"), noise=None, lines=lambda: ["ceilings"])
    config = EngineConfig(device="cpu", block_size=4, num_kv_blocks=256, max_model_len=256)
    model = CourseModel("tiny", {"config": config, "loaded": worded}, True, "a test")
    monkeypatch.setattr(lab_backend, "machine_ceilings", lambda: ceilings)
    monkeypatch.setattr(lab_backend, "course_model", lambda name, bandwidth: model)
    keys = []
    backend = lab_backend.lesson_backend(
        None, "tiny", cache=lambda n, k, f, noise: keys.append((n, k)) or f(), enable_prefix_caching=False
    )
    assert backend.has_steps and backend.needs_engine("mfu") and capsys.readouterr().out == ""
    assert backend.lines()[0] == "ceilings" and backend.why_not("napkin") is None and backend.noise is None
    prefill, decode = backend.prefill(16, repeats=2), backend.decode(5, prompt_tokens=8)
    assert prefill.tokens == 16 and prefill.tok_s == pytest.approx(16 / prefill.seconds)
    assert [s.num_prefill_tokens for s in prefill.steps] == [16, 16]  # each prompt alone, in one step
    assert len(decode.steps) == 4 and all(s.num_prefill_tokens == 0 for s in decode.steps)
    result = phase_result(backend, [prefill], decode)
    assert result["decode"]["bytes"] > 0 and result["prefill"][0]["mfu_percent"] > 0
    assert "MFU" in format_phases(result)[1] and "MBU" in format_phases(result)[-1]
    grid = backend.phase_grid((8, 32), (3, 12))
    assert tuple(grid) == CASES and keys[-1] == (
        "phase_cost_grid",
        {
            "prompt_tokens": (8, 32),
            "output_tokens": (3, 12),
            "repeats": 1,
            "model": "tiny",
            "device": "cpu",
            "dtype": "torch.float32",
        },
    )
    r = backend.request(12, 3)
    assert (r.prompt_tokens, r.output_tokens) == (12, 3)
