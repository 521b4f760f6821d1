"""minieng on the command line.

  python -m minieng generate "prompt"   stream a reply (through the chat template unless --raw)
  python -m minieng bench               prefill and decode sweeps, serving runs, experiments
  python -m minieng serve               an OpenAI-compatible HTTP server (127.0.0.1:8000)
  python -m minieng loadgen --base-url URL   load any OpenAI-compatible server, report its latencies
  python -m minieng notebooks DEST      copy the course's notebooks into DEST, to open in JupyterLab
  python -m minieng course              run every notebook, write them as HTML, table the articles' claims

Run a command with --help for its options.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from minieng.config import DEFAULT_MODEL_NAME, EngineConfig, SamplingParams


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default=None, help=f"Hub id, local directory or .gguf file (default: embedded {DEFAULT_MODEL_NAME})"
    )
    p.add_argument(
        "--load-format",
        default=EngineConfig.load_format,
        choices=["auto", "dummy"],
        help="dummy = random weights of the real shape",
    )
    p.add_argument("--dtype", default=EngineConfig.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default=EngineConfig.device)


def _engine(args, **overrides):
    from minieng.engine.llm_engine import LLMEngine

    return LLMEngine(
        EngineConfig(model=args.model, load_format=args.load_format, dtype=args.dtype, device=args.device, **overrides)
    )


def cmd_generate(args) -> int:
    from minieng.engine.chat_template import EMPTY_PROMPT
    from minieng.measure.metrics import request_metrics

    # Everything that can be checked is checked before the model loads (seconds).
    if not args.prompt.strip():
        raise ValueError(EMPTY_PROMPT)
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed, max_tokens=args.max_tokens
    )
    engine = _engine(args)
    tok = engine.tokenizer
    if args.raw or tok is None or not tok.chat_template:
        prompt = args.prompt
    else:
        prompt = engine.chat_prompt(args.prompt)  # token ids: the template's special tokens, once
    for delta in engine.stream(prompt, params, request_id="cli"):
        print(delta, end="", flush=True)
    print()
    m = request_metrics(engine.output("cli"))
    summary = f"[{m.output_tokens} tokens, finish: {m.finish_reason}, TTFT {1e3 * m.ttft_s:.0f} ms"
    if m.tpot_s is not None:
        summary += f", TPOT {1e3 * m.tpot_s:.1f} ms"
    print(summary + "]", file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from minieng.lab.bench import BenchConfig, run_bench
    from minieng.lab.report import check_targets, format_table

    if args.output_tokens < 2:
        raise ValueError(f"--output-tokens={args.output_tokens}: TPOT needs at least 2 output tokens")
    specs = _workload_specs(args) if args.workload else None  # checked before the model loads
    if args.quantization:
        from minieng.config import QUANTIZATION_SCHEMES

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
    )
    log = (lambda msg: print(msg, file=sys.stderr)) if not args.json else (lambda msg: None)
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
    engine = _engine(
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
        from minieng.lab.replay import serving_bench
        from minieng.measure.peaks import Peak

        result["serving"], run = serving_bench(
            engine, specs, [Peak.from_dict(p) for p in result["peaks"]], _slo(args), args.workload
        )
    if args.prefix_cache:
        from minieng.lab.prefix_caching import multi_turn, ttft_vs_hit_rate, zero_hit_overhead

        log("prefix cache: TTFT against hit rate")
        result["prefix_cache"] = ttft_vs_hit_rate(
            engine, args.prefix_prompt_tokens, requests=args.prefix_requests, progress=log
        )
        result["prefix_cache"]["multi_turn"] = multi_turn(engine)
        result["prefix_cache"]["zero_hit_overhead"] = zero_hit_overhead(engine)
    if args.speculative:
        from minieng.lab.speculative import speculative_bench

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
        from minieng.lab.quantization_lab import QuantBenchConfig, run_quantization
        from minieng.measure.peaks import Peak

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
        from minieng.viz.bench_figures import save_figures

        result["figures"] = save_figures(result, args.plot, engine, run)
    print(json.dumps(result, indent=2, default=str) if args.json else format_table(result))
    return 0


def _workload_specs(args):
    from minieng.measure import workloads as w

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


def cmd_serve(args) -> int:
    from minieng.serve.server import serve

    engine = _engine(args, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    print(
        f"serving {args.served_model_name or engine.config.model or 'the embedded default'} at "
        f"http://{args.host}:{args.port}/v1 (Ctrl-C stops)",
        file=sys.stderr,
    )
    serve(engine, args.host, args.port, args.served_model_name)
    return 0


def _workload_args(s, choices: list[str], default: str | None) -> None:
    """The workload and SLO options shared by ``bench --workload`` and ``loadgen``."""
    from minieng.measure.workloads import TRACE_SERVICES

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


def _slo(args):
    from minieng.measure.metrics import SLO

    slos = {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms, "e2el_ms": args.slo_e2el_ms}
    return SLO(**slos) if any(v is not None for v in slos.values()) else None


def cmd_loadgen(args) -> int:
    from transformers import AutoTokenizer

    from minieng.lab.report import format_serving
    from minieng.model.loader import resolve_model_dir
    from minieng.serve.loadgen import load_requests, run_load, served_models

    models = served_models(args.base_url)
    model = args.model or (models[0] if models else None)
    if model is None:
        raise ValueError(f"{args.base_url}/models lists no model: pass --model")
    specs = _workload_specs(args)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(args.tokenizer))
    requests = load_requests(specs, tokenizer, as_text=args.endpoint == "chat" or not args.token_ids)
    result = run_load(
        args.base_url,
        model,
        requests,
        chat=args.endpoint == "chat",
        ignore_eos=not args.no_ignore_eos,
        progress=not args.json,
    )
    report = {
        "metrics": result.summary(_slo(args)).to_dict(),
        "errors": result.errors,
        "workload": {
            "kind": args.workload,
            "num_requests": len(specs),
            "prompt_tokens_total": sum(s.prompt_tokens for s in specs),
            "output_tokens_total": sum(s.output_tokens for s in specs),
            "last_arrival_s": max(s.arrival_s for s in specs),
        },
        "server": {"base_url": args.base_url, "model": model, "endpoint": args.endpoint},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"loadgen against {args.base_url} ({model}, /{args.endpoint}); sizes from the server's usage")
        print("\n".join(format_serving(report)))
        for error in result.errors[:5]:
            print(f"  error: {error}")
    return 0 if not result.errors else 1


def cmd_notebooks(args) -> int:
    from minieng.package_data import copy_notebooks

    copied, kept = copy_notebooks(args.dest)
    print(f"copied {len(copied)} notebooks into {args.dest}" + (f"; kept {len(kept)} already there" if kept else ""))
    import os

    as_root = (
        " --allow-root" if hasattr(os, "geteuid") and os.geteuid() == 0 else ""
    )  # JupyterLab refuses root otherwise
    print(f"open them with: jupyter lab {args.dest}{as_root}  (the jupyter of the environment minieng is installed in)")
    return 0


def cmd_course(args) -> int:
    try:
        from minieng.course.runner import report, run_course
    except ImportError as e:
        raise ValueError(
            f"the course needs {e.name or e}: pip install 'minieng[notebooks]' "
            "(in a checkout: pip install -e '.[notebooks]')"
        ) from None

    only = [x for x in args.only.split(",") if x.strip()] if args.only else None
    if args.timeout <= 0:
        raise ValueError(f"--timeout={args.timeout}: seconds a notebook may run, > 0")
    kwargs = {"notebooks_dir": args.notebooks} if args.notebooks else {}
    summary = run_course(
        output_dir=args.output, only=only, smoke=args.smoke, timeout_s=args.timeout, jobs=args.jobs, **kwargs
    )
    print(report(summary))
    failed = sum(r["status"] != "ok" for r in summary["notebooks"])
    print(f"\n{summary['mode']} mode, {summary['wall_s'] / 60:.1f} min; open {args.output}/index.html")
    print(f"notebooks: {len(summary['notebooks']) - failed} passed, {failed} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m minieng", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="stream a reply from the model")
    g.add_argument("prompt")
    _engine_args(g)
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    g.set_defaults(func=cmd_generate)
    b = sub.add_parser("bench", help="prefill and decode sweeps, against transformers' generate")
    _engine_args(b)
    b.add_argument("--prompt-lens", type=_int_list, default=[32, 128, 512, 1024])
    b.add_argument("--batch-sizes", type=_int_list, default=[1, 2, 4, 8, 16, 32])
    b.add_argument("--output-tokens", type=int, default=32)
    b.add_argument("--decode-prompt-len", type=int, default=64)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--no-transformers", action="store_true", help="skip the transformers comparison")
    b.add_argument("--json", action="store_true", help="print the whole result as one JSON object")
    b.add_argument(
        "--skip-sweeps",
        action="store_true",
        help="skip the prefill and decode sweeps (keep --workload, --prefix-cache, --speculative)",
    )
    b.add_argument("--plot", metavar="DIR", help="save the figures (roofline, latency CDFs, step timeline) as PNG")
    pc = b.add_argument_group("prefix caching: TTFT against hit rate, shared system prompt + user turn")
    pc.add_argument("--prefix-cache", action="store_true", help="run the prefix-cache experiment")
    pc.add_argument("--prefix-prompt-tokens", type=int, default=1024)
    pc.add_argument("--prefix-requests", type=int, default=4, help="warm requests per hit-rate point")
    sp = b.add_argument_group("speculative decoding: the k sweep and the batch sweep")
    sp.add_argument("--speculative", action="store_true", help="run the speculative-decoding experiment")
    sp.add_argument("--spec-method", choices=["draft", "ngram"], default="draft")
    sp.add_argument("--draft-model", default=None, help="draft model (default: the int8 self-draft on CPU)")
    sp.add_argument("--spec-ks", type=_int_list, default=[1, 2, 4, 8])
    sp.add_argument("--spec-batch-sizes", type=_int_list, default=[1, 4, 16])
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
    q.add_argument("--quant-group-size", type=int, default=64, help="int4's inputs per scale and zero")
    q.add_argument("--quant-prompt-tokens", type=int, default=512, help="the TTFT prompt's length")
    q.add_argument("--quant-batch-sizes", type=_int_list, default=[1, 16])
    _workload_args(
        b.add_argument_group("serving run (real-time arrivals; figures per vLLM's benchmark definitions)"),
        choices=["fixed", "poisson", "trace"],
        default=None,
    )
    b.set_defaults(func=cmd_bench)
    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    _engine_args(v)
    v.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument(
        "--served-model-name",
        default=None,
        help=f"the model id clients send (default: --model, or {DEFAULT_MODEL_NAME} for the embedded default)",
    )
    v.add_argument("--max-num-seqs", type=int, default=EngineConfig.max_num_seqs, help="most requests in a batch")
    v.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=EngineConfig.max_num_batched_tokens,
        help="token budget of one step",
    )
    v.set_defaults(func=cmd_serve)
    lg = sub.add_parser("loadgen", help="load any OpenAI-compatible server and report TTFT/TPOT/ITL/goodput")
    lg.add_argument("--base-url", required=True, help="the server's API root, e.g. http://127.0.0.1:8000/v1")
    lg.add_argument("--model", default=None, help="the model id to request (default: the first of /v1/models)")
    lg.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    lg.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer that cuts the prompts to length (Hub id or "
        "directory; default: the embedded SmolLM2's). Counts reported are the server's.",
    )
    lg.add_argument(
        "--token-ids",
        action="store_true",
        help="send prompts as token ids (exact lengths; the server must use the same tokenizer)",
    )
    lg.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="let answers stop at EOS (default: exactly the requested length, vLLM's ignore_eos)",
    )
    lg.add_argument("--json", action="store_true", help="print the whole result as one JSON object")
    _workload_args(lg, choices=["poisson", "trace", "fixed"], default="poisson")
    lg.set_defaults(func=cmd_loadgen)
    nb = sub.add_parser("notebooks", help="copy the course's notebooks into a folder (an installed wheel carries them)")
    nb.add_argument("dest", help="folder to copy into (created if needed); notebooks already there are kept")
    nb.set_defaults(func=cmd_notebooks)
    c = sub.add_parser(
        "course", help="execute every notebook, write them as HTML with an index, table the articles' claims"
    )
    c.add_argument(
        "--output",
        default="course-output",
        help="folder for the HTML, index.html, course.json and the notebooks' result cache (default: course-output)",
    )
    c.add_argument("--only", default=None, help="comma-separated notebook numbers, e.g. 01,07 (default: all)")
    c.add_argument("--smoke", action="store_true", help="MINIENG_SMOKE=1: every experiment shrunk to seconds")
    c.add_argument("--timeout", type=float, default=3600, help="seconds one notebook's cells may run (default 3600)")
    c.add_argument("--notebooks", default=None, help="the notebooks folder (default: the course's notebooks/)")
    c.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="notebooks run at once (default 1; more share the machine's "
        "cores, so their timings do too: for smoke runs)",
    )
    c.set_defaults(func=cmd_course)
    args = parser.parse_args(argv)
    # argparse lists a parser's options only in its private ``_actions``.
    flags = {
        a.dest: a.option_strings[-1]
        for p in (g, b, v, lg, c)
        for a in p._actions
        if a.option_strings and a.dest != "help"
    }
    try:
        return args.func(args)
    except ValueError as e:  # bad input: say what to do, without a traceback
        print(f"error: {cli_wording(str(e), flags)}", file=sys.stderr)
        return 2
