"""The GPU check's parts that a CPU runs: greedy parity's reference, decode rows' labels, the
targets, the summary, NVML during decode on a tiny checkpoint, and a failing section's guard.
The whole check in smoke mode, through its script: tests/test_gpu_check.py."""

from __future__ import annotations

import pytest
import torch
from fake_nvml import FakeGPU, FakeNVML

from minieng.lab.gpu_check import run as run_module
from minieng.lab.gpu_check import run_gpu_check, summary_lines
from minieng.lab.gpu_check.checkpoints import SMOKE, TINY, make_checkpoint
from minieng.lab.gpu_check.parity import greedy_agreement, reference_greedy
from minieng.lab.gpu_check.speed import decode_mode, nvml_during_decode
from minieng.lab.gpu_check.targets import targets
from minieng.measure.peaks import Peak

PEAK = Peak("measured cpu float32", 0.07, 15.0, "measured")


def test_a_decode_row_is_labelled_by_the_steps_that_replayed_a_graph():
    """A batch too wide for any bucket runs eagerly: its row must not print "graphs"."""
    assert decode_mode({"graphed_steps": 16, "steps": 16}) == "graphs"
    assert decode_mode({"graphed_steps": 0, "steps": 16}) == "eager"
    assert decode_mode({"graphed_steps": 5, "steps": 16}) == "graphs 5/16"


def test_greedy_parity_runs_the_reference_through_eos(tiny_llama):
    """transformers' ``generate`` stops at the checkpoint's EOS whatever it is told; minieng's side
    ignores EOS. The reference must run as many tokens, and runs of different lengths are refused
    rather than read as agreement."""
    hf = tiny_llama[0]
    prompt = [5, 17, 42, 9]
    first = int(hf(torch.tensor([prompt])).logits[0, -1].argmax())
    hf.generation_config.eos_token_id = first  # the very first greedy token is EOS
    stopped = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(prompt) :]
    assert len(stopped) < 8  # what the old comparison read as a full agreement
    tokens = reference_greedy(hf, prompt, 8)
    assert len(tokens) == 8 and tokens[0] == first
    with torch.no_grad():  # each token the argmax after the ones before it
        for i in range(8):
            assert tokens[i] == int(hf(torch.tensor([prompt + tokens[:i]])).logits[0, -1].argmax())
    assert greedy_agreement(tokens, tokens) == 8
    assert greedy_agreement(tokens, tokens[:3] + [t + 1 for t in tokens[3:]]) == 3
    with pytest.raises(ValueError, match="same length"):
        greedy_agreement(tokens, tokens[:1])


def decode_row(batch_size: int, tpot_ms: float) -> dict:
    util = {"measured": {"mfu_percent": 1.0, "mbu_percent": 80.0}}
    return {"batch_size": batch_size, "tpot_ms": tpot_ms, "graphed_steps": 3, "steps": 3, "utilization": util}


def prefill_row(prompt_tokens: int, new_shape_cost_ms: float, mfu_percent: float) -> dict:
    util = {"measured": {"mfu_percent": mfu_percent, "mbu_percent": 5.0}}
    return {
        "prompt_tokens": prompt_tokens,
        "ttft_ms": 10.0,
        "first_request_ttft_ms": 10.0 + new_shape_cost_ms,
        "new_shape_cost_ms": new_shape_cost_ms,
        "utilization": util,
    }


def shape(name: str, decodes: list[dict], prefills: list[dict], floor_ms: float = 1.0) -> dict:
    return {
        "shape": name,
        "params": 1e9,
        "num_graphs": 4,
        "graph_capture_s": 1.0,
        "tpot_floor_b1_ms": floor_ms,
        "prefill": prefills,
        "decode_graphs": decodes,
        "decode_eager": decodes,
    }


def gpu_like_result() -> dict:
    return {
        "speed": [
            shape("smollm2-135m", [decode_row(1, 0.8)], [prefill_row(512, 2.0, 10.0)]),
            shape("smollm2-1.7b", [decode_row(1, 5.0)], [prefill_row(512, 1.0, 30.0)], floor_ms=4.0),
            shape(
                "llama-7b-hd64",
                [decode_row(1, 10.0), decode_row(64, 20.0)],
                [prefill_row(4096, 8.0, 55.0)],
                floor_ms=9.0,
            ),
            {"error": "RuntimeError: out of memory", "traceback": "..."},
        ],
        "prefix_cache": {
            "prompt_tokens": 16384,
            "cold_ttft_p50_ms": 100.0,
            "cold_ttft_p99_ms": 110.0,
            "points": [
                {"share": 0.0, "hit_rate": 0.0, "ttft_p50_ms": 101.0, "ttft_p99_ms": 111.0},
                {"share": 0.97, "hit_rate": 0.96, "ttft_p50_ms": 10.0, "ttft_p99_ms": 12.0},
            ],
        },
        "quantization": {
            "rows": [
                {"scheme": "none", "tpot_b1_ratio": 1.0},
                {
                    "scheme": "int8",
                    "ttft_ratio": 1.1,
                    "ttft_ratio_predicted": 1.0,
                    "tpot_b1_ratio": 0.7,
                    "tpot_b1_ratio_predicted": 0.5,
                },
            ]
        },
        "speculative": {"rows": [{"k": 1, "c": 0.1}, {"k": 2, "c": 0.15}]},
    }


def test_targets_read_pass_and_miss_from_the_figures():
    got = {t["target"]: t for t in targets(gpu_like_result())}
    assert got["smollm2-135m batch-1 TPOT"]["pass"] and got["smollm2-135m batch-1 TPOT"]["goal"] == "<= 1 ms"
    ratio = got["smollm2-1.7b batch-1 TPOT / (weights / measured bandwidth)"]
    assert ratio["value"] == pytest.approx(1.25) and ratio["pass"] and ratio["goal"] == "<= 1.35"
    assert got["llama-7b-hd64 batch-1 TPOT / (weights / measured bandwidth)"]["pass"]  # 10 / 9
    assert not got["llama-7b-hd64 batch-64 TPOT / batch-1 TPOT (1,024 context)"]["pass"]  # 2x > 1.6x
    assert got["llama-7b-hd64 prefill MFU at 4,096 tokens (measured peak)"]["pass"]
    assert not got["llama-7b-hd64 extra cost of a new prompt length"]["pass"]  # 8 ms > 5 ms
    assert got["smollm2-1.7b extra cost of a new prompt length"]["pass"]
    assert got["prefix-cache hit TTFT / cold TTFT, worst point with hits"]["value"] == pytest.approx(0.1)
    gain = got["cold TTFT / TTFT at >= 90% hits, 16384 tokens"]
    assert gain["value"] == pytest.approx(10.0) and gain["pass"] and gain["goal"] == ">= 5x"
    assert not got["quantization int8: batch-1 TPOT / bf16's"]["pass"]  # 0.7 > 0.6
    assert "quantization int4: batch-1 TPOT / bf16's" not in got  # no int4 row: no target
    assert got["speculative c (draft step / target step), worst k"]["value"] == pytest.approx(0.15)
    assert targets({}) == []  # nothing measured, nothing read


def test_the_summary_prints_each_section_and_the_targets():
    result = gpu_like_result()
    result["targets"] = targets(result)
    result["tensor_parallel"] = {"skipped": "1 GPU here: tensor parallelism needs two"}
    result["paths"] = {"rows": {"triton": {"skipped": "triton cannot run here"}}}
    text = "\n".join(summary_lines(result))
    assert "smollm2-1.7b: 1.00B params, 4 graphs captured in 1.0 s, b1 floor 4.00 ms" in text
    assert "decode b1    TPOT    5.00 ms graphs" in text
    assert "speed: RuntimeError: out of memory" in text
    assert "tensor parallelism needs two" in text and "decode path triton: triton cannot run here" in text
    assert "MISS  quantization int8: batch-1 TPOT / bf16's: 0.7 (goal <= 0.6)" in text
    assert summary_lines({}) == []


def test_nvml_during_decode_runs_on_a_cpu_and_says_nvml_has_nothing(tmp_path):
    """A CUDA-only section in the check, importable and runnable anywhere: on a CPU the sampler
    finds no GPU to read, and the decode's own figures are still there."""
    path = make_checkpoint(tmp_path / "tiny", TINY, SMOKE.max_position, torch.device("cpu"), weights=False)
    rows = nvml_during_decode(path, torch.device("cpu"), [PEAK], SMOKE, "dummy", nvml=FakeNVML([FakeGPU()]))
    assert [r["enforce_eager"] for r in rows] == [True, False]
    for r in rows:
        assert r["decode_steps"] >= 31 and r["tpot_ms"] > 0 and r["mbu_percent"] > 0
        assert r["nvml"]["num_samples"] == 0 and not r["nvml"]["reliable"]


def test_a_failing_section_leaves_its_error_and_the_others_run(monkeypatch):
    monkeypatch.setattr(run_module, "measure_ceilings", lambda device, dtype: (PEAK, None, None))

    def boom():
        raise RuntimeError("no such kernel")

    lines = []
    result = run_gpu_check(
        torch.device("cpu"),
        smoke=True,
        sections=[],
        extra={"boom": boom, "ok": lambda: {"x": 1}},
        progress=lines.append,
    )
    assert result["boom"]["error"] == "RuntimeError: no such kernel" and "Traceback" in result["boom"]["traceback"]
    assert result["ok"] == {"x": 1} and result["peaks"] == [PEAK.to_dict()]
    assert "parity" not in result and "nvml" not in result  # not chosen; nvml runs on CUDA only
    assert all(result[k] is None for k in ("prefix_cache", "speculative", "quantization", "tensor_parallel"))
    assert "speed" not in result and result["targets"] == []
    assert any(line.endswith("] boom") for line in lines) and any("no such kernel" in line for line in lines)
