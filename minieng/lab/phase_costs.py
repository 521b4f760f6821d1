"""Which length each phase's cost follows: prefill the prompt's, decode the answer's.

Three requests on one engine: a short prompt with a short answer, the same answer after a long
prompt, and the short prompt with a long answer. Each is timed as TTFT (the prefill, from
arrival) and decode time (E2EL - TTFT: every step after the first token). Growing the prompt
should grow TTFT and barely the decode time (its steps reread a slightly longer KV cache); growing
the answer should grow the decode time, one step per token, and leave TTFT alone.
``course.verdicts.s14_slopes`` judges it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TypeVar

from minieng.engine.llm_engine import LLMEngine
from minieng.config import SamplingParams
from minieng.measure.metrics import request_metrics
from minieng.measure.workloads import text_prompts

CASES = ("short", "long_prompt", "long_output")
M = TypeVar("M")  # what one request's run returns (``RequestMetrics``, an endpoint's ``SentRequest``)


def grid_shapes(
    prompt_tokens: tuple[int, int], output_tokens: tuple[int, int], repeats: int = 1, caller: str = "phase_cost_grid"
) -> dict[str, tuple[int, int]]:
    """``(prompt tokens, answer tokens)`` of each case of ``CASES``. Raises ``ValueError`` (naming
    ``caller``) for lengths out of order, an answer under 2 tokens (a decode time needs a second
    token) or ``repeats`` < 1."""
    (short_p, long_p), (short_o, long_o) = prompt_tokens, output_tokens
    if not 0 < short_p < long_p or not 2 <= short_o < long_o or repeats < 1:
        raise ValueError(
            f"{caller}: prompt_tokens={prompt_tokens} and output_tokens={output_tokens} must each be "
            "(short, long) with short < long, answers of 2 tokens or more; repeats >= 1"
        )
    return {"short": (short_p, short_o), "long_prompt": (long_p, short_o), "long_output": (short_p, long_o)}


def run_grid(shapes: dict[str, tuple[int, int]], repeats: int, run_one: Callable[[str, int], M]) -> dict[str, list[M]]:
    """``run_one(case, i)`` for every case of ``shapes``: once untimed first (``i`` = 0: a shape's
    first request costs more, as kernels are chosen and buffers grown), then ``repeats`` rounds
    (``i`` = 1 .. ``repeats``) of each case once, in turn, so that a load which comes and goes on
    the machine touches every case alike. Returns the timed results per case, in round order."""
    for case in shapes:
        run_one(case, 0)
    runs: dict[str, list[M]] = {case: [] for case in shapes}
    for i in range(1, repeats + 1):
        for case in shapes:
            runs[case].append(run_one(case, i))
    return runs


def grid_medians(shapes: dict[str, tuple[int, int]], runs: dict[str, list]) -> dict[str, dict]:
    """Per case: ``prompt_tokens``, ``output_tokens`` (the shape's), and the medians of ``ttft_s``
    and ``decode_s`` (E2EL - TTFT) over its runs (``RequestMetrics`` or anything with those fields)."""
    return {
        case: {
            "prompt_tokens": p,
            "output_tokens": o,
            "ttft_s": statistics.median(r.ttft_s for r in runs[case]),
            "decode_s": statistics.median(r.e2el_s - r.ttft_s for r in runs[case]),
        }
        for case, (p, o) in shapes.items()
    }


def phase_cost_grid(
    engine: LLMEngine, prompt_tokens: tuple[int, int], output_tokens: tuple[int, int], repeats: int = 1
) -> dict[str, dict]:
    """Time the three requests (``CASES``), each alone, ``repeats`` times (medians reported), after
    one untimed request of each, in rounds (``run_grid``).

    ``prompt_tokens``: (short, long) prompt lengths in tokens; ``output_tokens``: (short, long)
    answer lengths, each at least 2 (a decode time needs a second token). Returns, per case of
    ``CASES``: prompt_tokens, output_tokens, ttft_s, decode_s. Prompts are real text
    (``text_prompts``), every request's its own (no two share a prefix the cache could serve);
    answers run to their length (``ignore_eos``). Raises ``ValueError`` as ``grid_shapes``.
    """
    shapes = grid_shapes(prompt_tokens, output_tokens, repeats)
    count = repeats + 1  # each text starts at its own place: a shorter prompt is a longer one cut
    texts = iter(text_prompts(engine.tokenizer, max(p for p, _ in shapes.values()), count * len(shapes)))
    prompts = {case: [next(texts)[:p] for _ in range(count)] for case, (p, _) in shapes.items()}

    def run_one(case: str, i: int):
        answer = SamplingParams.fixed_length(shapes[case][1])
        return request_metrics(engine.generate([prompts[case][i]], answer)[0])

    return grid_medians(shapes, run_grid(shapes, repeats, run_one))


def _phase_row(run, u: dict | None, tokens: str, seconds: str) -> dict:
    """One phase's row: its size, time, tok/s and, from the engine's steps (``u``: ``phase_utilization``),
    the arithmetic intensity, FLOP/s, bytes a step, MFU and MBU against the measured peak."""
    row = {tokens: run.tokens, seconds: run.seconds, "tok_s": run.tok_s}
    if u is not None:
        m = u["measured"]
        row |= {
            "intensity": u["arithmetic_intensity_flop_per_byte"],
            "flop_s": u["achieved_tflops"] * 1e12,
            "bytes": u["bytes"] / u["num_steps"],
            "mfu_percent": m["mfu_percent"],
            "mbu_percent": m["mbu_percent"],
            "suspect": m["suspect"],
        }
    return row


def phase_result(backend, prefills: list, decode) -> dict:
    """Notebook 01's section 2 as a JSON dict from a backend's ``PhaseRun``s (``lab.backend``): ``prefill``,
    one row per length (``prompt_tokens``, ``ttft_s``, ``tok_s``), ``decode`` (``output_tokens``,
    ``tpot_s``, ``tok_s``), each with MFU/MBU where the backend has step records (``backend.utilization``),
    and ``server``: the backend's label. Prefill rows are sorted by prompt length (the server's counts)."""
    rows = [_phase_row(r, backend.utilization(r), "prompt_tokens", "ttft_s") for r in prefills]
    return {
        "server": backend.label,
        "prefill": sorted(rows, key=lambda r: r["prompt_tokens"]),
        "decode": _phase_row(decode, backend.utilization(decode), "output_tokens", "tpot_s"),
    }


def _percent(value) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def format_phases(result: dict) -> list[str]:
    """``phase_result`` as notebook 01's table: per length TTFT, prefill tok/s (and MFU against the
    measured peak where measured, ``!`` where over 100%: suspect), then the decode's TPOT (and MBU)."""
    steps = "mfu_percent" in result["decode"]
    lines = [
        f"measured: {result['server']}",
        f"{'prompt tokens':>13} {'TTFT ms':>9} {'prefill tok/s':>13}" + " MFU" * steps,
    ]
    for r in result["prefill"]:
        mfu = f" {_percent(r['mfu_percent'])}{'!' if r['suspect'] else ''}" if steps else ""
        lines.append(f"{r['prompt_tokens']:>13} {r['ttft_s'] * 1e3:>9.1f} {r['tok_s']:>13.0f}{mfu}")
    d = result["decode"]
    mbu = f", MBU {_percent(d['mbu_percent'])} of the measured bandwidth" if steps else ""
    lines.append(f"batch-1 decode: TPOT {d['tpot_s'] * 1e3:.1f} ms = {d['tok_s']:.1f} tok/s{mbu}")
    return lines
