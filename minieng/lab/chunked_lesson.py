"""Notebook 06's plumbing around the chunked-prefill experiment (``chunked_prefill``): the plan (the
newcomer's length chosen from the device's probe, the token budgets, the prompts, the time
estimates and the results cache's key) and the lines its cells print. The cells keep the physics:
the engine, the probe, the sweep, the clock readings and the plots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minieng.engine.llm_engine import LLMEngine
from minieng.lab.chunked_prefill import (
    budget_for,
    budget_sweep,
    choice_in_words,
    choose_long_prompt,
    estimate_sweep_s,
    long_prompt_run,
    predict_prefill_s,
    read_result,
)
from minieng.measure.workloads import text_prompts


@dataclass
class LongPromptPlan:
    """What notebook 06 runs (``plan_long_prompt``): ``decoders`` (their prompts' token ids) decode
    while ``long_prompt`` arrives; ``budget`` is the teaching budget, ``budgets`` the sweep's (the
    teaching one included); ``warmup_runs`` discarded runs per setting on a GPU."""

    engine: LLMEngine = field(repr=False)
    probe: dict = field(repr=False)
    decoders: list[list[int]]
    long_prompt: list[int]
    budget: int
    budgets: list[int]
    repeats: int
    warmup_runs: int
    run_kwargs: dict
    choice: str = ""

    @property
    def long_prompt_tokens(self) -> int:
        return len(self.long_prompt)

    @property
    def predicted_prefill_s(self) -> float:
        """The newcomer's prefill alone, from the probe (``predict_prefill_s``)."""
        return predict_prefill_s(self.probe, self.engine.model_config, self.long_prompt_tokens)

    def chunks_at(self, budget: int) -> int:
        """Steps the long prompt takes at ``budget`` tokens a step, beside one token per decoder."""
        return math.ceil(self.long_prompt_tokens / (budget - len(self.decoders)))

    def estimate_s(self, budgets: list[int | None] | None = None, runs: int | None = None) -> float:
        """Rough seconds of ``runs`` runs (default: repeats and warm-ups) at each of ``budgets``
        (default: chunking off and the sweep's)."""
        return estimate_sweep_s(
            self.probe,
            self.engine.model_config,
            self.long_prompt_tokens,
            [None, *self.budgets] if budgets is None else budgets,
            len(self.decoders),
            len(self.decoders[0]),
            runs_per_setting=self.repeats + self.warmup_runs if runs is None else runs,
            **self.run_kwargs,
        )

    def cache_key(self, model: str) -> dict:
        """The results cache's key of the sweep: everything that sets its figures."""
        return {
            "model": model,
            "decoders": len(self.decoders),
            "decoder_tokens": len(self.decoders[0]),
            "long_tokens": self.long_prompt_tokens,
            "budgets": self.budgets,
            "repeats": self.repeats,
            "warmup": self.warmup_runs,
            **self.run_kwargs,
            "device": str(self.engine.device),
            "dtype": str(self.engine.dtype),
        }

    def sweep(self, progress=None) -> dict:
        """``budget_sweep``: chunking off, then every budget."""
        return budget_sweep(
            self.engine,
            self.decoders,
            self.long_prompt,
            self.budgets,
            self.repeats,
            self.warmup_runs,
            progress=progress,
            **self.run_kwargs,
        )

    def run_once(self, budget: int | None) -> dict:
        """One run at ``budget`` (None: chunking off), after the plan's warm-up runs."""
        for _ in range(self.warmup_runs + 1):
            run = long_prompt_run(self.engine, self.decoders, self.long_prompt, budget, **self.run_kwargs)
        return run

    def taught(self, sweep: dict) -> dict:
        """The sweep's row at the teaching budget."""
        return next(r for r in sweep["on"] if r["budget_tokens"] == self.budget)

    def lines(self) -> list[str]:
        d, p = len(self.decoders), self.predicted_prefill_s
        return [
            *([self.choice] if self.choice else []),
            f"{d} decoders with {len(self.decoders[0])}-token prompts; a {self.long_prompt_tokens}-token newcomer, "
            f"whose prefill alone the probe predicts at {p * 1e3:.0f} ms, {p / self.probe['decode_step_s']:.0f} "
            "decode steps",
            f"teaching budget: {self.budget} tokens a step ({self.chunks_at(self.budget)} chunks); sweep: {self.budgets}",
        ]


def plan_long_prompt(
    engine: LLMEngine,
    probe: dict,
    *,
    num_decoders: int,
    decoder_prompt_tokens: int,
    long_prompt_tokens: int | None,
    chunks: int,
    sweep_chunks: list[int],
    repeats: int,
    stall_steps: float,
    budget_s: float,
    max_prompt_tokens: int,
    **run_kwargs,
) -> LongPromptPlan:
    """The experiment on this device: the newcomer's length (``long_prompt_tokens``, or None:
    ``choose_long_prompt`` from the probe, its prefills fitting ``budget_s``), the teaching budget
    (about ``chunks`` chunks) and the sweep's (``sweep_chunks``), real-text prompts, and a warm-up
    run per setting on a GPU (it plans attention for every new shape on first use)."""
    warmup = 1 if engine.device.type == "cuda" else 0
    choice = ""
    if long_prompt_tokens is None:
        runs = (1 + len(sweep_chunks)) * (repeats + warmup) + 1  # whole prefills: the sweep and the panel
        picked = choose_long_prompt(
            probe,
            engine.model_config,
            runs=runs,
            stall_steps=stall_steps,
            budget_s=budget_s,
            max_prompt_tokens=max_prompt_tokens,
        )
        long_prompt_tokens, choice = picked["long_prompt_tokens"], choice_in_words(picked, probe)
    budget = budget_for(long_prompt_tokens, num_decoders, chunks)
    budgets = sorted({budget_for(long_prompt_tokens, num_decoders, c) for c in sweep_chunks} | {budget})
    return LongPromptPlan(
        engine,
        probe,
        text_prompts(engine.tokenizer, decoder_prompt_tokens, num_decoders),
        text_prompts(engine.tokenizer, long_prompt_tokens, 1)[0],
        budget,
        budgets,
        repeats,
        warmup,
        dict(run_kwargs),
        choice,
    )


_COLUMNS = ("gap before ms", "worst gap ms", "slowed gaps", "decoders lost ms", "newcomer TTFT ms", "prefill steps")


def sweep_table(sweep: dict) -> list[str]:
    """The sweep's medians, chunking off then each budget."""
    lines = [f"{'setting':>20} " + " ".join(f"{c:>{len(c) + 1}}" for c in _COLUMNS)]
    for r in [sweep["off"], *sweep["on"]]:
        name = "chunking off" if r["budget_tokens"] is None else f"budget {r['budget_tokens']} tokens"
        figures = ("baseline_itl_ms", "worst_itl_ms", "slowed_gaps", "decoder_delay_ms", "ttft_ms", "prefill_steps")
        cells = [f"{r[k]:>{len(c) + 1}.{1 if k == 'baseline_itl_ms' else 0}f}" for k, c in zip(figures, _COLUMNS)]
        lines.append(f"{name:>20} " + " ".join(cells))
    repeats = sweep["off"]["repeats"]
    lines.append(
        f"(medians over {repeats} run(s); slowed: gaps over twice the gap before, all decoders; decoders lost: per "
        "decoder, the time its gaps after the arrival took beyond as many gaps of before)"
    )
    return lines


def step_lines(run: dict, around: int = 3) -> list[str]:
    """A run's step records from a few steps before the arrival (time 0) to the newcomer's first token."""
    steps = run["steps"]
    first = max(0, next((i for i, s in enumerate(steps) if s[0] >= 0), len(steps)) - around)
    last = next((i for i, s in enumerate(steps) if s[0] >= run["ttft_ms"] / 1e3), len(steps) - 1)
    name = "chunking off" if run["budget_tokens"] is None else f"budget {run['budget_tokens']}"
    lines = [f"{name}: {'start ms':>9} {'took ms':>8} {'prefill tok':>11} {'decodes':>7}"]
    lines += [
        f"{'':>{len(name) + 1}} {1e3 * t:>9.1f} {ms:>8.1f} {p:>11} {d:>7}" for t, ms, p, d in steps[first : last + 1]
    ]
    return lines


def budget_line(off: dict, on: dict, overhead_s: float) -> str:
    """One chunked setting against chunking off (``read_result``), in one line."""
    r = read_result(off, on, overhead_s)
    return (
        f"budget {on['budget_tokens']:>5}: worst gap {on['worst_itl_ms']:.0f} ms ({r['itl_protection_x']:.1f}x shorter "
        f"than off), TTFT {on['ttft_ms']:.0f} ms ({r['ttft_price_x']:.2f}x) in {on['prefill_steps']:.0f} steps; the "
        f"step's fixed cost {100 * r['overhead_share']:.0f}% of a chunk step"
        + " (overhead-bound)"
        * r["overhead_bound"]
    )


def reading_lines(off: dict, on: dict, overhead_s: float) -> list[str]:
    """What the teaching budget bought and cost (``read_result``), and whether the per-step fixed
    cost, not the prompt's arithmetic, sets a chunk step's time."""
    r = read_result(off, on, overhead_s)
    lines = [
        f"newcomer's TTFT: {r['ttft_extra_ms']:.0f} ms more over {on['prefill_steps']:.0f} chunk steps, "
        f"{r['extra_per_step_ms']:.1f} ms each (each also runs the decodes and pays the step's fixed cost)"
    ]
    if r["delay_ratio_x"] is not None:
        lines.append(
            f"time each decoder lost: {off['decoder_delay_ms']:.0f} ms off, {on['decoder_delay_ms']:.0f} ms on "
            f"({r['delay_ratio_x']:.2f}x): chunking spreads the prefill's time over many gaps, it does not remove it"
        )
    lines.append(
        f"a chunk step took {on['chunk_step_ms']:.1f} ms; the probe's fixed cost of a step, {1e3 * overhead_s:.1f} ms, "
        f"is {100 * r['overhead_share']:.0f}% of it"
    )
    if r["overhead_bound"]:
        lines.append(
            "=> overhead-bound: a smaller budget would not shorten these gaps much, only add steps (each paying that "
            "cost again) to the newcomer's TTFT; this prefill is too cheap for chunking to pay as it does for a "
            "large model or a 40,000-token prompt."
        )
    else:
        lines.append(
            "=> compute-bound: a chunk step is mostly its tokens' arithmetic, so a smaller budget shortens the gaps "
            "about in proportion, and the newcomer pays mainly for the decodes each chunk step also runs."
        )
    return lines


def napkin_budget_answer(plan: LongPromptPlan, prefill_ms: float, decode_ms: float) -> str:
    """The worked answer to "how do the gap and the TTFT move with the budget?" from the napkin's
    floors (``prefill_ms``: the whole prompt's; ``decode_ms``: one decode step of the decoders): at
    C chunks a chunk step costs prefill / C + decode, and the TTFT costs prefill + C x decode."""
    rows = [
        f"| {b} | {c} | {prefill_ms / c + decode_ms:.2f} | {prefill_ms + c * decode_ms:.2f} |"
        for b, c in ((b, plan.chunks_at(b)) for b in plan.budgets)
    ]
    return "\n".join(
        [
            f"At its floors the whole prefill takes {prefill_ms:.2f} ms and a decode step {decode_ms:.2f} ms. "
            "Cut into C chunks, each step carries prefill / C and one decode step: the worst gap is "
            "prefill / C + decode, and the newcomer's TTFT is prefill + C x decode.",
            "",
            "| budget | C | worst gap ms | TTFT ms |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
            "So the gap falls as 1 / C toward one decode step, and the TTFT climbs one decode step per chunk. "
            "Every step also pays a fixed cost (the probe's), which the floors leave out: where it dominates, "
            "the gap stops falling and the TTFT climbs faster.",
        ]
    )
