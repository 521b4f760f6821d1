"""The closing claims tables of notebooks 02, 03 and 11, each built in one call from what the
notebook measured: every row present, and each verdict able to come out against the article."""

from __future__ import annotations

import pytest
import torch

from minieng.config import published_config
from minieng.course.closing import decode_memory, roofline, scaling_out, two_phases
from minieng.course.kit import CLAIMS_MIMETYPE, CachedResult
from minieng.lab.tensor_parallel import ModelledStep, SplitStep, TensorParallelRun
from minieng.lab.tp_paper import article_cases
from minieng.measure.flops_bytes import prefill_params_per_token
from minieng.measure.peaks import Peak
from minieng.measure.tp_estimate import LINKS, tensor_parallel_decode

PEAK = Peak("measured cpu float32", 0.05, 10.0, "measured")
QUIET = 0.01


@pytest.fixture(autouse=True)
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("MINIENG_NOTEBOOK", "closing_test")


def rows(table) -> dict[str, str]:
    return {claim.split(":")[0]: holds for claim, _, _, holds in table._repr_mimebundle_()[CLAIMS_MIMETYPE]["rows"]}


def test_decode_memory_table_judges_s3_on_the_floor(results):
    b1 = CachedResult({"seconds": 0.30, "num_steps": 10, "bytes": 10 * 0.2e9,
                       "measured": {"mbu_percent": 67.0, "limit": "memory"}}, noise=QUIET)  # fmt: skip
    kv = CachedResult({"rows": [
        {"context_tokens": 64, "tpot_s": 0.03, "floor_s": 0.02, "limit": "memory", "kv_bytes": 1e6, "weight_bytes": 2e8},
        {"context_tokens": 8192, "tpot_s": 0.06, "floor_s": 0.04, "limit": "memory", "kv_bytes": 2e8, "weight_bytes": 2e8},
    ]}, noise=QUIET)  # fmt: skip
    batched = CachedResult({"rows": [{"batch_size": b, "prompt_tokens": 512, "tok_s": t} for b, t in [(1, 100.0), (8, 105.0)]]},
                           noise=QUIET)  # fmt: skip
    probe = {"knee_reached": True, "knee_tokens": 256}
    model = type("M", (), {"why": "", "bytes_dominate": True})()
    kw = dict(kv_res=kv, kv_batch=1, batched=batched, probe=probe, lesson_model=model, measured=PEAK, article_gb=10.8)
    said = rows(decode_memory.table(b1=b1, **kw))
    assert said["S3"].startswith("holds") and said["S16"].startswith("holds")
    assert said["(beyond the articles) KV bytes join weight bytes at long context"].startswith("holds")
    # A step faster than bytes / bandwidth (0.2 GB at 10 GB/s = 20 ms) breaks the claim.
    fast = CachedResult(dict(b1) | {"seconds": 0.10}, noise=QUIET)
    assert rows(decode_memory.table(b1=fast, **kw))["S3"].startswith("does not hold")


def _sweep(prefill_mfu: float, decode_mfu: float) -> CachedResult:
    def by(mfu, limit):
        return {"measured": {"mfu_percent": mfu, "mbu_percent": 50.0, "suspect": False, "limit": limit, "bound": "b"}}

    return CachedResult({"prefill": [{"prompt_tokens": 512, "by_peak": by(prefill_mfu, "compute")}],
                         "decode": [{"batch_size": 1, "by_peak": by(decode_mfu, "memory")}]}, noise=QUIET)  # fmt: skip


def test_roofline_table_judges_s11_and_s20_on_the_sweep():
    cfg = published_config("SmolLM2-135M")
    counts = [{"counted_linear_flops": 5, "linear_flops": 5}]
    fit = {"quadratic_share": None, "significant": False, "physical": None, "reason": "flat", "b_s_per_token": None}
    kw = dict(fit=fit, counts=counts, model_config=cfg, model_name="m", count_tokens=32, dtype_bytes=4, measured=PEAK)
    said = rows(roofline.table(res=_sweep(50.0, 2.0), **kw))
    assert said["S11"].startswith("holds") and said["S20"].startswith("holds") and said["S2"].startswith("holds")
    said = rows(roofline.table(res=_sweep(20.0, 10.0), **kw))
    assert said["S20"].startswith("does not hold")
    # A fit that bends up only with a negative cost cannot judge S2.
    said = rows(roofline.table(res=_sweep(50.0, 2.0), **kw | {"fit": fit | {"physical": False, "reason": "a < 0"}}))
    assert said["S2"].startswith("too noisy")


def test_s2_floor_is_the_same_in_notebooks_01_and_02():
    """Both judge the fitted cost per prompt token against 2 x the layers' parameters / peak (the LM
    head runs for the last position only): a fit at twice that floor reads 2.0x in either table."""
    cfg = published_config("SmolLM2-135M")
    b = 2 * (2 * prefill_params_per_token(cfg) / (PEAK.peak_tflops * 1e12))
    fit = {"quadratic_share": None, "significant": False, "physical": True, "reason": "flat", "b_s_per_token": b}
    kw = dict(counts=[], model_config=cfg, model_name="m", count_tokens=32, dtype_bytes=4, measured=PEAK)
    in_02 = rows(roofline.table(res=_sweep(50.0, 2.0), fit=fit, **kw))["S2"]
    engine = type("E", (), {"model_config": cfg, "dtype": torch.float32})()
    backend = type("B", (), {"has_steps": True, "engine": engine, "ceilings": type("C", (), {"peak": PEAK})()})()
    _, in_01 = two_phases._s2(backend, CachedResult({"prefill": [{"prompt_tokens": 512}]}, noise=QUIET), fit)
    assert in_01 == in_02 and in_01.startswith("holds") and "2.0x 2·P / peak" in in_01


def _tp_run(two_ranks_s: float) -> TensorParallelRun:
    steps = [
        SplitStep(1, 1, 0.02, 0.02, 0.0, 0, 1e8, 1e5),
        SplitStep(2, 1, two_ranks_s, two_ranks_s, 0.002, 62, 1e8, 1e5),
    ]
    shape = dict(weight_bytes=1e8, num_layers=30, hidden_size=576)
    own = tensor_parallel_decode(num_devices=2, bandwidth_gbps=5.0, **shape)
    return TensorParallelRun(
        steps, link=LINKS["pcie4_x16"], hop_latency_s=5e-5, modelled=[ModelledStep("own memory", 2, 1, own)]
    )


def test_scaling_out_table_says_s4_is_not_testable_on_one_device():
    b1 = CachedResult({"measured": {"mbu_percent": 60.0, "mfu_percent": 2.0}}, noise=QUIET)
    projection = {"mbu_percent": 60.0, "intensity": 1.0, "here": ("this device", 0.05, 2.0),
                  "projected": [{"device": d, "peak_tflops": p, "mfu_percent": m} for d, p, m in
                                [("T4", 65, 0.3), ("A100", 312, 0.2), ("H100", 989, 0.1)]]}  # fmt: skip
    knob = {"knob": None, "projection": None, "lines": []}
    cases = article_cases(dict(weight_bytes=10.8e9, num_layers=40, hidden_size=5120, bandwidth_gbps=360), 5e-6)
    kw = dict(b1=b1, projection=projection, knob=knob, tp_noise=QUIET, tp_where="two processes", cases=cases,
              hop_latency_us=5)  # fmt: skip
    said = rows(scaling_out.table(tp=_tp_run(0.015), tp_gpus=False, **kw))
    assert said["S4"].startswith("not testable") and said["S17"].startswith("not testable")
    assert said["S18"].startswith("holds")
    assert rows(scaling_out.table(tp=_tp_run(0.015), tp_gpus=True, **kw))["S4"].startswith("holds")
    assert rows(scaling_out.table(tp=_tp_run(0.03), tp_gpus=True, **kw))["S4"].startswith("does not hold")
    busy = kw | {"b1": CachedResult(dict(b1) | {"measured": {"mbu_percent": 60.0, "mfu_percent": 30.0}}, noise=QUIET),
                 "projection": projection | {"here": ("this device", 0.05, 30.0)}}  # fmt: skip
    assert rows(scaling_out.table(tp=_tp_run(0.015), tp_gpus=True, **busy))["S18"].startswith("does not hold")
