"""What the commands share: engine options, workload options, SLOs, and errors in the command line's words."""

from __future__ import annotations

import argparse
import re
import sys

from minieng.config import DEFAULT_MODEL_NAME, EngineConfig
from minieng.engine.llm_engine import LLMEngine
from minieng.measure import workloads as w
from minieng.measure.metrics import SLO
from minieng.measure.workloads import TRACE_SERVICES


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default=None, help=f"Hub id, local directory or .gguf file (default: embedded {DEFAULT_MODEL_NAME})"
    )
    p.add_argument(
        "--load-format",
        default=EngineConfig.load_format,
        choices=["auto", "dummy"],
        help="dummy = random weights of the real shape",
    )
    p.add_argument(
        "--dtype",
        default=EngineConfig.dtype,
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: float32 on a CPU, bfloat16 on a GPU with native bf16, else float16 (default: %(default)s)",
    )
    p.add_argument("--device", default=EngineConfig.device, help="auto (CUDA when available), cpu, cuda, cuda:1, ...")
    p.add_argument(
        "--compile",
        action="store_true",
        help="compile with torch.compile: the layers' dense parts, and on a CPU each plain decode step whole "
        "(start-up cost; a C++ compiler on a CPU)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=EngineConfig.tensor_parallel_size,
        help="split the model over this many ranks: one process each, a GPU each or sharing the CPU's cores; "
        "with bench, measure it against one rank (default: %(default)s)",
    )


def engine_from_args(args, **overrides):
    if args.compile:
        print("--compile: compiling at start-up (10 s to a few minutes, less once cached)", file=sys.stderr)
    engine = LLMEngine(
        EngineConfig(
            model=args.model,
            load_format=args.load_format,
            dtype=args.dtype,
            device=args.device,
            compile=args.compile,
            tensor_parallel_size=args.tensor_parallel_size,
            **overrides,
        )
    )
    if engine.runner.fast.compile_s is not None:
        print(f"--compile: compiled in {engine.runner.fast.compile_s:.1f} s", file=sys.stderr)
    return engine


def workload_specs(args):
    if args.workload == "fixed":
        return w.fixed_workload(
            args.num_requests, args.prompt_tokens, args.output_tokens_per_request, 1 / args.rate if args.rate else 0.0
        )
    if args.workload == "poisson":
        return w.poisson_workload(
            args.num_requests, args.rate or 1.0, args.prompt_tokens, args.output_tokens_per_request, args.seed
        )
    if args.trace:
        specs = w.read_trace(args.trace, args.num_requests)
        if not specs:
            raise ValueError(f"{args.trace} holds no requests to replay")
    else:
        specs = w.sampled_trace_workload(args.num_requests, args.trace_service, args.seed)
        print(
            f"trace workload: {len(specs)} requests sampled from the Azure 2023 {args.trace_service} trace's "
            f"quantiles ({w.TRACE_QUANTILES.parent.name}/), not the trace itself; --trace CSV replays the real one",
            file=sys.stderr,
        )
    return w.scale_workload(specs, args.time_scale, args.length_scale, args.max_prompt_tokens, args.max_output_tokens)


def cli_wording(message: str, flags: dict[str, str]) -> str:
    """An error in the Python API's words, in the command line's. ``flags``: field name -> option
    (``{"max_tokens": "--max-tokens"}``). ``max_tokens=-3`` becomes ``--max-tokens=-3``,
    ``model=None`` becomes ``omit --model`` and "point model= at" becomes "point --model at"."""
    for dest, flag in flags.items():
        name = rf"(?<![\w-]){dest}="  # the whole field name, not the end of another one
        message = re.sub(name + r"None\b", f"omit {flag}", message)
        message = re.sub(name + r"(?=\s)", flag, message)
        message = re.sub(name, f"{flag}=", message)
    return message


def workload_args(s, choices: list[str], default: str | None) -> None:
    """The workload and SLO options shared by ``bench --workload`` and ``loadgen``."""
    s.add_argument("--workload", choices=choices, default=default)
    s.add_argument("--num-requests", type=int, default=16)
    s.add_argument(
        "--rate", type=float, default=None, help="requests/s (poisson: default 1; fixed: default all at once)"
    )
    s.add_argument("--prompt-tokens", type=int, default=128)
    s.add_argument("--output-tokens-per-request", type=int, default=32)
    s.add_argument(
        "--trace",
        default=None,
        help="trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens); without it, "
        "requests are sampled from the Azure 2023 trace's quantiles kept in the course's data/",
    )
    s.add_argument(
        "--trace-service",
        choices=TRACE_SERVICES,
        default="conv",
        help="the Azure trace's service sampled when no --trace is given",
    )
    s.add_argument(
        "--time-scale", type=float, default=1.0, help="trace arrival times x this (4 = a quarter of the rate)"
    )
    s.add_argument("--length-scale", type=float, default=0.25, help="trace lengths x this, for a small machine")
    s.add_argument("--max-prompt-tokens", type=int, default=1024)
    s.add_argument("--max-output-tokens", type=int, default=128)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--slo-ttft-ms", type=float, default=None)
    s.add_argument("--slo-tpot-ms", type=float, default=None)
    s.add_argument("--slo-e2el-ms", type=float, default=None)


def slo_from_args(args):
    slos = {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms, "e2el_ms": args.slo_e2el_ms}
    return SLO(**slos) if any(v is not None for v in slos.values()) else None
