"""minieng on the command line.

  python -m minieng generate "prompt"   stream a reply (through the chat template unless --raw)
  python -m minieng bench               prefill and decode sweeps, serving runs, experiments
  python -m minieng serve               an OpenAI-compatible HTTP server (127.0.0.1:8000)
  python -m minieng loadgen --base-url URL   load any OpenAI-compatible server, report its latencies
  python -m minieng notebooks DEST      copy the course's notebooks into DEST, to open in JupyterLab
  python -m minieng course              run every notebook, write them as HTML, table the articles' claims
  python -m minieng colab --git-url URL write the notebooks for Colab, cloning the course from URL
  python -m minieng doctor              a workshop preflight: device, memory, ceilings, weights, widgets, time

Run a command with --help for its options.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from minieng.cli.args import cli_wording, engine_args, engine_from_args, slo_from_args, workload_args, workload_specs
from minieng.cli.bench import add_bench_parser
from minieng.config import DEFAULT_MODEL_NAME, EngineConfig, SamplingParams
from minieng.core.outputs import EMPTY_PROMPT
from minieng.lab.report import format_serving
from minieng.measure.logged_throughput import DEFAULT_LOG_INTERVAL_S
from minieng.measure.metrics import request_metrics
from minieng.model.loader import resolve_model_dir
from minieng.package_data import copy_notebooks
from minieng.measure.loadgen import REUSED_PROMPTS_HIT_RATE, load_requests, run_load, served_models


def cmd_generate(args) -> int:
    # Everything that can be checked is checked before the model loads (seconds).
    if not args.prompt.strip():
        raise ValueError(EMPTY_PROMPT)
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed, max_tokens=args.max_tokens
    )
    engine = engine_from_args(args)
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


def cmd_serve(args) -> int:
    from minieng.serve.server import serve  # lazy: FastAPI and uvicorn load only for this command

    engine = engine_from_args(args, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    print(
        f"serving {args.served_model_name or engine.config.model or 'the embedded default'} at "
        f"http://{args.host}:{args.port}/v1 (Ctrl-C stops)",
        file=sys.stderr,
    )
    serve(engine, args.host, args.port, args.served_model_name, args.log_interval_s)
    return 0


def cmd_loadgen(args) -> int:
    from transformers import AutoTokenizer  # lazy: transformers takes seconds to import

    models = served_models(args.base_url)
    model = args.model or (models[0] if models else None)
    if model is None:
        raise ValueError(f"{args.base_url}/models lists no model: pass --model")
    specs = workload_specs(args)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(args.tokenizer))
    requests = load_requests(specs, tokenizer, as_text=args.endpoint == "chat" or not args.token_ids, seed=args.seed)
    result = run_load(
        args.base_url,
        model,
        requests,
        chat=args.endpoint == "chat",
        ignore_eos=not args.no_ignore_eos,
        progress=not args.json,
    )
    report = {
        "metrics": result.summary(slo_from_args(args)).to_dict(),
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
        hit_rate = report["metrics"]["prefix_cache_hit_rate"]
        if hit_rate is not None and hit_rate >= REUSED_PROMPTS_HIT_RATE:
            print(
                f"  note: the server's prefix cache served {hit_rate:.0%} of these prompts' tokens: they were "
                f"probably sent before (an earlier run with --seed {args.seed}), so TTFT is flattered; "
                "pass another --seed for fresh prompts"
            )
    return 0 if not result.errors else 1


def cmd_notebooks(args) -> int:
    copied, kept = copy_notebooks(args.dest)
    print(f"copied {len(copied)} notebooks into {args.dest}" + (f"; kept {len(kept)} already there" if kept else ""))
    as_root = (
        " --allow-root" if hasattr(os, "geteuid") and os.geteuid() == 0 else ""
    )  # JupyterLab refuses root otherwise
    print(f"open them with: jupyter lab {args.dest}{as_root}  (the jupyter of the environment minieng is installed in)")
    return 0


def cmd_course(args) -> int:
    try:
        from minieng.course.runner import report, run_course  # lazy: nbclient is the notebooks extra's
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
        output_dir=args.output,
        only=only,
        smoke=args.smoke,
        timeout_s=args.timeout,
        jobs=args.jobs,
        model=args.model,
        model_only=[x for x in args.model_only.split(",") if x.strip()] if args.model_only else None,
        **kwargs,
    )
    print(report(summary))
    failed = sum(r["status"] != "ok" for r in summary["notebooks"])
    print(f"\n{summary['mode']} mode, {summary['wall_s'] / 60:.1f} min; open {args.output}/index.html")
    print(f"notebooks: {len(summary['notebooks']) - failed} passed, {failed} failed")
    return 1 if failed else 0


def cmd_colab(args) -> int:
    from minieng.course.colab import colab_report, write_colab_notebooks

    written = write_colab_notebooks(args.git_url or "", args.branch, args.output)
    print("\n".join(colab_report(args.git_url, args.branch, written)))
    return 0


def cmd_doctor(args) -> int:
    from minieng.course.doctor import doctor  # lazy: it imports the lessons' model choice

    return doctor()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m minieng", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="stream a reply from the model")
    g.add_argument("prompt")
    engine_args(g)
    g.add_argument("--max-tokens", type=int, default=128, help="most tokens of the reply (default: %(default)s)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: %(default)s)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's mass (default: %(default)s, off)")
    g.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (default: 0, off)")
    g.add_argument("--seed", type=int, default=None, help="the request's sampling seed (default: from the engine's)")
    g.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    g.set_defaults(func=cmd_generate)
    b = add_bench_parser(sub)
    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    engine_args(v)
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
    v.add_argument(
        "--log-interval-s",
        "--log-interval",
        dest="log_interval_s",
        type=float,
        default=DEFAULT_LOG_INTERVAL_S,
        help="seconds between two stats lines, in vLLM's wording (\"Avg prompt throughput: ... tokens/s, Avg "
        f"generation throughput: ...\"); 0: none (default {DEFAULT_LOG_INTERVAL_S:g}, as vLLM's)",
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
    workload_args(lg, choices=["poisson", "trace", "fixed"], default="poisson")
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
    c.add_argument(
        "--model",
        default=None,
        help="the model the notebooks measure (sets MINIENG_MODEL): a published shape's name (random weights, "
        "e.g. SmolLM2-135M), a local directory or a Hub id (default: each notebook's choice for this device)",
    )
    c.add_argument(
        "--model-only", default=None, help="comma-separated notebook numbers --model applies to (default: all)"
    )
    c.set_defaults(func=cmd_course)
    co = sub.add_parser("colab", help="write the notebooks with your repository's git URL in their Colab setup cell")
    co.add_argument("--git-url", default=None, help="the git URL of the repository you push the notebooks to")
    co.add_argument("--branch", default="", help="the branch you push to (default: the repository's default)")
    co.add_argument(
        "--output",
        default="notebooks",
        help="folder to write them into (default: notebooks/ here, in place in a clone)",
    )
    co.set_defaults(func=cmd_colab)
    sub.add_parser("doctor", help="a workshop preflight: what a lesson needs here, and what to fix").set_defaults(
        func=cmd_doctor
    )
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
