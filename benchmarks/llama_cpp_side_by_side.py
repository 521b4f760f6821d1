"""minieng beside llama.cpp on the same GGUF file, on this CPU: python benchmarks/llama_cpp_side_by_side.py.

What a CPU user would run instead of minieng is llama.cpp, so this script puts the two side by
side on the embedded default model's GGUF file (SmolLM2-135M-Instruct, Q4_1): llama.cpp reads the
file as it is, in its own 4-bit kernels; minieng dequantizes it to float32 once
(``model/loader.py``) and runs it in float32 or re-quantized to its own int8 schemes. Two figures,
in the same process and the same quiet window, contenders alternating round by round:

- batch-1 TPOT (ms): a 16-token prompt, then ``--output-tokens`` greedy tokens; minieng's is its
  request's TPOT (``lab.probes.minieng_decode``), llama.cpp's the mean of its one-token evals, each
  with the argmax of its logits (minieng's steps sample too);
- prefill (tokens/s): one ``--prompt-tokens`` prompt of real text (``measure.workloads``), its TTFT.

Each figure is the median over ``--rounds`` rounds. Both sides get every core torch uses.
llama.cpp comes from llama-cpp-python, a benchmark tool here and not a dependency of minieng
(``pip install llama-cpp-python==0.3.36`` builds it from source, about ten minutes on a 2-core CPU).
The targets checked at the end are minieng's against llama.cpp: the best quantized scheme,
compiled, within 1.5x of llama.cpp's batch-1 TPOT, and its prefill at least 2x llama.cpp's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# torch, numpy and minieng are imported where they are used: --help and a missing llama_cpp answer
# at once, not after the seconds those imports take.

INSTALL = "pip install llama-cpp-python==0.3.36  (builds llama.cpp from source: about ten minutes on 2 cores)"
TPOT_TARGET = 1.5  # the best quantized scheme, compiled: TPOT at most 1.5x llama.cpp's
PREFILL_TARGET = 2.0  # and its prefill at least 2x llama.cpp's tokens/s


class LlamaCpp:
    """llama.cpp through llama-cpp-python's ``Llama``: greedy decode and prefill, timed per call."""

    name = "llama.cpp (Q4_1)"

    def __init__(self, gguf: Path, context_tokens: int, threads: int):
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(gguf),
            n_ctx=context_tokens,
            n_batch=context_tokens,
            n_ubatch=context_tokens,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )

    def _eval_argmax(self, tokens: list[int]) -> int:
        import numpy as np

        self.llm.eval(tokens)
        return int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))

    def decode_tpot_s(self, prompt: list[int], output_tokens: int) -> float:
        self.llm.reset()
        token = self._eval_argmax(prompt)
        start = time.perf_counter()
        for _ in range(output_tokens - 1):
            token = self._eval_argmax([token])
        return (time.perf_counter() - start) / (output_tokens - 1)

    def prefill_s(self, prompt: list[int]) -> float:
        self.llm.reset()
        start = time.perf_counter()
        self._eval_argmax(prompt)
        return time.perf_counter() - start


class Minieng:
    """A minieng engine on the same GGUF file (dequantized to float32 once), with ``quantization``
    and ``compile`` as given, and no prefix cache: every round's prefill is computed, as llama.cpp's
    is after its reset."""

    def __init__(self, gguf: Path, quantization: str | None, compile: bool, context_tokens: int):
        from minieng import LLMEngine

        self.engine = LLMEngine(
            model=str(gguf),
            quantization=quantization,
            compile=compile,
            max_model_len=context_tokens,
            enable_prefix_caching=False,
        )
        self.name = f"minieng {quantization or 'float32'}{', compiled' if compile else ''}"
        self.compile_s = self.engine.runner.fast.compile_s

    def decode_tpot_s(self, prompt: list[int], output_tokens: int) -> float:
        from minieng.lab.probes import minieng_decode

        return minieng_decode(self.engine, [prompt], output_tokens)[0]

    def prefill_s(self, prompt: list[int]) -> float:
        from minieng.lab.probes import minieng_prefill

        return minieng_prefill(self.engine, [prompt])[0]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; each figure is their median (default 5)")
    p.add_argument("--output-tokens", type=int, default=64, help="tokens decoded per round (default 64)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="prefill prompt length (default 512)")
    p.add_argument(
        "--schemes",
        default="none,w8a8,int8",
        help="minieng's quantization schemes, comma-separated; none = float32 (default none,w8a8,int8)",
    )
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="eager engines only (each compiled one takes 8-16 s to start, minutes with a cold compiler cache)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.output_tokens < 2 or args.prompt_tokens < 1:
        p.error(
            "--rounds and --prompt-tokens must be at least 1, --output-tokens at least 2 (TPOT is per token after the first)"
        )
    if not [s for s in args.schemes.split(",") if s]:
        p.error("--schemes names no scheme: give at least one of none, w8a8, int8")
    return args


def contenders(args, gguf: Path, context_tokens: int, threads: int) -> list:
    schemes = [None if s == "none" else s for s in args.schemes.split(",") if s]
    out = [LlamaCpp(gguf, context_tokens, threads)]
    for compile in (False,) if args.no_compile else (False, True):
        out += [Minieng(gguf, s, compile, context_tokens) for s in schemes]
    return out


def measure(racers: list, decode_prompt: list[int], prefill_prompt: list[int], args) -> dict:
    """Per contender, the per-round TPOT (s) and prefill (s), rounds alternating the contenders."""
    for r in racers:  # untimed: first calls allocate and pick kernels
        r.decode_tpot_s(decode_prompt, 4)
        r.prefill_s(prefill_prompt)
    runs = {r.name: {"tpot_s": [], "prefill_s": []} for r in racers}
    for i in range(args.rounds):
        for r in racers:
            runs[r.name]["tpot_s"].append(r.decode_tpot_s(decode_prompt, args.output_tokens))
            runs[r.name]["prefill_s"].append(r.prefill_s(prefill_prompt))
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
    return runs


def summarize(runs: dict, prompt_tokens: int, baseline: str = LlamaCpp.name) -> list[dict]:
    """One row per contender: median TPOT (ms) and prefill (tokens/s), and each as a ratio to
    ``baseline``'s (TPOT: theirs / baseline's, lower is better; prefill: theirs / baseline's
    tokens/s, higher is better)."""
    rows = []
    for name, r in runs.items():
        tpot_ms = 1e3 * statistics.median(r["tpot_s"])
        prefill_tps = prompt_tokens / statistics.median(r["prefill_s"])
        rows.append(dict(name=name, tpot_ms=tpot_ms, prefill_tps=prefill_tps))
    base = next(row for row in rows if row["name"] == baseline)
    for row in rows:
        row["tpot_ratio"] = row["tpot_ms"] / base["tpot_ms"]
        row["prefill_ratio"] = row["prefill_tps"] / base["prefill_tps"]
    return rows


def verdicts(rows: list[dict]) -> list[str]:
    """minieng's two CPU targets against llama.cpp, checked on the compiled quantized row with
    the lowest TPOT ("the best quantized scheme, compiled"), or a line saying none ran."""
    candidates = [r for r in rows if "compiled" in r["name"] and "float32" not in r["name"]]
    if not candidates:
        return ["targets: no compiled quantized engine ran (drop --no-compile, add a scheme)"]
    best = min(candidates, key=lambda r: r["tpot_ms"])
    tpot_ok = best["tpot_ratio"] <= TPOT_TARGET
    prefill_ok = best["prefill_ratio"] >= PREFILL_TARGET
    return [
        f"{'PASS' if tpot_ok else 'MISS'} {best['name']}: batch-1 TPOT {best['tpot_ratio']:.2f}x llama.cpp's "
        f"(target <= {TPOT_TARGET}x)",
        f"{'PASS' if prefill_ok else 'MISS'} {best['name']}: prefill {best['prefill_ratio']:.2f}x llama.cpp's "
        f"tokens/s (target >= {PREFILL_TARGET}x)",
    ]


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import llama_cpp  # noqa: F401  (checked first: everything below takes minutes)
    except ImportError:
        print(f"llama_cpp is not importable: {INSTALL}", file=sys.stderr)
        return 2
    import torch

    from minieng.lab.probes import warm_up
    from minieng.measure.workloads import text_prompts
    from minieng.model.loader import default_gguf_path

    gguf = args.gguf or default_gguf_path()
    threads = torch.get_num_threads()
    context_tokens = args.prompt_tokens + args.output_tokens + 32
    racers = contenders(args, gguf, context_tokens, threads)
    for r in racers:
        if getattr(r, "compile_s", None):
            print(f"{r.name}: compiled in {r.compile_s:.1f} s", file=sys.stderr)
    tokenizer = racers[1].engine.tokenizer
    decode_prompt = text_prompts(tokenizer, 16, 1)[0]
    prefill_prompt = text_prompts(tokenizer, args.prompt_tokens, 1)[0]
    for r in racers[1:]:
        warm_up(r.engine)
    runs = measure(racers, decode_prompt, prefill_prompt, args)
    rows = summarize(runs, args.prompt_tokens)
    print(f"{gguf.name}, {threads} threads, {args.rounds} rounds (medians), torch {torch.__version__}")
    print(f"{'':28} {'batch-1 TPOT':>13} {'x llama.cpp':>12} {f'prefill {args.prompt_tokens}':>15} {'x llama.cpp':>12}")
    for row in rows:
        print(
            f"{row['name']:28} {row['tpot_ms']:10.1f} ms {row['tpot_ratio']:11.2f}x "
            f"{row['prefill_tps']:9.0f} tok/s {row['prefill_ratio']:11.2f}x"
        )
    for line in verdicts(rows):
        print(line)
    if args.out:
        args.out.write_text(json.dumps(dict(rows=rows, runs=runs, threads=threads, gguf=gguf.name), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
