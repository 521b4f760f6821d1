"""Notebook 07's closing S19 row (``course.closing.prefix_caching``): prefix caching weighed, per ms of
TTFT saved, against its own levers and those notebooks 08 (quantization) and 11 (threads) stored in the
results folder on this machine; with none of those that saved TTFT, not testable."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from minieng.course.closing import prefix_caching
from minieng.course.kit import CachedResult, cached

MODEL = "SmolLM2-135M"
ENGINE = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)
BACKEND = SimpleNamespace(engine=ENGINE, model=SimpleNamespace(name=MODEL), why_not=lambda what: what)
KV = 46080  # bytes of K/V a token of SmolLM2-135M holds in float32


@pytest.fixture(autouse=True)
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path))
    # an 8-core CPU with 16 GiB, whatever machine runs the test
    monkeypatch.setattr(prefix_caching, "_capacity", lambda engine: {"memory bytes": 16 * 2**30, "cores": 8})


def lever(without: float, with_: float, flops: float, memory: float) -> dict:
    return {"baseline_ttft_s": without, "ttft_s": with_, "ttft_saved_s": without - with_, "extra_flops": flops,
            "extra_memory_bytes": memory}  # fmt: skip


# A 2,048-token prompt, 1,984 tokens of it cached (97%); chunked prefill and batching add TTFT.
LEVERS = CachedResult(
    {
        "levers": {
            "prefix caching": lever(1.40, 0.20, -4.5e11, 1984 * KV),
            "chunked prefill": lever(1.40, 1.52, 0.0, 0),
            "batching": lever(1.40, 1.47, 8.5e8, 128 * KV),
        }
    },
    noise=0.02,
)


def store_quantization(agreement: float, model: str = MODEL) -> None:
    """Notebook 08's result as ``cached`` stores it: int8 at 0.8x float's TTFT, 300 MB of weights freed."""
    rows = [
        {"scheme": "none", "ttft_ratio": 1.0, "weight_bytes": 5.4e8, "agreement": 1.0},
        {"scheme": "int8", "ttft_ratio": 0.8, "weight_bytes": 2.4e8, "agreement": agreement},
        {"scheme": "int4", "ttft_ratio": 1.3, "weight_bytes": 1.6e8, "agreement": 0.9},
    ]
    params = {"model": model, "schemes": ["int8", "int4"], "device": "cpu", "dtype": "torch.float32"}
    cached("quantization", params, lambda: {"rows": rows})


def store_threads() -> None:
    """Notebook 11's thread knob: 8 threads at 0.2x the TTFT of 1."""
    rows = [{"threads": 8, "ttft_s": 0.30, "tpot_s": 0.05}, {"threads": 1, "ttft_s": 1.50, "tpot_s": 0.09}]
    params = {"model": MODEL, "prompt_tokens": 512, "threads": 8, "decode_steps": 8, "dtype": "torch.float32"}
    cached("thread_knob", params, lambda: {"rows": rows})


def test_s19_is_not_testable_before_notebooks_08_and_11_ran():
    said, verdict = prefix_caching._s19(BACKEND, LEVERS, 2048)
    assert verdict == (
        "not testable here: no other lever measured on this machine saved TTFT (run notebooks 08 and 11 first)"
    )
    assert "prefix caching +1200 ms" in said and "batching -70 ms" in said
    store_quantization(0.97, model="another model")  # another model's run stands for nothing here
    assert prefix_caching._s19(BACKEND, LEVERS, 2048)[1].endswith("(run notebooks 08 and 11 first)")


def test_s19_holds_when_the_cache_is_the_cheapest_per_ms_saved():
    store_quantization(0.97)
    store_threads()
    said, verdict = prefix_caching._s19(BACKEND, LEVERS, 2048)
    assert verdict.startswith("holds") and "1200 ms of 1400 ms" in verdict
    # both carried onto this prompt by their ratios: 1.4 s / 0.2 at one thread, 1.4 s x 0.8 in int8
    assert "threads +5600 ms" in said and "quantization +280 ms" in said
    assert "quantization (int8): 0.80x TTFT, -286 MiB of weights, 97% of tokens agree (notebook 08)" in said


def test_s19_does_not_hold_when_a_rival_is_cheaper_per_ms_saved():
    store_quantization(1.0)  # int8 changed no greedy token: it frees memory and spends nothing
    said, verdict = prefix_caching._s19(BACKEND, LEVERS, 2048)
    assert verdict == "does not hold here: quantization saved 280 ms for less of every cost per ms"


def test_stored_result_reads_the_newest_run_of_this_machine(tmp_path):
    assert prefix_caching.stored_result("quantization", {"model": MODEL}) is None
    store_quantization(0.97)
    (tmp_path / "quantization_old-0123456789abcdef.json").write_text("{}")  # another name
    (tmp_path / "quantization-fedcba9876543210.json").write_text("not json")
    found = prefix_caching.stored_result("quantization", {"model": MODEL, "dtype": "torch.float32"})
    assert found.from_cache and found["rows"][1]["scheme"] == "int8"
    assert prefix_caching.stored_result("quantization", {"model": MODEL, "dtype": "torch.float16"}) is None
