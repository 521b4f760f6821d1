"""Command line: ``python -m minieng generate "prompt"`` and ``python -m minieng bench``."""

from __future__ import annotations

import argparse
import json
import sys
import time

from .config import EngineConfig, SamplingParams


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="Hub id, local directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"], help="dummy = random weights of the real shape")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto")


def _engine(args, **overrides):
    from .engine import LLMEngine

    return LLMEngine(EngineConfig(model=args.model, load_format=args.load_format, dtype=args.dtype,
                                  device=args.device, **overrides))


def cmd_generate(args) -> int:
    engine = _engine(args)
    tok = engine.tokenizer
    if args.raw or tok is None or not tok.chat_template:
        prompt = args.prompt
    else:
        prompt = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                         tokenize=False)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            max_tokens=args.max_tokens)
    for delta in engine.stream(prompt, params):
        print(delta, end="", flush=True)
    print()
    out = engine.output(next(reversed(engine.requests)))
    t = out.times
    n = len(out.token_ids)
    ttft_ms = 1e3 * (t.emissions[0][0] - t.arrival_s)
    summary = f"[{n} tokens, finish: {out.finish_reason}, TTFT {ttft_ms:.0f} ms"
    if n > 1:
        summary += f", TPOT {1e3 * (t.emissions[-1][0] - t.emissions[0][0]) / (n - 1):.1f} ms"
    print(summary + "]", file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from .bench import BenchConfig, check_targets, format_table, run_bench

    cfg = BenchConfig(prompt_lens=args.prompt_lens, batch_sizes=args.batch_sizes, output_tokens=args.output_tokens,
                      decode_prompt_len=args.decode_prompt_len, repeats=args.repeats,
                      compare_transformers=not args.no_transformers)
    log = (lambda msg: print(msg, file=sys.stderr)) if not args.json else (lambda msg: None)
    start = time.perf_counter()
    # A budget large enough that each sweep point prefills in one step: the decode figures then
    # time decode steps only, as transformers' batched generate does.
    budget = max(cfg.prompt_lens + [max(cfg.batch_sizes) * cfg.decode_prompt_len, 512])
    engine = _engine(args, max_num_batched_tokens=budget, max_num_seqs=max(cfg.batch_sizes + [8]))
    load_s = time.perf_counter() - start
    if args.load_format == "dummy":
        cfg.compare_transformers = False
    result = run_bench(engine, cfg, load_s=load_s, progress=log)
    result["targets"] = check_targets(result) if args.model is None else []
    result["wall_s"] = time.perf_counter() - start
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minieng", description=__doc__)
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
    b.set_defaults(func=cmd_bench)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # bad input: say what to do, without a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
