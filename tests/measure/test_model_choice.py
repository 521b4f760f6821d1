"""The course's model choice on device profiles: each device gets a shape that fits, and whose bytes
dominate its decode step wherever some shape that fits can.

The profiles are datasheet figures (memory, bandwidth from ``peaks.DATASHEET``, the dtype the engine
picks). The per-layer fixed costs are stated assumptions, not measurements: ``GRAPHED`` is about
twelve kernels a layer replayed from a CUDA graph at ~1.5 us each; ``EAGER`` is the 135M model's
eager decode step measured on an H200 (14 ms for 30 layers).
"""

from __future__ import annotations

import pytest

from minieng.config import published_config
from minieng.measure.flops_bytes import decode_work
from minieng.measure.model_choice import (
    DOMINANCE,
    LESSON_SHAPES,
    MEMORY_FRACTION,
    choose_model,
    fixed_cost_per_layer_s,
    predict,
)
from minieng.measure.peaks import datasheet_peak

GB = 1e9
GRAPHED = 20e-6  # s per layer
EAGER = 14e-3 / 30

# name as torch reports it, free memory (bytes), dtype bytes
PROFILES = {
    "Tesla T4": (15.0 * GB, 2),
    "NVIDIA L4": (22.0 * GB, 2),
    "NVIDIA A100-SXM4-40GB": (39.0 * GB, 2),
    "NVIDIA H100 80GB HBM3": (79.0 * GB, 2),
    "NVIDIA H200": (140.0 * GB, 2),
    "NVIDIA GeForce RTX 3060": (11.5 * GB, 2),
    "NVIDIA GeForce RTX 4090": (23.5 * GB, 2),
}


def bandwidth(name: str) -> float:
    return datasheet_peak(name).bandwidth_gbps * GB


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("per_layer_s", [GRAPHED, EAGER], ids=["graphed", "eager"])
def test_every_device_gets_a_model_that_fits_and_whose_bytes_dominate_where_any_can(name, per_layer_s):
    free, dtype_bytes = PROFILES[name]
    choice = choose_model(bandwidth(name), free, dtype_bytes, per_layer_s)
    assert choice.weight_bytes <= MEMORY_FRACTION * free
    preds = [predict(n, bandwidth(name), dtype_bytes, per_layer_s) for n in LESSON_SHAPES]
    fitting = [p for p in preds if p.weight_bytes <= MEMORY_FRACTION * free]
    dominating = [p for p in fitting if p.bytes_dominate]
    if dominating:
        assert choice.bytes_dominate
        assert choice.tpot_floor_s >= DOMINANCE * choice.fixed_cost_s
        assert choice.decode_bytes == min(p.decode_bytes for p in dominating)  # the smallest that qualifies
    else:
        assert not choice.bytes_dominate
        assert choice.decode_bytes == max(p.decode_bytes for p in fitting)  # the most bytes this device holds
        assert "overhead-bound" in choice.reason()


def test_the_small_model_never_dominates_a_gpu_step():
    """The course's point: on every GPU, the 135M model's bytes take less than its fixed cost."""
    for name, (free, dtype_bytes) in PROFILES.items():
        small = predict("SmolLM2-135M", bandwidth(name), dtype_bytes, GRAPHED)
        assert small.tpot_floor_s < DOMINANCE * small.fixed_cost_s, name
        assert choose_model(bandwidth(name), free, dtype_bytes, GRAPHED).name != "SmolLM2-135M", name


def test_the_issue_examples_a_t4_gets_the_1_7b_model_and_an_h100_a_7_to_8b_one():
    t4 = choose_model(bandwidth("Tesla T4"), *PROFILES["Tesla T4"], GRAPHED)
    assert t4.name == "SmolLM2-1.7B" and t4.bytes_dominate
    assert t4.tpot_floor_s == pytest.approx(t4.decode_bytes / (320 * GB))
    h100 = choose_model(bandwidth("NVIDIA H100 80GB HBM3"), *PROFILES["NVIDIA H100 80GB HBM3"], GRAPHED)
    assert h100.name in ("Qwen2.5-7B-Instruct", "Llama-3-8B") and h100.bytes_dominate


def test_a_prediction_reads_the_decode_bytes_and_the_layers():
    cfg = published_config("SmolLM2-1.7B")
    p = predict("SmolLM2-1.7B", 320 * GB, 2, GRAPHED)
    assert p.decode_bytes == decode_work(cfg, 1, 128, 2).total_bytes
    assert p.fixed_cost_s == pytest.approx(GRAPHED * cfg.num_hidden_layers)
    assert 0 < p.bytes_share < 1


def test_fixed_cost_per_layer_is_what_the_step_spends_beyond_its_bytes():
    cfg = published_config("SmolLM2-135M")
    floor = decode_work(cfg, 1, 128, 2).total_bytes / (4800 * GB)
    assert fixed_cost_per_layer_s(floor + 3e-3, cfg, 2, 4800 * GB) == pytest.approx(3e-3 / 30)
    assert fixed_cost_per_layer_s(floor / 2, cfg, 2, 4800 * GB) == 0.0  # a floor measured low, not a negative cost


def test_bad_input_and_a_device_too_small_for_any_model_are_refused():
    with pytest.raises(ValueError, match="must be > 0"):
        choose_model(0, GB, 2, GRAPHED)
    with pytest.raises(ValueError, match="no model fits"):
        choose_model(300 * GB, 0.5 * GB, 2, GRAPHED)
    with pytest.raises(ValueError, match="use one of"):
        choose_model(300 * GB, 16 * GB, 2, GRAPHED, candidates=["GPT-5"])
