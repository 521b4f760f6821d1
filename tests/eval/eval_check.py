"""``make eval-check``: lm-eval against ``python -m minieng serve`` and against transformers, on the
same local model directory and the same task; their accuracies must be equal.

1. Starts ``python -m minieng serve --device cpu --dtype float32`` (the embedded default model) on a free port of
   127.0.0.1 and waits for ``/health``.
2. Runs lm-eval's ``local-completions`` model against it: ``--batch_size 4`` sends four
   loglikelihood requests per HTTP request (a batch of token-id prompts, ``max_tokens: 1,
   logprobs: 1, echo: true``), scored from the prompt's log-probabilities.
3. Stops the server, runs lm-eval's ``hf`` model on the model directory the server loaded
   (``minieng.model.loader.resolve_model_dir``: the embedded GGUF's conversion), fp32 on the CPU.
4. Compares: ``acc`` and ``acc_norm`` must be equal (exit status 1 otherwise); it also prints the
   largest difference between the two runs' per-choice log-likelihoods and whether their
   ``is_greedy`` flags agree.

The task is ``minieng_facts`` (``minieng_facts.yaml``: 20 questions of ``facts.jsonl``, no
download). lm-eval is heavy: it lives in a virtual environment of its own (``make eval-check``
builds it, ``EVAL_VENV``), never in the project's; pass its ``lm_eval`` with ``--lm-eval``. Run
from the repository root (the task's ``data_files`` path is relative to it).

    python tests/eval/eval_check.py --lm-eval build/evalvenv/bin/lm_eval
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TASK = "minieng_facts"
TASK_DIR = "tests/eval"
METRICS = ("acc", "acc_norm")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lm_eval_command(
    lm_eval: str, model: str, model_args: dict, output: Path, batch_size: int, *extra: str
) -> list[str]:
    """One ``lm_eval run`` of the task, its per-item samples logged under ``output``."""
    args = ",".join(f"{k}={v}" for k, v in model_args.items())
    return [
        lm_eval, "run", "--model", model, "--model_args", args, "--include_path", TASK_DIR, "--tasks", TASK,
        "--batch_size", str(batch_size), "--output_path", str(output), "--log_samples", *extra,
    ]  # fmt: skip


def run(command: list[str], env: dict) -> None:
    print("+", shlex.join(command), flush=True)
    subprocess.run(command, cwd=ROOT, env=env, check=True)


def read_run(output: Path) -> tuple[dict, list[dict]]:
    """The task's metrics and its per-item samples (sorted by doc_id) of the run written to ``output``."""
    results = sorted(output.rglob("results_*.json"))
    samples = sorted(output.rglob(f"samples_{TASK}_*.jsonl"))
    if not results or not samples:
        raise SystemExit(f"lm-eval wrote no results under {output}")
    metrics = json.loads(results[-1].read_text())["results"][TASK]
    items = [json.loads(line) for line in samples[-1].read_text().splitlines() if line.strip()]
    return {m: metrics[f"{m},none"] for m in METRICS}, sorted(items, key=lambda item: item["doc_id"])


def wait_for_health(url: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"python -m minieng serve exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"the server did not answer {url} within {timeout_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lm-eval", default="lm_eval", help="the lm_eval executable (default: on PATH)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--output", type=Path, default=ROOT / "build" / "eval-check", help="lm-eval's outputs")
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)

    from minieng.config import DEFAULT_MODEL_NAME
    from minieng.model.loader import resolve_model_dir

    model_dir = resolve_model_dir(None)  # converts the embedded GGUF once, if not yet done
    env = {**os.environ, **OFFLINE}
    port = free_port()
    served_out, hf_out = args.output / "served", args.output / "hf"

    serve = [sys.executable, "-m", "minieng", "serve", "--port", str(port), "--device", "cpu", "--dtype", "float32"]
    serve += ["--log-interval-s", "0"]
    print("+", shlex.join(serve), flush=True)
    server = subprocess.Popen(serve, cwd=ROOT, env=env)
    try:
        wait_for_health(f"http://127.0.0.1:{port}/health", server, args.startup_timeout_s)
        served_args = {
            "model": DEFAULT_MODEL_NAME,
            "base_url": f"http://127.0.0.1:{port}/v1/completions",
            "tokenizer": model_dir,
            "tokenizer_backend": "huggingface",
        }
        run(lm_eval_command(args.lm_eval, "local-completions", served_args, served_out, args.batch_size), env)
    finally:
        server.terminate()
        server.wait(timeout=60)
    hf_args = {"pretrained": model_dir, "dtype": "float32"}  # the server's dtype on a CPU
    run(lm_eval_command(args.lm_eval, "hf", hf_args, hf_out, args.batch_size, "--device", "cpu"), env)

    served, served_items = read_run(served_out)
    hf, hf_items = read_run(hf_out)
    assert [i["doc_id"] for i in served_items] == [i["doc_id"] for i in hf_items], "the same items"
    pairs = [
        (float(a[0]), float(b[0]), a[1] == b[1])
        for x, y in zip(served_items, hf_items)
        for a, b in zip(x["filtered_resps"], y["filtered_resps"])
    ]
    worst = max(abs(a - b) for a, b, _ in pairs)
    print(f"\n{TASK}: {len(served_items)} items, {len(pairs)} choices scored")
    print(f"{'metric':<10} {'minieng serve':>14} {'hf':>8}")
    for m in METRICS:
        print(f"{m:<10} {served[m]:>14.4f} {hf[m]:>8.4f}")
    print(f"largest |log-likelihood difference| over the choices: {worst:.2e}")
    print(f"is_greedy flags agree on {sum(same for *_, same in pairs)}/{len(pairs)} choices")
    if any(served[m] != hf[m] for m in METRICS):
        print("FAIL: the accuracies differ", file=sys.stderr)
        return 1
    print("OK: the accuracies are equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
