"""The probes every lesson runs before it measures: a warm-up, the two phases timed, and this device's speed.

- ``warm_up``: an untimed first run (allocation, kernel selection, on a GPU a plan per new shape);
- ``minieng_prefill`` and ``minieng_decode``: TTFT and TPOT (vLLM's definitions, from the engine's
  recorded timestamps) of prompts sent alone or decoding together, with the steps that ran them;
- ``probe_speed``: where prefill turns compute-bound on this device and what a decode step costs;
  ``estimate_s`` turns its figures into the seconds a run will take, so a notebook can announce
  (and size) what it is about to run.

``bench`` (the main benchmark) and the lessons' experiments time their runs with these.
"""

from __future__ import annotations

import statistics

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.core.outputs import StepRecord
from minieng.measure.metrics import request_metrics
from minieng.measure.sweep_plan import prefill_knee, probe_lengths, scan_prefill
from minieng.measure.workloads import text_prompts


def warm_up(engine: LLMEngine, prompts: list[list[int]] | None = None, output_tokens: int = 4) -> None:
    """Run ``prompts`` (default: one 16-token prompt of real text) for ``output_tokens`` tokens, untimed.
    A first call allocates memory, picks kernels and, on a GPU, plans every new shape: a figure
    taken cold can be ten times off, so every timed run starts after this."""
    if prompts is None:
        prompts = text_prompts(engine.tokenizer, 16, 1)
    engine.generate(prompts, SamplingParams.fixed_length(output_tokens))


def minieng_prefill(engine: LLMEngine, prompts: list[list[int]]) -> tuple[float, list[StepRecord]]:
    """Median TTFT (s) of each prompt sent alone, and the steps that ran them (all prefill)."""
    params = SamplingParams.fixed_length(1)
    first = len(engine.step_records)
    ttft = statistics.median(request_metrics(engine.generate([p], params)[0]).ttft_s for p in prompts)
    return ttft, engine.step_records[first:]


def minieng_decode(engine: LLMEngine, prompts: list[list[int]], output_tokens: int) -> tuple[float, list[StepRecord]]:
    """Median TPOT (s) over a batch decoding together, and the decode-only steps of the run."""
    params = SamplingParams.fixed_length(output_tokens)
    first = len(engine.step_records)
    tpot = statistics.median(request_metrics(o).tpot_s for o in engine.generate(prompts, params))
    return tpot, [s for s in engine.step_records[first:] if s.num_prefill_tokens == 0]


def probe_speed(
    engine: LLMEngine, max_prompt_tokens: int | None = None, budget_s: float = 15.0, repeats: int = 3
) -> dict:
    """A probe of this device, after a warm-up: where prefill turns compute-bound, and a decode step.

    First a tiny ``generate`` (allocation, kernel selection: on a GPU the first calls cost many
    times a later one, and an unwarmed probe overestimated a decode step tenfold). Then whole
    prompts prefilled in one step at doubling lengths from 64 tokens (``sweep_plan.scan_prefill``):
    at each new length one discarded run (a GPU plans attention for every new shape) and the
    median TTFT of ``repeats`` more, until prefill tok/s stops growing (``sweep_plan.prefill_knee``),
    the longest prompt is reached, or ``budget_s`` would be overrun.
    Last, the median TPOT of ``repeats`` batch-1 decodes of 6 tokens after a 64-token prompt.
    While it runs the step's token budget is raised to the longest prompt (so no prompt is
    chunked) and the prefix cache is switched off and emptied (its contents are lost).

    Args:
        max_prompt_tokens: the longest prompt to time; default and cap: ``max_model_len - 1`` and
            what the KV pool holds.
        budget_s: rough seconds for the prefill scan (the decode runs come on top).
    Returns:
        a JSON-serializable dict: ``prefill_tok_s`` (the best prefill tok/s seen),
        ``decode_step_s`` (a batch-1 decode step, s), ``knee_tokens``, ``knee_reached``,
        ``overhead_s`` (per-step floor; see ``sweep_plan.prefill_knee``), ``prefill_points``
        (``[prompt_tokens, ttft_s]`` pairs) and ``max_prompt_tokens``. ``estimate_s`` and
        ``sweep_plan.prefill_sweep_lengths`` read it.
    """
    block = engine.config.block_size
    cap = min(engine.max_model_len - 1, (engine.block_manager.num_blocks - 1) * block)
    cap = min(cap, max_prompt_tokens) if max_prompt_tokens else cap
    tok = engine.tokenizer

    def time_prefill(n: int) -> float:
        prompts = text_prompts(tok, n, repeats + 1)
        minieng_prefill(engine, prompts[:1])  # a new length is a new shape: discarded
        return minieng_prefill(engine, prompts[1:])[0]

    # Cache off (a hit would shorten a prefill); a budget that holds every probed prompt in one step.
    budget = max(engine.config.max_num_batched_tokens, cap)
    with engine.block_manager.caching(False), engine.reconfigured(max_num_batched_tokens=budget):
        warm_up(engine, text_prompts(tok, min(16, cap), 1), output_tokens=2)
        points = scan_prefill(time_prefill, probe_lengths(cap), budget_s, repeats + 1)
        prompt = text_prompts(tok, min(64, cap), 1)
        tpot = statistics.median(minieng_decode(engine, prompt, 6)[0] for _ in range(repeats))
    knee = prefill_knee(points)
    return {
        "prefill_tok_s": knee["peak_tok_s"],
        "decode_step_s": tpot,
        "knee_tokens": knee["knee_tokens"],
        "knee_reached": knee["knee_reached"],
        "overhead_s": knee["overhead_s"],
        "prefill_points": [list(p) for p in points],
        "max_prompt_tokens": cap,
    }


def estimate_s(probe: dict, prefill_tokens: int = 0, decode_steps: int = 0, prefills: int = 0) -> float:
    """Rough seconds for ``prefill_tokens`` of prefill in ``prefills`` prompts (each paying the
    probe's per-step overhead) plus ``decode_steps`` batch-1 decode steps, from ``probe_speed``."""
    return (
        prefills * probe.get("overhead_s", 0.0)
        + prefill_tokens / probe["prefill_tok_s"]
        + decode_steps * probe["decode_step_s"]
    )
