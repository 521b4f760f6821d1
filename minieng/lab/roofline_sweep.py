"""Notebook 02's roofline: a prefill sweep over prompt lengths and a decode sweep over batch sizes,
each step's FLOPs and bytes over its measured time (MFU, MBU, what bounds it), sized from the
device's probe, and the tables and sentences that read them.
"""

from __future__ import annotations

from collections.abc import Sequence

from minieng.engine.llm_engine import LLMEngine
from minieng.lab.batching import decode_point, utilization_row
from minieng.lab.probes import minieng_prefill
from minieng.measure.flops_bytes import attention_crossover_tokens, decode_ridge_batch, prefill_work
from minieng.measure.roofline import format_percent
from minieng.measure.sweep_plan import (
    decode_sweep_batches,
    predict_decode_step_s,
    predict_ttft_s,
    prefill_sweep_lengths,
)
from minieng.measure.workloads import text_prompts


def probe_words(probe: dict) -> str:
    """What ``probes.probe_speed`` found: prefill's best tok/s and fixed cost, the decode step, and
    where prefill tok/s stopped growing (the knee) or why it did not."""
    fixed = (
        f"about {probe['overhead_s'] * 1e3:.1f} ms"
        if probe["overhead_s"] > 0
        else "too small to separate from the noise"
    )
    words = (
        f"probe: prefill up to {probe['prefill_tok_s']:.0f} tok/s, a prefill step's fixed cost {fixed}; "
        f"a batch-1 decode step {probe['decode_step_s'] * 1e3:.1f} ms\n"
    )
    longest = probe["prefill_points"][-1][0]
    if probe["knee_reached"]:
        return words + f"prefill tok/s stops growing at {probe['knee_tokens']} tokens"
    if longest >= probe["max_prompt_tokens"]:
        return words + (
            f"prefill tok/s was still growing at {longest} tokens, the longest prompt the engine takes: "
            "prefill is overhead-bound at every length this model takes here"
        )
    return words + f"prefill tok/s was still growing at {longest} tokens, where the probe's time budget ended"


def sweep_sizes(
    probe: dict,
    engine: LLMEngine,
    ridge: float,
    *,
    prompt_tokens: Sequence[int] | None,
    decode_batches: Sequence[int] | None,
    points: int,
    budget_s: float,
    repeats: int,
    decode_prompt_tokens: int,
    decode_tokens: int,
    max_batch: int,
    decode_budget_s: float,
) -> tuple[list, list]:
    """The sweeps' prompt lengths and decode batches: those given, else chosen from the probe: lengths
    from below the knee to well above it, batches from 1 along the memory-bound slope to past the
    ``ridge`` (FLOP/byte), each sweep within its time budget."""
    if prompt_tokens is None:
        prompt_tokens = prefill_sweep_lengths(probe, points, budget_s=budget_s, runs_per_length=repeats)
    if decode_batches is None:
        ridge_batch = decode_ridge_batch(engine.model_config, decode_prompt_tokens, engine.dtype.itemsize, ridge)
        decode_batches = decode_sweep_batches(
            probe, ridge_batch, max_batch, decode_tokens + 2, decode_prompt_tokens, budget_s=decode_budget_s
        )
    return list(prompt_tokens), list(decode_batches)


def ridge_batch_lines(engine: LLMEngine, peaks: Sequence, context_tokens: int) -> list[str]:
    """Per peak: the decode batch from which a step turns compute-bound at ``context_tokens``."""
    lines = []
    for p in peaks:
        rb = decode_ridge_batch(engine.model_config, context_tokens, engine.dtype.itemsize, p.ridge_flop_per_byte)
        where = (
            f"decode turns compute-bound from batch {rb}"
            if rb
            else "no decode batch reaches it: each sequence's KV read grows with the batch as fast as the FLOPs do"
        )
        lines.append(f"{p.source} ridge {p.ridge_flop_per_byte:.3g} FLOP/byte: {where} (context {context_tokens})")
    return lines


def crossover_lines(shapes: dict) -> list[str]:
    """Per model shape (name -> ``ModelConfig``): the linear layers' weights N, the attention width
    L·H·D, and the prompt length where attention's FLOPs overtake the linear layers'."""
    lines = []
    for name, c in shapes.items():
        layers = c.num_matmul_params - c.hidden_size * c.vocab_size
        width = c.num_hidden_layers * c.num_attention_heads * c.head_dim
        lines.append(
            f"{name}: N = {layers / 1e6:,.0f}M, L·H·D = {width:,}: attention overtakes the linear layers at "
            f"{attention_crossover_tokens(c):,} prompt tokens (its context: {c.max_position_embeddings:,}) [computed]"
        )
    return lines


def attention_shares(shapes: dict, grid: Sequence[int]) -> dict[str, list[float]]:
    """Per shape, attention's share of a prefill's FLOPs (%) at each prompt length of ``grid``."""
    return {
        name: [100 * (w := prefill_work(c, n, 2)).attention_flops / w.total_flops for n in grid]
        for name, c in shapes.items()
    }


def prefill_point(engine: LLMEngine, prompt_tokens: int, repeats: int, peaks: Sequence) -> dict:
    """``repeats`` prompts of ``prompt_tokens``, each prefilled in one step, their steps pooled."""
    steps = minieng_prefill(engine, text_prompts(engine.tokenizer, prompt_tokens, repeats))[1]
    return utilization_row(engine, steps, peaks, prompt_tokens=prompt_tokens)


def roofline_sweep(
    engine: LLMEngine,
    prompt_tokens: Sequence[int],
    decode_batches: Sequence[int],
    *,
    repeats: int,
    decode_tokens: int,
    decode_prompt_tokens: int,
    peaks: Sequence,
) -> dict:
    """The prefill sweep (``prefill_point`` per length) and the decode sweep (``batching.decode_point``
    per batch: ``decode_prompt_tokens``-token prompts each generating ``decode_tokens`` tokens)."""
    return {
        "prefill": [prefill_point(engine, n, repeats, peaks) for n in prompt_tokens],
        "decode": [
            decode_point(engine, b, decode_prompt_tokens, output_tokens=decode_tokens, peaks=peaks)
            for b in decode_batches
        ],
    }


def sweep_estimate_s(
    probe: dict,
    engine: LLMEngine,
    prompt_tokens: Sequence[int],
    decode_batches: Sequence[int],
    *,
    repeats: int,
    decode_tokens: int,
    decode_prompt_tokens: int,
) -> float:
    """Rough seconds of ``roofline_sweep``, from the probe."""
    cfg = engine.model_config
    return sum(repeats * predict_ttft_s(probe, n, cfg) for n in prompt_tokens) + sum(
        predict_ttft_s(probe, decode_prompt_tokens, count=b) + (decode_tokens + 2) * predict_decode_step_s(probe, b)
        for b in decode_batches
    )


def labelled(res: dict) -> list[tuple[str, dict]]:
    """The sweep's rows, each with its label ("prefill 512", "decode b8")."""
    return [(f"prefill {r['prompt_tokens']}", r) for r in res["prefill"]] + [
        (f"decode b{r['batch_size']}", r) for r in res["decode"]
    ]


def format_roofline(rows: Sequence[tuple[str, dict]], peaks: Sequence, ceilings_path=None) -> list[str]:
    """The sweep's table (ms per step, FLOP/byte, TFLOP/s, MFU and MBU per peak), what bounds each
    step against the measured ceilings, and a warning where a figure is above a ceiling."""
    head = "".join(f" {'MFU ' + p.source:>16} {'MBU ' + p.source:>16}" for p in peaks)
    lines = [f"{'step':<14} {'ms/step':>9} {'FLOP/byte':>10} {'TFLOP/s':>9}{head}"]
    for label, r in rows:
        cols = "".join(
            f" {format_percent(r['by_peak'][p.source]['mfu_percent']):>16} "
            f"{format_percent(r['by_peak'][p.source]['mbu_percent']):>16}"
            for p in peaks
        )
        lines.append(
            f"{label:<14} {r['seconds_per_step'] * 1e3:>9.2f} {r['intensity']:>10.2f} {r['flop_s'] / 1e12:>9.4f}{cols}"
        )
    lines.append("\nWhat bounds each, against the measured ceilings:")
    for label, r in rows:
        m = r["by_peak"]["measured"]
        lines.append(
            f"  {label:<14} {m['bound']}" + ("  [SUSPECT: above the measured ceiling]" if m["suspect"] else "")
        )
    if any(r["by_peak"]["measured"]["suspect"] for _, r in rows):
        lines.append(
            f"\nA figure above 100% is not a measurement: the ceiling undershot what this machine does (measured "
            f"while it was busier, or a slower matmul kernel). Delete {ceilings_path} and results/, and run again "
            "on an idle machine."
        )
    return lines


def best_and_b1(res: dict) -> tuple[dict, dict]:
    """The prefill row with the best MFU against the measured peak, and the batch-1 decode row."""
    best = max(res["prefill"], key=lambda r: r["by_peak"]["measured"]["mfu_percent"])
    return best, next(r for r in res["decode"] if r["batch_size"] == 1)


def phase_reading(res: dict, probe: dict) -> list[str]:
    """What the sweep showed, in its own numbers: best prefill MFU against batch-1 decode's, per
    peak, and why a phase below a quarter of both ceilings is limited by overhead."""
    best, b1 = best_and_b1(res)
    lines = []
    for source in best["by_peak"]:
        bp, bd = best["by_peak"][source], b1["by_peak"][source]
        lines.append(
            f"against the {source} peak: prefill reached {format_percent(bp['mfu_percent'])} MFU at its best "
            f"({best['prompt_tokens']} tokens); batch-1 decode {format_percent(bd['mfu_percent'])} MFU, "
            f"{format_percent(bd['mbu_percent'])} MBU"
        )
    gap = best["by_peak"]["measured"]["mfu_percent"] / b1["by_peak"]["measured"]["mfu_percent"]
    lines.append(f"prefill at its best used {gap:.1f}x the share of the peak that batch-1 decode did")
    overhead = [r["prompt_tokens"] for r in res["prefill"] if r["by_peak"]["measured"]["limit"] == "overhead"]
    below_knee = [n for n in overhead if not probe["knee_reached"] or n < probe["knee_tokens"]]
    if below_knee:
        lines.append(
            f"prefill at {below_knee} tokens, below the probe's knee, is limited by overhead: a prefill step's "
            "fixed cost outweighs its arithmetic (MFU says how small the model is for this device)"
        )
    if set(overhead) - set(below_knee):
        lines.append(
            f"prefill at {sorted(set(overhead) - set(below_knee))} tokens, past the knee, reached under a quarter "
            "of the peak: its kernels ran far below the ceiling"
        )
    lines.append(f"batch-1 decode: {b1['by_peak']['measured']['bound']}")
    return lines
