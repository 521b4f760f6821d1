"""``python -m minieng bench``: the sweeps, and the serving, prefix-cache, speculative and quantization runs."""

from __future__ import annotations

import inspect
import json
import sys
import time
from dataclasses import asdict

from minieng.cli.args import engine_args, engine_from_args, int_list, slo_from_args, workload_args, workload_specs
from minieng.config import QUANTIZATION_SCHEMES
from minieng.lab.bench import BenchConfig, run_bench
from minieng.lab.prefix_caching import multi_turn, ttft_vs_hit_rate, zero_hit_overhead
from minieng.lab.quantization import QuantBenchConfig, run_quantization
from minieng.lab.replay import serving_bench
from minieng.lab.report import check_targets, format_table
from minieng.lab.speculative import speculative_bench
from minieng.lab.tensor_parallel import format_tensor_parallel, measure_tensor_parallel
from minieng.measure.peaks import Peak

# The options' defaults are the experiments' own: read once from their dataclass and signature.
SWEEPS, QUANT = BenchConfig(), QuantBenchConfig()
PREFIX = {k: v.default for k, v in inspect.signature(ttft_vs_hit_rate).parameters.items()}


def cmd_bench(args) -> int:
    if args.output_tokens < 2:
        raise ValueError(f"--output-tokens={args.output_tokens}: TPOT needs at least 2 output tokens")
    specs = workload_specs(args) if args.workload else None  # checked before the model loads
    if args.quantization:
        unknown = [q for q in args.quant_schemes or [] if q not in QUANTIZATION_SCHEMES]
        if unknown:
            raise ValueError(f"--quant-schemes: {', '.join(unknown)} unknown; use {', '.join(QUANTIZATION_SCHEMES)}")
    cfg = BenchConfig(
        prompt_lens=args.prompt_lens,
        batch_sizes=args.batch_sizes,
        output_tokens=args.output_tokens,
        decode_prompt_len=args.decode_prompt_len,
        repeats=args.repeats,
        compare_transformers=not args.no_transformers,
        energy=not args.no_energy,
        price_per_device_hour=args.price_per_device_hour,
    )
    log = (lambda msg: print(msg, file=sys.stderr)) if not args.json else (lambda msg: None)
    if args.tensor_parallel_size > 1:
        return tensor_parallel_bench(args, log)
    start = time.perf_counter()
    # A budget large enough that each sweep point prefills in one step: the decode figures then
    # time decode steps only, as transformers' batched generate does.
    budget = max(
        cfg.prompt_lens
        + [
            max(cfg.batch_sizes) * cfg.decode_prompt_len,
            512,
            args.prefix_prompt_tokens if args.prefix_cache else 0,
            args.quant_prompt_tokens if args.quantization else 0,
        ]
    )
    # Prefix caching off: prompts of the sweeps share beginnings, and a cache hit would time a
    # shorter prefill than the one reported (``--prefix-cache`` measures the cache itself).
    seqs = cfg.batch_sizes + [8] + (args.quant_batch_sizes if args.quantization else [])
    engine = engine_from_args(
        args, max_num_batched_tokens=max(budget, max(seqs)), max_num_seqs=max(seqs), enable_prefix_caching=False
    )
    load_s = time.perf_counter() - start
    if args.load_format == "dummy":
        cfg.compare_transformers = False
    result = run_bench(engine, cfg, load_s=load_s, progress=log, sweeps=not args.skip_sweeps)
    result["targets"] = check_targets(result) if args.model is None else []
    run = None
    if args.workload:
        log(f"serving: {args.workload} workload")
        result["serving"], run = serving_bench(
            engine, specs, [Peak.from_dict(p) for p in result["peaks"]], slo_from_args(args), args.workload
        )
    if args.prefix_cache:
        log("prefix cache: TTFT against hit rate")
        result["prefix_cache"] = ttft_vs_hit_rate(
            engine, args.prefix_prompt_tokens, requests=args.prefix_requests, progress=log
        )
        result["prefix_cache"]["multi_turn"] = multi_turn(engine)
        result["prefix_cache"]["zero_hit_overhead"] = zero_hit_overhead(engine)
    if args.speculative:
        result["speculative"] = speculative_bench(
            engine,
            args.spec_method,
            args.draft_model,
            args.spec_ks,
            args.spec_batch_sizes,
            args.spec_batch_k,
            args.spec_output_tokens,
            log,
        )
    if args.quantization:
        qcfg = QuantBenchConfig(
            schemes=args.quant_schemes,
            group_size=args.quant_group_size,
            prompt_tokens=args.quant_prompt_tokens,
            batch_sizes=args.quant_batch_sizes,
            repeats=args.repeats,
        )
        result["quantization"] = run_quantization(engine, qcfg, [Peak.from_dict(p) for p in result["peaks"]], log)
    result["wall_s"] = time.perf_counter() - start
    if args.plot:
        from minieng.viz.bench_figures import save_figures  # lazy: matplotlib loads only when asked to plot

        result["figures"] = save_figures(result, args.plot, engine, run)
    print(json.dumps(result, indent=2, default=str) if args.json else format_table(result))
    return 0


def tensor_parallel_bench(args, log) -> int:
    """``--tensor-parallel-size P``: decode at one rank and at P (each of ``--batch-sizes``), the
    all-reduce swept, the paper model fed the measurements (``lab.tensor_parallel``); the sweeps
    compare engines on one device and are not run."""
    run = measure_tensor_parallel(
        args.tensor_parallel_size,
        batch_sizes=tuple(args.batch_sizes),
        prompt_len=args.decode_prompt_len,
        output_tokens=args.output_tokens,
        progress=log,
        model=args.model,
        load_format=args.load_format,
        dtype=args.dtype,
        device=args.device,
    )
    print(json.dumps(asdict(run), indent=2, default=str) if args.json else format_tensor_parallel(run))
    return 0


def add_bench_parser(sub):
    """The ``bench`` command and its options; returns its parser."""
    b = sub.add_parser("bench", help="prefill and decode sweeps, against transformers' generate")
    engine_args(b)
    b.add_argument(
        "--prompt-lens",
        type=int_list,
        default=SWEEPS.prompt_lens,
        help="prefill sweep: prompt lengths (default: %(default)s)",
    )
    b.add_argument(
        "--batch-sizes",
        type=int_list,
        default=SWEEPS.batch_sizes,
        help="decode sweep: batch sizes (default: %(default)s)",
    )
    b.add_argument(
        "--output-tokens",
        type=int,
        default=SWEEPS.output_tokens,
        help="decode sweep: tokens per request (default: %(default)s)",
    )
    b.add_argument(
        "--decode-prompt-len",
        type=int,
        default=SWEEPS.decode_prompt_len,
        help="decode sweep: each sequence's prompt (default: %(default)s)",
    )
    b.add_argument(
        "--repeats", type=int, default=SWEEPS.repeats, help="runs per point, median reported (default: %(default)s)"
    )
    b.add_argument("--no-transformers", action="store_true", help="skip the transformers comparison")
    b.add_argument(
        "--no-energy", action="store_true", help="skip J/token per phase (measured where NVML or RAPL reads energy)"
    )
    b.add_argument(
        "--price-per-device-hour",
        type=float,
        default=None,
        help="what an hour of this device costs you, for the price per million tokens "
        "(default: an example value, labelled as one)",
    )
    b.add_argument("--json", action="store_true", help="print the whole result as one JSON object")
    b.add_argument(
        "--skip-sweeps",
        action="store_true",
        help="skip the prefill and decode sweeps (keep --workload, --prefix-cache, --speculative)",
    )
    b.add_argument("--plot", metavar="DIR", help="save the figures (roofline, latency CDFs, step timeline) as PNG")
    pc = b.add_argument_group("prefix caching: TTFT against hit rate, shared system prompt + user turn")
    pc.add_argument("--prefix-cache", action="store_true", help="run the prefix-cache experiment")
    pc.add_argument("--prefix-prompt-tokens", type=int, default=PREFIX["prompt_tokens"])
    pc.add_argument("--prefix-requests", type=int, default=PREFIX["requests"], help="warm requests per hit-rate point")
    sp = b.add_argument_group("speculative decoding: the k sweep and the batch sweep")
    sp.add_argument("--speculative", action="store_true", help="run the speculative-decoding experiment")
    sp.add_argument("--spec-method", choices=["draft", "ngram"], default="draft")
    sp.add_argument("--draft-model", default=None, help="draft model (default: the int8 self-draft on CPU)")
    sp.add_argument("--spec-ks", type=int_list, default=[1, 2, 4, 8])
    sp.add_argument("--spec-batch-sizes", type=int_list, default=[1, 4, 16])
    sp.add_argument("--spec-batch-k", type=int, default=4)
    sp.add_argument("--spec-output-tokens", type=int, default=48)
    q = b.add_argument_group("quantization: per scheme, bytes, TTFT and TPOT against the float model, accuracy")
    q.add_argument("--quantization", action="store_true", help="run the quantization experiment")
    q.add_argument(
        "--quant-schemes",
        type=lambda t: [x for x in t.split(",") if x],
        default=None,
        help="comma-separated schemes (default: every scheme that runs on the device)",
    )
    q.add_argument("--quant-group-size", type=int, default=QUANT.group_size, help="int4's inputs per scale and zero")
    q.add_argument("--quant-prompt-tokens", type=int, default=QUANT.prompt_tokens, help="the TTFT prompt's length")
    q.add_argument("--quant-batch-sizes", type=int_list, default=QUANT.batch_sizes)
    workload_args(
        b.add_argument_group("serving run (real-time arrivals; figures per vLLM's benchmark definitions)"),
        choices=["fixed", "poisson", "trace"],
        default=None,
    )
    b.set_defaults(func=cmd_bench)
    return b
