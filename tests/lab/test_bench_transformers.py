"""The bench's transformers column: its TPOT is read inside transformers' own decoding loop."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minieng.lab import bench


def test_transformers_tpot_is_the_median_gap_between_its_steps(tiny_llama, monkeypatch):
    """One ``generate`` of 6 tokens for a batch of 2: the streamer sees the prompt, then 6 steps.
    With a clock that ticks 10 s for the prefill and then 1, 1, 3, 1, 1 s, the TPOT is the median
    step, 1 s: never the difference of two timed ``generate`` calls (which noise made negative)."""
    hf, _ = tiny_llama
    ticks = iter([0.0, 10.0, 11.0, 12.0, 15.0, 16.0, 17.0])
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    assert bench.hf_decode(hf, [[1, 2, 3, 4], [5, 6, 7, 8]], 6) == 1.0
    assert next(ticks, None) is None  # one reading per put: the prompt and each of the 6 steps
    monkeypatch.undo()
    with pytest.raises(ValueError, match="2 or more"):
        bench.hf_decode(hf, [[1, 2, 3, 4]], 1)
