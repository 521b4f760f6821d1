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
