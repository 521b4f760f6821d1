"""The GPU check's parts that a CPU runs: greedy parity's reference, decode rows' labels, the
targets, the summary, NVML during decode on a tiny checkpoint, and a failing section's guard.
The whole check in smoke mode, through its script: tests/test_gpu_check.py."""

from __future__ import annotations

import pytest
import torch
from fake_nvml import FakeGPU, FakeNVML

from gpu_checks import run as run_module
from gpu_checks import run_gpu_check, summary_lines
from gpu_checks.checkpoints import SMOKE, TINY, make_checkpoint
from gpu_checks.parity import greedy_agreement, reference_greedy
from gpu_checks.speed import decode_mode, nvml_during_decode
from gpu_checks.targets import targets
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


# -- issue 33's predictions (``predictions.py``, ``verdicts.py``): the verdicts, and the instruments -----


def test_every_prediction_is_confirmed_at_its_bound_and_refuted_past_it():
    """A verdict that cannot fail teaches nothing: each prediction's figure at its bound confirms
    it, a figure above refutes it, and no figure leaves it untested, saying why."""
    from gpu_checks.verdicts import PREDICTIONS, decide, pred_line, untested

    assert len(PREDICTIONS) >= 19 and all(p.source and p.unit for p in PREDICTIONS.values())
    for pid, p in PREDICTIONS.items():
        at = decide(pid, p.bound, "at the bound")
        past = decide(pid, p.bound + 0.5, "past it")
        assert at["verdict"] == "CONFIRMED" and past["verdict"] == "REFUTED", pid
        assert pred_line(past).startswith(f"PRED {pid} REFUTED {p.bound + 0.5:.4g} {p.unit} (<= {p.bound:g}")
        gone = untested(pid, "needs CUDA")
        assert gone["verdict"] == "UNTESTED" and gone["figure"] is None
        assert pred_line(gone) == f"PRED {pid} UNTESTED (needs CUDA)"
    with pytest.raises(KeyError):
        decide("no-such-prediction", 0.0)


def test_the_summary_prints_a_pred_line_per_prediction_even_when_the_section_failed():
    from gpu_checks.report import prediction_lines
    from gpu_checks.verdicts import PREDICTIONS, decide

    records = [decide(pid, 0.0) for pid in PREDICTIONS]
    lines = summary_lines({"predictions": {"records": records}})
    assert [line.split()[1] for line in lines] == list(PREDICTIONS)
    assert all(line.startswith("PRED ") and " CONFIRMED 0 " in line for line in lines)
    failed = prediction_lines({"error": "RuntimeError: boom", "traceback": "..."})
    assert len(failed) == len(PREDICTIONS) and all(
        "UNTESTED (the section failed: RuntimeError: boom)" in x for x in failed
    )
    assert prediction_lines(None) == []


def test_a_group_that_raises_leaves_its_predictions_untested_and_the_others_decided(monkeypatch, tmp_path):
    from gpu_checks import predictions as pr
    from gpu_checks.verdicts import PREDICTIONS, decide, untested

    def boom(*args):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(pr, "sm75_refused", lambda: [decide("triton-sm75-refused", 0)])
    monkeypatch.setattr(pr, "load_peak", lambda device, smoke: [decide("load-peak-bytes", 3.0)])
    monkeypatch.setattr(pr, "decode_path_checks", boom)
    monkeypatch.setattr(pr, "sampling_syncs", lambda device: [])  # forgets its prediction
    monkeypatch.setattr(pr, "triton_vs_gather", lambda device, smoke: [untested("triton-vs-gather", "no")])
    monkeypatch.setattr(pr, "quant_linears", lambda device, smoke: [decide("w8a8-ops", 8)])
    monkeypatch.setattr(pr, "compiled_regions", lambda work, device: [decide("compiled-regions", 0)])
    said = []
    out = pr.predictions(tmp_path, torch.device("cpu"), True, tmp_path, progress=said.append)
    got = {r["id"]: r for r in out["records"]}
    assert list(got) == list(PREDICTIONS) and set(out["group_s"]) >= {"paths", "nb10"}
    assert got["load-peak-bytes"]["verdict"] == "REFUTED" and got["w8a8-ops"]["verdict"] == "CONFIRMED"
    assert got["strict-paths"]["verdict"] == "UNTESTED" and "kernel exploded" in got["strict-paths"]["reason"]
    assert got["sampling-syncs"]["reason"] == "not measured by its group"
    assert got["quant-int4-linear"]["reason"] == "not measured by its group"
    assert got["nb10-t4"]["reason"].startswith("needs CUDA")
    assert any("kernel exploded" in line for line in said)


def test_the_sm75_refusal_is_read_from_the_backend_check_and_a_check_that_accepts_it_is_refuted(monkeypatch):
    from gpu_checks import predictions as pr
    from minieng.wings.fast_paths import triton_attention

    if not triton_attention.TRITON_AVAILABLE:
        pytest.skip("triton is not installed")
    record = pr.sm75_refused()[0]
    assert record["verdict"] == "CONFIRMED", record["details"]
    assert record["details"]["decisions"]["sm_80"] == "accepted"
    assert "sm_75" in record["details"]["decisions"]["sm_75"]
    monkeypatch.setattr(pr, "check_attention_backend", lambda backend, head_dim, device: None)  # accepts all
    wrong = pr.sm75_refused()[0]
    assert wrong["verdict"] == "REFUTED" and wrong["figure"] == 1


def test_the_allocation_trace_keeps_the_peak_of_live_bytes_and_a_float32_detour_is_refuted():
    from gpu_checks.verdicts import decide
    from minieng.measure.allocations import AllocationTrace

    n = 1000
    before = torch.ones(n)  # made before the trace: not counted
    with AllocationTrace("cpu") as trace:
        w = torch.empty(n, dtype=torch.float32)  # the old load: float32 storage first ...
        b = w.to(torch.bfloat16)  # ... then the bf16 copy, both alive
        del w
        before.mul_(2)  # in place: nothing new
        view = b.view(10, 100)  # a view: nothing new
    assert trace.peak_bytes == 6 * n and trace.live_bytes == 2 * n == view.untyped_storage().nbytes()
    assert trace.created_bytes == 6 * n and trace.largest(torch.float32) == 4 * n
    assert [a.op for a in trace.allocations] == ["empty", "_to_copy"]
    assert decide("load-peak-bytes", trace.peak_bytes / n)["verdict"] == "REFUTED"
    assert decide("load-peak-bytes", trace.live_bytes / n)["verdict"] == "CONFIRMED"


def test_host_syncs_are_counted_on_a_cpu_as_transfers_to_the_host():
    from gpu_checks.step_dispatch import count_host_syncs
    from gpu_checks.verdicts import decide

    x = torch.arange(6.0)

    def three():
        x.tolist()
        x.sum().item()
        int(x[2])

    assert count_host_syncs(three, torch.device("cpu")) == 3
    assert count_host_syncs(lambda: x * 2, torch.device("cpu")) == 0
    assert decide("sampling-syncs", count_host_syncs(three, torch.device("cpu")))["verdict"] == "REFUTED"


def test_the_memory_cap_is_set_and_restored_and_out_of_memory_refutes_it():
    from types import SimpleNamespace

    from gpu_checks.memory_peaks import GIB, under_memory_cap

    class FakeCuda:
        def __init__(self, peak_gib):
            self.fractions, self.peak = [], peak_gib * GIB

        def empty_cache(self):
            pass

        def get_device_properties(self, device):
            return SimpleNamespace(total_memory=140 * GIB)

        def reset_peak_memory_stats(self, device):
            pass

        def set_per_process_memory_fraction(self, fraction, device):
            self.fractions.append(fraction)

        def max_memory_reserved(self, device):
            return self.peak

        def max_memory_allocated(self, device):
            return self.peak * 0.9

        def memory_allocated(self, device):
            return 0

    dev = torch.device("cuda")
    fits = FakeCuda(10.0)
    record = under_memory_cap(lambda: {"engines": 7}, dev, 14.5, cuda=fits)
    assert record["verdict"] == "CONFIRMED" and record["figure"] == pytest.approx(10.0)
    assert fits.fractions == [pytest.approx(14.5 / 140), 1.0] and record["details"]["ran"] == {"engines": 7}
    assert under_memory_cap(lambda: None, dev, 14.5, cuda=FakeCuda(15.0))["verdict"] == "REFUTED"

    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    tight = FakeCuda(14.4)
    record = under_memory_cap(oom, dev, 14.5, cuda=tight)
    assert record["verdict"] == "REFUTED" and "Tried to allocate" in record["reason"] and tight.fractions[-1] == 1.0

    def capture_dropped():
        import warnings

        warnings.warn("CUDA graph capture failed (OutOfMemoryError: CUDA out of memory); decode steps run eagerly")

    record = under_memory_cap(capture_dropped, dev, 14.5, cuda=FakeCuda(12.0))
    assert record["verdict"] == "REFUTED" and "1 fast path(s) dropped" in record["reason"]

    def bug():
        raise KeyError("not a memory problem")

    other = FakeCuda(1.0)
    with pytest.raises(KeyError):
        under_memory_cap(bug, dev, 14.5, cuda=other)
    assert other.fractions[-1] == 1.0


def test_attention_and_quantization_records_compare_ratios_with_their_bounds():
    from gpu_checks.kernel_times import attention_record, quant_records

    def point(ratio, agree=True):
        return {"shape": "Llama-3-8B", "batch": 1, "context": 8192, "gather_ms": 1.0, "triton_ms": ratio,
                "ratio": ratio, "agree": agree}  # fmt: skip

    assert attention_record([point(0.5), point(0.9)], timed=True)["verdict"] == "CONFIRMED"
    slow = attention_record([point(0.5), point(1.3)], timed=True)
    assert slow["verdict"] == "REFUTED" and slow["figure"] == pytest.approx(1.3)
    assert attention_record([point(0.5), point(0.4, agree=False)], timed=True)["verdict"] == "REFUTED"
    assert attention_record([point(0.5)], timed=False)["verdict"] == "UNTESTED"

    ms = {"bf16": {1: 0.10, 16: 0.12}, "int8": {1: 0.07, 16: 0.10}, "w8a8": {1: 0.05, 16: 0.06}}
    got = {r["id"]: r for r in quant_records(ms, {"int4": "RuntimeError: no tinygemm"})}
    assert got["quant-int8-linear"]["verdict"] == "REFUTED" and got["quant-int8-linear"]["figure"] == pytest.approx(0.7)
    assert got["quant-w8a8-linear"]["verdict"] == "CONFIRMED"
    assert got["quant-w8a8-linear"]["details"]["ratio"][16] == pytest.approx(0.5)
    assert got["quant-int4-linear"]["verdict"] == "UNTESTED" and "no tinygemm" in got["quant-int4-linear"]["reason"]


def test_kernel_and_strict_path_records_need_a_real_measurement(monkeypatch):
    from gpu_checks import path_checks as pc

    rows = {
        "eager": {"kernels_per_step": 300, "layers": 30, "off_path": 0, "decode_steps": 5},
        "graph": {"kernels_per_step": 12, "layers": 30, "off_path": 0, "decode_steps": 5},  # missed the graph
        "compiled": {"kernels_per_step": 600, "layers": 30, "off_path": 2, "decode_steps": 5},
        "triton": {"error": "FastPathFailed: CUDA graph capture failed (OutOfResources)"},
    }
    got = {r["id"]: r for r in pc.kernel_records(rows, cuda=True)}
    assert got["kernels-eager"]["verdict"] == "CONFIRMED" and got["kernels-eager"]["figure"] == 10
    assert got["kernels-graph"]["verdict"] == "UNTESTED" and "fewer than the layers" in got["kernels-graph"]["reason"]
    assert got["kernels-compiled"]["verdict"] == "REFUTED"
    assert got["kernels-triton"]["verdict"] == "UNTESTED" and "OutOfResources" in got["kernels-triton"]["reason"]
    assert all(r["verdict"] == "UNTESTED" for r in pc.kernel_records(rows, cuda=False))

    strict = pc.strict_record(rows)
    assert strict["verdict"] == "REFUTED" and strict["figure"] == 3  # 2 steps off their path, 1 path failed
    assert "triton failed to build" in strict["reason"]
    clean = {"eager": {"off_path": 0, "decode_steps": 4}, "graph": {"off_path": 0, "decode_steps": 4}}
    assert pc.strict_record(clean)["verdict"] == "CONFIRMED"
    assert pc.strict_record({"eager": {"off_path": 0, "decode_steps": 0}})["verdict"] == "REFUTED"  # nothing ran
    monkeypatch.setattr(pc, "fall_back", lambda build, slower, strict, dropped: slower)  # never raises
    assert pc.strict_record(clean)["verdict"] == "REFUTED"


def _a_kernel(x_ptr):  # the source of a Triton kernel object (Triton reads it from this file)
    pass


def test_triton_variants_count_the_kernels_compiled_entries():
    """The count reads Triton's own cache of each kernel a module defines (behind an autotuner's
    ``.fn`` too): a variant compiled mid-run shows as one more entry; interpreted, nothing counts."""
    from types import SimpleNamespace

    from gpu_checks.path_checks import triton_variants
    from minieng.wings.fast_paths import triton_attention

    if not triton_attention.TRITON_AVAILABLE:
        pytest.skip("triton is not installed")
    from triton.runtime.jit import JITFunction

    split, combine = JITFunction(_a_kernel), JITFunction(_a_kernel)
    module = SimpleNamespace(
        TRITON_AVAILABLE=True, INTERPRETED=False, split=split, tuned=SimpleNamespace(fn=combine), other=len
    )
    split.device_caches = {0: ({}, {}, None, None, None)}
    combine.device_caches = {0: ({"k": 1}, {}, None, None, None)}
    assert triton_variants(module) == 1
    split.device_caches = {0: ({"a": 1, "b": 2}, {}, None, None, None), 1: ({"c": 3}, {}, None, None, None)}
    assert triton_variants(module) == 4
    module.INTERPRETED = True
    assert triton_variants(module) is None
    assert triton_variants(SimpleNamespace(TRITON_AVAILABLE=True, INTERPRETED=False, other=len)) is None
