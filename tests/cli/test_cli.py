"""The command line: bad input is exit code 2 with "error:", and the bench end to end on the real model.

The first bench test is end to end (it loads the default model itself). The others reuse the
session's loaded model (``cli.args.engine_from_args`` patched to pass ``loaded=``) and measure the ceilings on
small sizes, to keep the suite short; everything else in the command runs as it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import re
from pathlib import Path

import pytest
import torch

from minieng import EngineConfig, LLMEngine
from minieng.cli import args as cli_args
from minieng.cli import bench as cli_bench
from minieng.cli import main as cli
from minieng.lab import bench
from minieng.lab.report import format_table
from minieng.measure import peaks
from minieng.viz import bench_figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def patch_engine(monkeypatch, engine) -> None:
    """Every command that builds an engine from its options builds ``engine(args, **overrides)`` instead."""
    monkeypatch.setattr(cli, "engine_from_args", engine)
    monkeypatch.setattr(cli_bench, "engine_from_args", engine)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These tests check what the bench reports, not how fast it runs. One thread keeps them short
    on a shared 2-core machine: with a second busy process there, 2 torch threads made each
    forward pass ~35x slower (7.9 s against 0.22 s for a 16-token generate), 1 thread did not."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- bad input --------------------------------------------------------------------------------------


def test_generate_with_a_missing_model_dir(capsys):
    code, out, err = run_cli(capsys, "generate", "x", "--model", "/nonexistent/dir")
    assert code == 2
    assert err.startswith("error:") and "/nonexistent/dir" in err
    assert "Traceback" not in err and out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_bench_on_cuda_without_a_gpu(capsys):
    code, _, err = run_cli(capsys, "bench", "--device", "cuda", "--no-transformers")
    assert code == 2
    assert err.startswith("error:") and "CUDA" in err


def test_malformed_list_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--batch-sizes", "1,two"])
    assert exit_.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_help_reads_as_plain_text(capsys):
    for argv in (["--help"], ["generate", "--help"], ["bench", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert "``" not in out and "usage:" in out
    assert "python -m minieng generate" in cli.__doc__ and "``" not in cli.__doc__


@pytest.fixture
def no_model_load(monkeypatch):
    """``cli.args.engine_from_args`` failing the test: the command must refuse its input before loading a model."""

    def engine(args, **overrides):
        raise AssertionError("the model was loaded before the arguments were checked")

    patch_engine(monkeypatch, engine)


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["generate", "hi", "--max-tokens", "-3"], "--max-tokens=-3 is invalid"),
        (["generate", "hi", "--temperature", "-1"], "--temperature=-1.0 is invalid"),
        (["generate", "hi", "--top-p", "0"], "--top-p=0.0 is invalid"),
        (["generate", "hi", "--top-k", "-2"], "--top-k=-2 is invalid"),
        (["generate", ""], "prompt is empty"),
        (["generate", "  \n "], "prompt is empty"),
        (["generate", "", "--raw"], "prompt is empty"),
        (["bench", "--output-tokens", "1"], "--output-tokens=1"),
        (["bench", "--workload", "trace", "--trace", "/nonexistent/conv.csv"], "/nonexistent/conv.csv not found"),
    ],
)
def test_bad_arguments_are_refused_before_the_model_loads(capsys, no_model_load, argv, expected):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("error:") and expected in err, err
    assert not re.search(r"(?<![\w-])(max_tokens|temperature|top_p|top_k)=", err), "API wording on the command line"


def test_trace_workload_without_a_csv_is_sampled_from_the_quantiles(capsys):
    """No --trace: requests sampled from the stored quantiles of --trace-service, scaled as asked,
    and a line that says they are not the trace itself."""
    from argparse import Namespace

    from minieng.measure.workloads import sampled_trace_workload, scale_workload

    args = Namespace(
        workload="trace",
        trace=None,
        trace_service="code",
        num_requests=7,
        seed=3,
        time_scale=2.0,
        length_scale=0.5,
        max_prompt_tokens=600,
        max_output_tokens=20,
    )
    specs = cli_args.workload_specs(args)
    assert specs == scale_workload(sampled_trace_workload(7, "code", seed=3), 2.0, 0.5, 600, 20)
    err = capsys.readouterr().err
    assert "7 requests sampled from the Azure 2023 code trace's quantiles" in err and "not the trace itself" in err


def test_errors_use_the_command_line_words(capsys):
    code, _, err = run_cli(capsys, "generate", "x", "--model", "no-such-org/no-such-model")
    assert code == 2 and "omit --model" in err and "model=None" not in err and "--model=" in err
    flags = {"model": "--model", "max_tokens": "--max-tokens"}
    assert (
        cli_args.cli_wording("use the default (model=None); max_tokens=0 is invalid; draft_max_tokens=1", flags)
        == "use the default (omit --model); --max-tokens=0 is invalid; draft_max_tokens=1"
    )
    assert cli_args.cli_wording("point model= at a directory", flags) == "point --model at a directory"


def test_generate_sends_the_chat_template_tokenized_once(capsys, monkeypatch, tiny_llama):
    """The chat template's BOS and the tokenizer's are not both sent (a tokenizer that adds BOS)."""
    from helpers import BOS_ID, bos_tokenizer, make_engine

    from minieng.model.loader import LoadedModel

    loaded = tiny_llama[1]
    engines = []

    def engine(args, **overrides):
        engines.append(make_engine(LoadedModel(loaded.model, bos_tokenizer(), loaded.hf_config, {2}, None)))
        return engines[-1]

    patch_engine(monkeypatch, engine)
    code, out, err = run_cli(capsys, "generate", "w7 w8", "--max-tokens", "3")
    assert code == 0 and "3 tokens" in err
    prompt = engines[0].output("cli").prompt_token_ids
    assert prompt == [BOS_ID, 3, 7, 8, 4] and prompt.count(BOS_ID) == 1
    code, _, _ = run_cli(capsys, "generate", "w7 w8", "--max-tokens", "3", "--raw")
    assert code == 0 and engines[1].output("cli").prompt_token_ids == [BOS_ID, 7, 8]


# -- the bench on the real model --------------------------------------------------------------------


@pytest.fixture
def shared_model_cli(monkeypatch, default_model):
    """``cli.args.engine_from_args`` building its engine on the session's loaded model; small ceiling runs."""

    def engine(args, **overrides):
        return LLMEngine(
            EngineConfig(
                model=args.model, load_format=args.load_format, dtype=args.dtype, device=args.device, **overrides
            ),
            loaded=default_model,
        )

    def small_ceilings(device, dtype, repeats=5):
        mm = peaks.measure_matmul(device, dtype, n=256, repeats=2)
        cp = peaks.measure_copy(device, nbytes=16 * 1024**2, repeats=2)
        return peaks.Peak(f"measured {device.type}", mm.p90 / 1e12, cp.p90 / 1e9, "measured"), mm, cp

    patch_engine(monkeypatch, engine)
    monkeypatch.setattr(bench, "measure_ceilings", small_ceilings)


SWEEP_ARGS = (
    "bench",
    "--json",
    "--no-transformers",
    "--prompt-lens",
    "16",
    "--batch-sizes",
    "1,2",
    "--output-tokens",
    "3",
    "--repeats",
    "1",
)


@pytest.mark.real_model
def test_bench_sweeps_end_to_end(capsys):
    code, out, _ = run_cli(capsys, *SWEEP_ARGS)
    assert code == 0
    result = json.loads(out)
    assert {
        "environment",
        "config",
        "load_s",
        "peaks",
        "ceilings",
        "prefill",
        "decode",
        "phase_ratio",
        "targets",
        "wall_s",
    } <= set(result)
    cfg = result["config"]
    assert (cfg["prompt_lens"], cfg["batch_sizes"], cfg["output_tokens"], cfg["repeats"]) == ([16], [1, 2], 3, 1)
    assert cfg["compare_transformers"] is False
    assert result["environment"]["device"] == "cpu" and result["environment"]["dtype"] == "float32"
    assert result["load_s"] > 0

    (peak,) = result["peaks"]  # no datasheet for a CPU
    assert peak["source"] == "measured"
    assert peak["ridge_flop_per_byte"] == pytest.approx(peak["peak_tflops"] * 1e12 / (peak["bandwidth_gbps"] * 1e9))

    (pre,) = result["prefill"]
    assert pre["prompt_tokens"] == 16
    assert pre["minieng_prefill_tok_s"] == pytest.approx(16 / (pre["minieng_ttft_ms"] / 1e3))
    assert "transformers_ttft_ms" not in pre
    assert [r["batch_size"] for r in result["decode"]] == [1, 2]
    for row in result["decode"]:
        assert row["minieng_decode_tok_s"] == pytest.approx(row["batch_size"] / (row["minieng_tpot_ms"] / 1e3))
        # Both prompts prefill in one step, so the decode figures cover the 2 decode-only steps.
        assert row["utilization"]["num_steps"] == 3 - 1
    for row in result["prefill"] + result["decode"]:
        u = row["utilization"]
        assert u["arithmetic_intensity_flop_per_byte"] > 0
        assert {"mfu_percent", "mbu_percent", "suspect"} <= set(u["measured"])
        assert u["measured"]["mfu_percent"] > 0 and u["measured"]["mbu_percent"] > 0
    # Prefill runs many tokens per weight read: its intensity is far above batch-1 decode's.
    b1 = result["decode"][0]["utilization"]
    assert pre["utilization"]["arithmetic_intensity_flop_per_byte"] > 4 * b1["arithmetic_intensity_flop_per_byte"]

    pr = result["phase_ratio"]
    assert pr["minieng_prefill_at_prompt_tokens"] == 16
    assert pr["minieng_ratio_x"] == pytest.approx(pr["minieng_prefill_tok_s"] / pr["minieng_decode_tok_s"])
    assert "transformers_ratio_x" not in pr

    table = format_table(result)
    assert "TTFT" in table and "TPOT" in table and "decode batch 2" in table


SERVING_ARGS = (
    "--json",
    "--skip-sweeps",
    "--workload",
    "fixed",
    "--num-requests",
    "2",
    "--prompt-tokens",
    "16",
    "--output-tokens-per-request",
    "3",
    "--slo-ttft-ms",
    "100000",
)


@pytest.mark.real_model
def test_bench_serving_run_with_figures(capsys, tmp_path, shared_model_cli):
    code, out, _ = run_cli(capsys, "bench", *SERVING_ARGS, "--plot", str(tmp_path / "figs"))
    assert code == 0
    result = json.loads(out)
    assert result["prefill"] == [] and result["decode"] == []
    serving = result["serving"]
    m = serving["metrics"]
    assert m["num_requests"] == m["completed"] == 2
    assert m["total_output_tokens"] == 6
    assert m["slo"]["ttft_ms"] == 100000
    assert m["num_good_requests"] == 2
    assert m["goodput_req_s"] == pytest.approx(2 / m["duration_s"])
    assert m["ttft_ms"]["count"] == 2
    assert serving["workload"] == {
        "kind": "fixed",
        "num_requests": 2,
        "prompt_tokens_total": 32,
        "output_tokens_total": 6,
        "last_arrival_s": 0.0,
    }
    assert serving["steps_with_prefill"]["num_steps"] >= 1 and serving["decode_only_steps"]["num_steps"] >= 1
    figures = [Path(p) for p in result["figures"]]
    assert {p.name for p in figures} == {"latency_cdf.png", "step_timeline.png"}  # no sweep: no roofline
    for p in figures:
        assert p.parent == tmp_path / "figs"
        assert p.read_bytes().startswith(PNG_MAGIC)

    table = format_table(result)
    assert "TTFT" in table and "goodput" in table and "Serving run: fixed workload, 2 requests" in table


@pytest.mark.real_model
def test_bench_serving_json_holds_no_python_objects(capsys, monkeypatch, shared_model_cli):
    """Without --plot, the serving run's raw ``WorkloadResult`` (kept for the figures) must not
    end up in the JSON as its repr string. (The ceilings and warm-up are skipped: a fixed peak.)"""
    from dataclasses import asdict

    peak = peaks.Peak("made-up", 1.0, 10.0, "measured")
    monkeypatch.setattr(
        bench,
        "run_bench",
        lambda engine, cfg, **kw: {
            "environment": {},
            "config": asdict(cfg),
            "prefill": [],
            "decode": [],
            "peaks": [asdict(peak) | {"ridge_flop_per_byte": peak.ridge_flop_per_byte}],
        },
    )
    code, out, _ = run_cli(capsys, "bench", *SERVING_ARGS)
    assert code == 0
    serving = json.loads(out)["serving"]
    assert "_run" not in serving, "the WorkloadResult leaked into the JSON: " + str(serving.get("_run"))[:80]


@pytest.mark.real_model
def test_bench_with_one_output_token_is_bad_input(capsys, shared_model_cli):
    """TPOT needs at least 2 output tokens: --output-tokens 1 should be refused as bad input
    (exit 2, "error:"), not crash with a traceback after the sweeps have run."""
    code, _, err = run_cli(
        capsys,
        "bench",
        "--json",
        "--no-transformers",
        "--prompt-lens",
        "",
        "--batch-sizes",
        "1",
        "--output-tokens",
        "1",
        "--repeats",
        "1",
    )
    assert code == 2
    assert err.startswith("error:") and "output" in err


# -- the figures of a serving run, GPU telemetry included (faked: CI has no GPU) ----------------------


def test_save_figures_with_telemetry(tmp_path, tiny_engine):
    """``save_figures`` draws the utilization figure only when NVML samples exist, so only on a
    GPU; fake samples (N/A GPM fields, as on a pre-Hopper GPU) run that path on a CPU."""
    from dataclasses import asdict

    from helpers import random_prompts

    from minieng.lab.replay import run_workload, serving_report
    from minieng.measure.metrics import SLO
    from minieng.measure.nvml import Sample
    from minieng.measure.workloads import fixed_workload

    engine = tiny_engine()
    specs = fixed_workload(2, 6, 4)
    run = run_workload(engine, specs, prompts=random_prompts([6, 6], 300, seed=5))
    run.telemetry = [
        Sample(run.start_s + 0.01 * i, 90.0, 40.0, 70.0, 1400.0, 2**30, 50.0, 0, None, None, None) for i in range(5)
    ]
    peak = peaks.Peak("made-up", 1.0, 10.0, "measured")
    serving = serving_report(run, engine.model_config, 4, [peak], SLO(ttft_ms=50.0))
    result = {
        "environment": {"device_name": "fake GPU"},
        "prefill": [],
        "decode": [],
        "serving": serving,
        "peaks": [asdict(peak) | {"ridge_flop_per_byte": peak.ridge_flop_per_byte}],
    }
    paths = [Path(p) for p in bench_figures.save_figures(result, str(tmp_path), engine, run)]
    assert {p.name for p in paths} == {"latency_cdf.png", "step_timeline.png", "utilization.png"}
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in paths)
    json.dumps(result)


@pytest.mark.real_model
def test_bench_tensor_parallel_from_the_command_line():
    """``python -m minieng bench --tensor-parallel-size 2`` in a fresh interpreter: the spawned
    worker re-imports ``minieng.__main__`` without running the command again, and the run reports
    both sizes, rank 0's collectives, the all-reduce sweep and its fitted link."""
    argv = [sys.executable, "-m", "minieng", "bench", "--tensor-parallel-size", "2", "--device", "cpu"]
    argv += ["--batch-sizes", "1", "--output-tokens", "4", "--decode-prompt-len", "16", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(done.stdout)
    one, two = run["steps"]
    assert (one["num_ranks"], two["num_ranks"]) == (1, 2)
    assert one["comm_s"] == 0 and one["collectives_per_step"] == 0
    assert 0 < two["comm_s"] < two["forward_s"] and two["collectives_per_step"] == 2 * 30 + 2
    assert len(run["all_reduce_s"]) == len(run["sizes_bytes"]) and all(t > 0 for t in run["all_reduce_s"])
    assert all(0 < q <= m for q, m in zip(run["all_reduce_p25_s"], run["all_reduce_s"]))
    assert run["link"]["bandwidth_gbps"] > 0 and run["hop_latency_s"] >= 0
    assert {m["reading"] for m in run["modelled"]} == {"own memory", "one shared bus"}


# -- workshop hosts: colab and doctor --------------------------------------------------------------


def test_colab_without_a_git_url_says_what_to_pass(capsys, tmp_path):
    code, out, err = run_cli(capsys, "colab", "--output", str(tmp_path / "out"))
    assert code == 2 and "error: pass --git-url URL" in err
    assert not (tmp_path / "out").exists()  # nothing written: the course knows no URL of its own


def test_colab_writes_the_notebooks_and_prints_a_link_per_notebook(capsys, tmp_path):
    from minieng.package_data import notebooks_path

    names = sorted(p.name for p in notebooks_path().glob("*.ipynb"))
    code, out, _ = run_cli(
        capsys, "colab", "--git-url", "https://github.com/alice/minieng.git", "--branch", "workshop",
        "--output", str(tmp_path),
    )  # fmt: skip
    assert code == 0 and sorted(p.name for p in tmp_path.glob("*.ipynb")) == names
    assert "commit them and push them to https://github.com/alice/minieng.git on branch workshop" in out
    links = re.findall(r"https://colab\.research\.google\.com/github/alice/minieng/blob/workshop/notebooks/(\S+)", out)
    assert links == names
    code, out, _ = run_cli(
        capsys, "colab", "--git-url", "https://git.example.org/course.git", "--output", str(tmp_path)
    )
    assert code == 0 and "colab.research.google.com" not in out and "Colab opens notebooks from GitHub only" in out


def test_doctor_exits_non_zero_with_the_fix_when_a_check_fails(capsys, monkeypatch):
    from minieng.course import doctor

    def short(m):
        return doctor.Check("memory", "FAIL", "needs 9 GiB, 4 GiB free", "close other notebooks")

    def fine(m):
        return doctor.Check("device", "ok", "cpu")

    monkeypatch.setattr(doctor, "CHECKS", (fine, short))
    code, out, _ = run_cli(capsys, "doctor")
    assert code == 1 and "FAIL  memory" in out and "fix: close other notebooks" in out
    monkeypatch.setattr(doctor, "CHECKS", (fine,))
    code, out, _ = run_cli(capsys, "doctor")
    assert code == 0 and "Ready for the workshop" in out
