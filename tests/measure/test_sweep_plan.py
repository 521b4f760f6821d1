"""sweep: the prefill knee, the probe's scan, sweep lengths and the TTFT fit, on synthetic timings.

Two synthetic devices stand in for the two regimes: a CPU-like one whose prefill saturates within
a few hundred tokens (timings measured on a 2-core development machine), and an H200-like one whose
TTFT stays at a 13 ms launch floor far past 1,024 tokens. No test here times anything real
(``probes.probe_speed`` on a real engine: tests/lab/test_probes.py).
"""

from __future__ import annotations

import pytest

from minieng.measure.sweep_plan import (
    decode_sweep_batches,
    fit_ttft,
    kv_sweep_plan,
    predict_decode_step_s,
    predict_ttft_s,
    prefill_knee,
    prefill_sweep_lengths,
    probe_lengths,
    scan_prefill,
)

CPU = {
    16: 0.106,
    32: 0.15,
    64: 0.2456,
    128: 0.3677,
    256: 0.7115,
    512: 1.511,
    1024: 3.266,
    2048: 7.0,
    4096: 16.0,
    8191: 40.0,
}  # TTFT s, one step per prompt


def h200(n: int) -> float:
    """A launch floor of 13 ms under a compute line (overlapping, as async kernels do), plus n^2."""
    return max(0.013, 0.002 + n / 1.2e6 + 2e-10 * n * n)


def probe_of(points, cap: int = 8191) -> dict:
    knee = prefill_knee(points)
    return {
        "prefill_tok_s": knee["peak_tok_s"],
        "overhead_s": knee["overhead_s"],
        "knee_tokens": knee["knee_tokens"],
        "knee_reached": knee["knee_reached"],
        "max_prompt_tokens": cap,
        "decode_step_s": 0.04,
    }


# -- the knee --------------------------------------------------------------------------------------


def test_knee_on_a_cpu_comes_within_a_few_hundred_tokens():
    knee = prefill_knee([(n, CPU[n]) for n in (64, 128, 256, 512, 1024)])
    assert knee["knee_tokens"] == 128 and knee["knee_reached"]
    assert knee["peak_tok_s"] == pytest.approx(256 / 0.7115)
    assert 0 <= knee["overhead_s"] <= CPU[64]


def test_flat_ttft_is_overhead_bound_and_the_knee_not_reached():
    points = [(n, 0.013) for n in (64, 256, 1024)]
    knee = prefill_knee(points)
    assert knee["knee_tokens"] == 1024 and not knee["knee_reached"]  # tok/s still growing: a lower bound
    assert knee["overhead_s"] == pytest.approx(0.013)


def test_knee_is_where_growth_falls_under_the_tolerance():
    # tok/s: 100, 200, 220, 225: 200 is within 15% of every later rate, 100 is not
    points = [(100, 1.0), (400, 2.0), (880, 4.0), (1800, 8.0)]
    assert prefill_knee(points)["knee_tokens"] == 400
    assert prefill_knee(points, tolerance=0.05)["knee_tokens"] == 880


def test_a_dip_then_a_climb_is_not_a_knee():
    points = [(100, 1.0), (200, 2.2), (400, 2.0)]  # 100, 91, 200 tok/s
    assert prefill_knee(points)["knee_tokens"] == 400 and not prefill_knee(points)["knee_reached"]


@pytest.mark.parametrize("points", [[], [(0, 1.0)], [(10, 0.0)], [(20, 1.0), (10, 1.0)], [(10, 1.0), (10, 2.0)]])
def test_knee_rejects_bad_points(points):
    with pytest.raises(ValueError):
        prefill_knee(points)


# -- the scan --------------------------------------------------------------------------------------


def test_probe_lengths_double_up_to_the_cap():
    assert probe_lengths(8191) == [64, 128, 256, 512, 1024, 2048, 4096, 8191]
    assert probe_lengths(1024) == [64, 128, 256, 512, 1024]
    assert probe_lengths(40) == [40]
    with pytest.raises(ValueError):
        probe_lengths(0)


def test_scan_stops_at_a_confirmed_knee_on_a_cpu():
    timed = []
    points = scan_prefill(lambda n: timed.append(n) or CPU[n], probe_lengths(8191), budget_s=60, runs_per_length=4)
    assert timed == [64, 128, 256]  # 256 confirms the knee at 128: nothing longer is run
    assert prefill_knee(points)["knee_tokens"] == 128


def test_scan_respects_its_budget():
    timed = []
    scan_prefill(lambda n: timed.append(n) or CPU[n], [64, 256, 1024, 4096], budget_s=8, runs_per_length=4)
    # 64: 1 s; 256 predicted 3.9 s (fits in 8); 1024 predicted 11.4 s more: skipped
    assert timed == [64, 256]


def test_scan_runs_to_the_longest_prompt_on_an_h200():
    points = scan_prefill(h200, probe_lengths(8191), budget_s=10, runs_per_length=4)
    assert [n for n, _ in points] == probe_lengths(8191)
    assert prefill_knee(points)["overhead_s"] == pytest.approx(0.013)


# -- sweep lengths ---------------------------------------------------------------------------------


def cpu_probe():
    return probe_of(scan_prefill(lambda n: CPU[n], probe_lengths(8191), 60, 4))


def h200_probe():
    return probe_of(scan_prefill(h200, probe_lengths(8191), 10, 4))


def test_cpu_sweep_spans_the_knee_and_stays_near_today_s_lengths():
    lengths = prefill_sweep_lengths(cpu_probe(), 5, budget_s=20, runs_per_length=3)
    assert lengths == sorted(set(lengths)) and len(lengths) == 5
    assert lengths[0] < 128 <= lengths[1]  # one point below the knee, the rest from it up
    assert 512 <= lengths[-1] <= 2048  # a 2-core CPU: about a thousand tokens in 20 s
    assert all(n % 16 == 0 for n in lengths)
    assert 3 * sum(predict_ttft_s(cpu_probe(), n) for n in lengths) <= 20


def test_h200_sweep_goes_to_the_longest_prompt():
    lengths = prefill_sweep_lengths(h200_probe(), 5, budget_s=20, runs_per_length=3)
    assert lengths[-1] == 8176 and lengths[0] <= 1024  # from the flat range to the cap (a multiple of 16)
    assert len(lengths) == 5


def test_a_reached_knee_far_from_the_cap_sets_the_top():
    probe = probe_of([(64, 0.013), (256, 0.013), (1024, 0.02), (4096, 0.07)], cap=100_000)
    assert probe["knee_tokens"] == 1024 and probe["knee_reached"]
    lengths = prefill_sweep_lengths(probe, 6, span=16)
    assert lengths[-1] == 16 * 1024 and lengths[0] == 256
    assert sum(n >= 1024 for n in lengths) >= 4  # the compute-bound range gets most points


def test_a_tight_budget_shrinks_the_top_but_never_below_the_knee():
    lengths = prefill_sweep_lengths(cpu_probe(), 5, budget_s=0.01, runs_per_length=3)
    assert lengths[-1] == 128


def test_one_point_is_a_length_well_past_the_knee():
    assert prefill_sweep_lengths(h200_probe(), 1) == [8176]
    (n,) = prefill_sweep_lengths(cpu_probe(), 1, budget_s=120, runs_per_length=40)
    assert 512 <= n <= 1536  # where the CPU spends ~3 s per prompt


def test_caps_and_bad_arguments():
    assert prefill_sweep_lengths(h200_probe(), 4, max_prompt_tokens=1000)[-1] == 992
    assert prefill_sweep_lengths(probe_of([(8, 0.01)], cap=8), 3) == [8]
    with pytest.raises(ValueError):
        prefill_sweep_lengths(cpu_probe(), 0)


# -- the TTFT fit ----------------------------------------------------------------------------------


def test_fit_recovers_a_known_quadratic_past_the_knee():
    a, b, c = 0.01, 2e-4, 4e-8
    points = [(n, max(0.05, a + b * n + c * n * n)) for n in (16, 64, 512, 1024, 2048, 4096)]
    fit = fit_ttft(points)
    assert fit["knee"]["knee_reached"] and fit["fitted_tokens"][0] >= 512
    assert fit["c_s_per_token2"] == pytest.approx(c, rel=1e-6) and fit["b_s_per_token"] == pytest.approx(b, rel=1e-6)
    # exact data: zero residual, so c is significant and its share is the n^2 term's
    assert fit["significant"] and fit["reason"] is None
    assert fit["quadratic_share"] == pytest.approx(c * 4096**2 / points[-1][1])


def test_fit_of_the_measured_cpu_sweep_finds_a_positive_n2_term():
    fit = fit_ttft([(n, CPU[n]) for n in (32, 128, 256, 512, 1024)])
    assert fit["significant"] and 0 < fit["quadratic_share"] < 0.5


def test_an_overhead_bound_sweep_says_so_and_prints_no_share():
    points = [(n, 0.013 + 1e-4 * (-1) ** i) for i, n in enumerate((128, 256, 512, 1024))]  # flat, noisy
    fit = fit_ttft(points)
    assert not fit["significant"] and fit["quadratic_share"] is None
    assert "overhead-bound" in fit["reason"]


def test_noise_larger_than_the_n2_term_is_not_significant():
    points = [(512, 1.0), (1024, 2.2), (1536, 2.9), (2048, 4.4), (2560, 4.9)]  # linear with +-10% noise
    fit = fit_ttft(points)
    assert fit["knee"]["knee_reached"] and not fit["significant"] and fit["quadratic_share"] is None
    assert fit["reason"]


def test_a_negative_curvature_is_never_a_share():
    points = [(128, 0.45), (256, 0.88), (512, 1.7), (1024, 3.3)]  # tok/s 284 -> 310: past the knee, concave
    fit = fit_ttft(points)
    assert fit["c_s_per_token2"] < 0 and not fit["significant"] and "not positive" in fit["reason"]


def test_the_probe_s_knee_can_widen_the_fitted_range():
    points = [(16, 0.186), (64, 0.367), (144, 0.794), (352, 1.395), (832, 4.267)]  # a contended CPU: knee at 352
    assert fit_ttft(points)["fitted_tokens"] == [352, 832] and fit_ttft(points)["c_s_per_token2"] is None
    fit = fit_ttft(points, from_tokens=64)
    assert fit["fitted_tokens"] == [64, 144, 352, 832] and fit["c_s_per_token2"] is not None
    assert fit_ttft(points, from_tokens=2048)["fitted_tokens"] == [352, 832]  # never past the sweep's own knee


def test_too_few_points_past_the_knee():
    fit = fit_ttft([(16, 0.1), (64, 0.2)])
    assert not fit["significant"] and fit["c_s_per_token2"] is None and fit["reason"]


# -- decode batches and the KV sweep ---------------------------------------------------------------


def test_predictions_add_attention_and_turn_compute_bound():
    from minieng.config import published_config

    probe, cfg = cpu_probe(), published_config("SmolLM2-135M")
    assert predict_ttft_s(probe, 512, cfg) > predict_ttft_s(probe, 512)  # attention on top of the linear term
    assert predict_ttft_s(probe, 6143, cfg) - probe["overhead_s"] == pytest.approx(
        2 * (predict_ttft_s(probe, 6143) - probe["overhead_s"]), rel=0.01
    )  # the crossover: attention = linear
    together = predict_ttft_s(probe, 64, count=8)  # one batch's prompts share the steps' fixed cost
    assert together - probe["overhead_s"] == pytest.approx(8 * (predict_ttft_s(probe, 64) - probe["overhead_s"]))
    assert predict_decode_step_s(probe, 1) == probe["decode_step_s"]
    assert predict_decode_step_s(probe, 4096) == pytest.approx(4096 / probe["prefill_tok_s"])


def test_decode_batches_climb_past_the_ridge_or_to_the_cap():
    assert decode_sweep_batches(cpu_probe(), 8, 256, 32, 64) == [1, 4, 16]  # 16 >= 2 x the ridge batch
    assert decode_sweep_batches(h200_probe(), None, 256, 32, 64) == [1, 4, 16, 64, 256]  # no ridge: to the cap
    assert decode_sweep_batches(h200_probe(), None, 100, 32, 64) == [1, 4, 16, 64, 100]
    assert decode_sweep_batches(cpu_probe(), 1, 256, 32, 64) == [1, 4]
    tight = decode_sweep_batches(cpu_probe(), None, 256, 32, 64, budget_s=5)
    assert tight[0] == 1 and tight[-1] < 256
    assert decode_sweep_batches(cpu_probe(), None, 256, 32, 64, budget_s=0) == [1]
    with pytest.raises(ValueError):
        decode_sweep_batches(cpu_probe(), 8, 0, 32, 64)


def test_kv_sweep_reaches_the_weights_on_a_cpu_and_the_overhead_on_a_gpu():
    # CPU-like: fp32 weights 538 MB, 46 KB of KV per token, 15 GB/s, a 40 ms step: the target is
    # the bytes a step's time moves (600 MB); two sequences reach it within 8k tokens.
    cpu = kv_sweep_plan(cpu_probe(), 538e6, 46080, 15e9, max_context=8150, max_tokens=23296, max_batch=64)
    assert cpu["batch_size"] == 2 and cpu["reached"]
    assert cpu["target_kv_bytes"] == pytest.approx(0.04 * 15e9)
    assert cpu["contexts"][0] == 16 and 6000 < cpu["contexts"][-1] <= 8150
    assert 2 * cpu["contexts"][-1] * 46080 >= cpu["target_kv_bytes"]
    # H200-like: bf16 weights 270 MB read in 63 us, a 2.2 ms step: 9.5 GB of KV per step to show
    gpu = dict(h200_probe(), decode_step_s=0.0022)
    plan = kv_sweep_plan(gpu, 270e6, 23040, 4.3e12, max_context=8150, max_tokens=524288, max_batch=64)
    assert plan["batch_size"] == 64 and plan["reached"]
    assert plan["target_kv_bytes"] == pytest.approx(0.0022 * 4.3e12)
    assert plan["contexts"] == sorted(set(plan["contexts"])) and all(c % 16 == 0 for c in plan["contexts"])


def test_kv_sweep_is_capped_by_the_pool_the_batch_and_the_budget():
    pool = kv_sweep_plan(cpu_probe(), 538e6, 46080, 15e9, max_context=8150, max_tokens=4096, max_batch=64)
    assert pool["batch_size"] * pool["contexts"][-1] <= 4096 and not pool["reached"]
    one = kv_sweep_plan(cpu_probe(), 538e6, 46080, 15e9, max_context=8150, max_tokens=23296, max_batch=1)
    assert one["batch_size"] == 1 and one["contexts"][-1] == 8144 and not one["reached"]
    sizes = dict(max_context=8150, max_tokens=23296, max_batch=64)
    quick = kv_sweep_plan(cpu_probe(), 538e6, 46080, 15e9, budget_s=10, **sizes)
    full = kv_sweep_plan(cpu_probe(), 538e6, 46080, 15e9, **sizes)
    assert quick["contexts"][-1] < full["contexts"][-1] and not quick["reached"]
    # a machine too slow (or too busy) to reach the target: the batch whose KV grows most across
    # the sweep, never a large batch left with a single context
    slow = dict(cpu_probe(), decode_step_s=0.44, prefill_tok_s=18, overhead_s=0.0)
    plan = kv_sweep_plan(slow, 538e6, 46080, 11.3e9, budget_s=90, **sizes)
    assert not plan["reached"] and len(plan["contexts"]) >= 3 and plan["batch_size"] < 64
    with pytest.raises(ValueError):
        kv_sweep_plan(cpu_probe(), 538e6, 46080, 0, max_context=8150, max_tokens=23296, max_batch=64)


# -- prefill_batch_length (claim S16's sweep) ------------------------------------------------------


def test_prefill_batch_length_passes_the_knee_within_the_budgets():
    from minieng.measure.sweep_plan import prefill_batch_length

    probe = {"knee_tokens": 128, "knee_reached": True, "prefill_tok_s": 800.0, "overhead_s": 0.0}
    plan = prefill_batch_length(probe, [1, 2, 4, 8], max_tokens=8192)
    assert plan == {"prompt_tokens": 256, "past_knee": True, "why": None}  # min_tokens, past a knee of 128
    # A knee above min_tokens: the knee.
    assert prefill_batch_length(probe | {"knee_tokens": 512}, [1, 2, 4, 8], 8192)["prompt_tokens"] == 512
    # The token budget caps it: 8 prompts in 1,024 tokens leave 128 each (still the knee).
    assert prefill_batch_length(probe, [1, 2, 4, 8], max_tokens=1024)["prompt_tokens"] == 128
    # The time budget: 15 prompts at 800 tok/s in 3 s leave 160 tokens each.
    plan = prefill_batch_length(probe, [1, 2, 4, 8], 8192, budget_s=3.0)
    assert plan["prompt_tokens"] == 160 and plan["past_knee"]
    # A time budget never pushes it under the knee: past it is the point (a slow device overruns the budget).
    assert prefill_batch_length(probe, [1, 2, 4, 8], 8192, budget_s=1.0)["prompt_tokens"] == 128
    # The token budget can: said so.
    plan = prefill_batch_length(probe, [1, 2, 4, 8], max_tokens=800)
    assert plan["prompt_tokens"] == 96 and not plan["past_knee"] and "under the probe's knee" in plan["why"]


def test_prefill_batch_length_without_a_knee_and_refusals():
    from minieng.measure.sweep_plan import prefill_batch_length

    probe = {"knee_tokens": 2048, "knee_reached": False, "prefill_tok_s": 1e5, "overhead_s": 0.01}
    plan = prefill_batch_length(probe, [1, 2], 8192, min_tokens=16)
    assert plan["prompt_tokens"] == 16 and not plan["past_knee"] and "still growing" in plan["why"]
    with pytest.raises(ValueError, match="batch sizes"):
        prefill_batch_length(probe, [], 8192)
    with pytest.raises(ValueError, match="fewer than 16 tokens"):
        prefill_batch_length(probe, [1, 8], 100)


def test_a_fit_that_needs_a_negative_cost_is_never_a_share():
    """Notebook 01 on a CPU busy with other work: its sweep's best fit was TTFT = 811 - 0.90 n +
    1.0e-3 n^2 ms, an "n^2 share" of 133% of TTFT. A negative per-token cost is no physics: the fit
    is refused as evidence of an n^2 term, with the reason; the same points shifted to a positive
    slope are a share again."""
    a, b, c = 0.811, -0.9034e-3, 1.0e-6
    points = [(n, a + b * n + c * n * n) for n in (32, 64, 128, 320, 816, 2048)]
    points[:2] = [(32, 0.9), (64, 0.95)]  # tok/s rises to the knee
    fit = fit_ttft(points, from_tokens=128)
    assert fit["b_s_per_token"] < 0 and fit["c_s_per_token2"] > 0
    assert not fit["significant"] and fit["quadratic_share"] is None and "negative per-token b" in fit["reason"]
    assert fit["physical"] is False
    fixed = fit_ttft([(n, t + 1.0e-3 * n) for n, t in points], from_tokens=128)  # b = +0.1 ms a token
    assert fixed["significant"] and fixed["physical"] and 0 < fixed["quadratic_share"] < 1
