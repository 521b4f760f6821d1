"""Notebook 09's target/draft pair on device profiles: a pair of one vocabulary that fits, whose draft the
napkin model predicts several times cheaper per step (c < 0.3) wherever memory allows a pair at all.

The profiles are the datasheet table (``peaks.DATASHEET``: dense peak and bandwidth) with each device's
memory (``peaks.DEVICE_MEMORY_MIB``), in the dtype the engine picks there (fp16 on a T4, bf16 on the
others). The per-layer fixed costs are the stated assumptions of ``test_model_choice``: ``GRAPHED`` about
twelve kernels a layer replayed from a CUDA graph at ~1.5 us each, and ``H200_GRAPHED`` the 135M model's
batch-1 step replayed from CUDA graphs on an H200 (2.2 ms for 30 layers, docs/measurements.md).
"""

from __future__ import annotations

import pytest

from minieng.config import PUBLISHED_CHECKPOINTS, published_config
from minieng.measure.flops_bytes import decode_work
from minieng.measure.model_choice import CONTEXT_TOKENS, MEMORY_FRACTION
from minieng.measure.napkin import datasheet_devices
from minieng.measure.speculative_pair import (
    MAX_COST_RATIO,
    SPECULATIVE_PAIRS,
    choose_pair,
    predict_pair,
)

GRAPHED = 20e-6  # s per layer
H200_GRAPHED = 2.2e-3 / 30
PROFILES = ["T4", "L4", "A100 40GB", "A100 80GB SXM", "H100 SXM", "H100 PCIe", "H200", "RTX 3060", "RTX 4090"]
SMALL = ("SmolLM2-1.7B", "SmolLM2-135M")
QWEN = ("Qwen2.5-3B-Instruct", "Qwen2.5-0.5B-Instruct")


def device(name):
    return next(d for d in datasheet_devices() if d.name == name)


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_gets_a_pair_that_fits_with_c_under_0_3_by_the_napkin_model(name):
    pair = choose_pair(device(name))
    assert pair.fits and pair.weights_bytes <= MEMORY_FRACTION * device(name).memory_bytes
    assert pair.cost_ratio < MAX_COST_RATIO == 0.3 and pair.pays
    assert pair.target_estimate.dtype == ("fp16" if name == "T4" else "bf16")
    assert pair.target_estimate.tpot_bound == pair.draft_estimate.tpot_bound == "memory"  # batch 1 reads bytes
    # The largest target whose pair fits: the Qwen pair (7.2 GB) needs 18 GB; a T4 or an RTX 3060 gets SmolLM2's.
    assert (pair.target, pair.draft) == (SMALL if name in ("T4", "RTX 3060") else QWEN)


@pytest.mark.parametrize("name", PROFILES)
def test_with_a_graphed_fixed_cost_the_small_memory_devices_still_pay(name):
    """A fixed cost per layer raises c (the draft's layers cost as much as the target's): it stays under 0.3 where
    reading the target's weights takes long (every profile here but the H100 SXM and H200, at 3.35 and 4.8 TB/s)."""
    pair = choose_pair(device(name), GRAPHED)
    assert pair.cost_ratio > pair.floors_cost_ratio
    assert pair.pays == (name not in ("H100 SXM", "H200"))


def test_the_floors_alone_give_the_ratio_of_the_bytes_read():
    pair = predict_pair(*SMALL, device("T4"))
    t = decode_work(published_config(SMALL[0]), 1, CONTEXT_TOKENS, 2).total_bytes
    d = decode_work(published_config(SMALL[1]), 1, CONTEXT_TOKENS, 2).total_bytes
    assert pair.cost_ratio == pytest.approx(d / t) == pytest.approx(pair.floors_cost_ratio)
    assert 0.07 < pair.cost_ratio < 0.09  # 0.27 GB against 3.42 GB of weights in fp16
    assert pair.target_step_s == pytest.approx(t / 320e9)


def test_on_an_h200_the_fixed_cost_makes_every_draft_too_dear_and_the_lines_say_so():
    """At 73 us a layer, the Qwen pair's c is (0.21 + 24 x 0.073) / (1.29 + 36 x 0.073) ms = 0.50: no pair pays,
    and the choice is the pair of the lowest c."""
    pair = choose_pair(device("H200"), H200_GRAPHED)
    assert not pair.pays and (pair.target, pair.draft) == QWEN
    assert pair.cost_ratio == pytest.approx(0.50, abs=0.01)
    others = [predict_pair(t, d, device("H200"), H200_GRAPHED) for t, d in SPECULATIVE_PAIRS]
    assert pair.cost_ratio == min(p.cost_ratio for p in others)
    text = "\n".join(pair.lines())
    assert "predicted c = draft step / target step = 0.50" in text and "floors alone would give c = 0.16" in text
    assert "24 against 36" in text and "can gain little" in text


def test_every_pair_shares_one_vocabulary_and_has_real_checkpoints_on_the_hub():
    for target, draft in SPECULATIVE_PAIRS:
        assert published_config(target).vocab_size == published_config(draft).vocab_size
        assert published_config(draft).num_params * 4 < published_config(target).num_params  # several times smaller
        assert predict_pair(target, draft, device("T4")).checkpoints == (
            PUBLISHED_CHECKPOINTS[target],
            PUBLISHED_CHECKPOINTS[draft],
        )


def test_a_draft_of_another_vocabulary_and_a_device_too_small_are_refused():
    with pytest.raises(ValueError, match="152,064"):  # the 7B's embedding has more rows than the 0.5B's
        predict_pair("Qwen2.5-7B-Instruct", "Qwen2.5-0.5B-Instruct", device("H100 SXM"))
    with pytest.raises(ValueError, match="no speculative pair fits"):
        choose_pair(device("T4"), free_memory_bytes=4e9)
    with pytest.raises(ValueError, match=">= 0"):
        choose_pair(device("T4"), -1e-6)
    with pytest.raises(ValueError, match="no pair"):
        choose_pair(device("T4"), pairs=[])
