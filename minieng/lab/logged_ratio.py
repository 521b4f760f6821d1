"""The article's 136x as vLLM logged it: the same engine under different loads, read by vLLM's logger.

The vLLM panel in "O erro de resumir performance a um número" (Igor Nascimento) read 12,968.6 prompt
tok/s against 95 generation tok/s, with a 97% prefix cache hit rate. Those are vLLM's *logged*
throughputs (``measure.logged_throughput``): the whole prompts of the prefills completed in the
interval, cache hits included, and the tokens of every running request. Over an interval that
holds many requests their ratio is the load's prompt tokens per output token, whatever the speed
of either phase.

The experiment: requests of ``user_tokens`` new tokens each (a user's turn), generating
``output_tokens``; alone, or after one shared system prompt of ``shared_tokens`` that the prefix
cache already holds (a server that has seen it), so that each request computes about the same
tokens while its prompt grows by the shared part: the hit rate rises to S / (S + U). Each load is
sent at once, with at most 1 or ``max_running`` requests running (the rest wait), and the run's
records are read as vLLM's logger reads them: one interval over the whole run, and a few lines
(``lines_per_load``) across it, as a log of shorter interval would print them. A last load sends the shared prompts with the cache off: the same logged ratio,
each token computed. Its single-request steps give the physics ratio for reference: prefill tok/s
of those prompts over batch-1 decode tok/s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.core.outputs import StepRecord
from minieng.lab.probes import estimate_s, warm_up
from minieng.measure.logged_throughput import LoggedStats, logged_intervals
from minieng.measure.workloads import text_prompts

# The vLLM panel of Nascimento's article.
ARTICLE_PANEL = {"prompt_throughput_tok_s": 12968.6, "generation_throughput_tok_s": 95.0, "prefix_cache_hit_rate": 0.97}


@dataclass(frozen=True)
class LoadSetting:
    """One load: whether prompts begin with the shared system prompt, whether the prefix cache is
    on, and the most requests running at once (``max_num_seqs`` for the run)."""

    shared_prefix: bool
    prefix_caching: bool
    max_running: int

    def label(self) -> str:
        prompt = "shared prefix + turn" if self.shared_prefix else "turn alone"
        return f"{prompt}, cache {'on' if self.prefix_caching else 'off'}, {self.max_running} running"


def default_settings(max_running: int) -> list[LoadSetting]:
    """The loads compared: hit share 0 and high (turn alone; shared prefix cached), each with 1 and
    ``max_running`` requests running; then the shared prompts with the cache off, one at a time."""
    return [
        LoadSetting(False, True, 1),
        LoadSetting(False, True, max_running),
        LoadSetting(True, True, 1),
        LoadSetting(True, True, max_running),
        LoadSetting(True, False, 1),
    ]


def shared_prefix_prompts(
    tokenizer, shared_tokens: int, user_tokens: int, count: int
) -> tuple[list[int], list[list[int]]]:
    """A system prompt of ``shared_tokens`` and ``count`` distinct user turns of ``user_tokens``,
    cut from the course's real text (``workloads.text_prompts``; they share no prefix)."""
    texts = text_prompts(tokenizer, shared_tokens + user_tokens, count + 1)
    return texts[0][:shared_tokens], [t[shared_tokens:] for t in texts[1:]]


def physics_ratio(steps: Sequence[StepRecord]) -> dict | None:
    """Prefill tok/s (tokens computed / seconds of the steps that only prefill) over batch-1 decode
    tok/s (1 / the mean step that only decodes one sequence), from one request-at-a-time run's
    steps; None when it has no step of either kind."""
    prefill = [s for s in steps if s.num_prefill_tokens and not s.num_decode_seqs]
    decode = [s for s in steps if not s.num_prefill_tokens and s.num_decode_seqs == 1]
    if not prefill or not decode:
        return None
    prefill_tok_s = sum(s.num_prefill_tokens for s in prefill) / sum(s.duration_s for s in prefill)
    decode_tok_s = len(decode) / sum(s.duration_s for s in decode)
    return {"prefill_tok_s": prefill_tok_s, "decode_tok_s": decode_tok_s, "ratio": prefill_tok_s / decode_tok_s}


def run_load(
    engine: LLMEngine,
    setting: LoadSetting,
    shared_prefix: list[int],
    user_turns: Sequence[list[int]],
    output_tokens: int,
    lines_per_load: int = 5,
) -> dict:
    """Send one load at once and read its records as vLLM's logger would (see the module's text).

    The prefix cache is emptied first; with the shared prefix and the cache on, one request of the
    system prompt alone runs before (untimed), so the load finds it cached. Returns a JSON dict: the
    setting's fields, ``label``, ``prompt_tokens`` (per request), ``load_ratio`` (prompt tokens per
    output token of the load), ``mean_running`` (sequences per step, weighted by step time),
    ``whole`` (one ``LoggedStats.to_dict`` over the run), ``lines`` (``lines_per_load`` of them, each
    over an equal share of the run: vLLM's 10 s is longer than these runs) and
    ``physics`` (``physics_ratio``, for a load run one request at a time without a hit, else None).
    Raises ``ValueError`` for a ``max_running`` above the engine's ``max_num_seqs``.
    """
    prompts = [shared_prefix + list(t) if setting.shared_prefix else list(t) for t in user_turns]
    bm = engine.block_manager
    with bm.caching(setting.prefix_caching), engine.reconfigured(max_num_seqs=setting.max_running):
        if setting.shared_prefix and setting.prefix_caching:
            engine.generate([list(shared_prefix)], SamplingParams.fixed_length(1))
        first = len(engine.step_records)
        outs = engine.generate(prompts, SamplingParams.fixed_length(output_tokens))
        steps = engine.step_records[first:]
    (whole,) = logged_intervals(steps, outs, math.inf, num_blocks=bm.num_blocks)
    lines = logged_intervals(steps, outs, whole.interval_s / lines_per_load, num_blocks=bm.num_blocks)
    busy_s = sum(s.duration_s for s in steps)
    hits = sum(o.num_cached_tokens for o in outs)
    return asdict(setting) | {
        "label": setting.label(),
        "prompt_tokens": len(prompts[0]),
        "load_ratio": sum(map(len, prompts)) / sum(len(o.token_ids) for o in outs),
        "mean_running": sum(s.duration_s * (s.num_prefill_seqs + s.num_decode_seqs) for s in steps) / busy_s,
        "whole": whole.to_dict(),
        "lines": [x.to_dict() for x in lines],
        "physics": physics_ratio(steps) if setting.max_running == 1 and not hits else None,
    }


def logged_ratio_sweep(
    engine: LLMEngine,
    shared_prefix: list[int],
    user_turns: Sequence[list[int]],
    output_tokens: int,
    max_running: int = 8,
    lines_per_load: int = 5,
    settings: Sequence[LoadSetting] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run every load of ``settings`` (default ``default_settings(max_running)``) with the same
    requests (``user_turns``, after ``shared_prefix`` where a load shares it), after a warm-up.

    Args:
        shared_prefix: the system prompt's token ids (a whole number of blocks hits whole).
        user_turns: one list of token ids per request (``shared_prefix_prompts`` cuts both from text).
        output_tokens: tokens each request generates (EOS ignored), >= 1.
        lines_per_load: log lines per load, each over an equal share of its run.
    Returns:
        a JSON dict: ``shared_tokens``, ``user_tokens`` (of the first turn), ``output_tokens``,
        ``num_requests``, ``article`` (the panel's figures), ``loads`` (one
        ``run_load`` dict each, in order) and ``physics`` (of the loads that have one, the one with
        the fastest prefill: the longest prompts, nearest the compute-bound peak; None without).
    Raises:
        ValueError: no user turn, ``output_tokens`` or ``lines_per_load`` < 1, a ``max_running`` above the engine's
            ``max_num_seqs``, or a request the engine refuses.
    """
    if not user_turns or output_tokens < 1 or lines_per_load < 1:
        raise ValueError(
            "need a user turn, output_tokens >= 1 and lines_per_load >= 1; got "
            f"{len(user_turns)} turns, output_tokens={output_tokens}, lines_per_load={lines_per_load}"
        )
    settings = list(settings or default_settings(max_running))
    warm_up(engine, [list(user_turns[0])], output_tokens=2)
    loads = []
    for setting in settings:
        if progress:
            progress(f"logged ratio: {setting.label()}")
        loads.append(run_load(engine, setting, shared_prefix, user_turns, output_tokens, lines_per_load))
    return {
        "shared_tokens": len(shared_prefix),
        "user_tokens": len(user_turns[0]),
        "output_tokens": output_tokens,
        "num_requests": len(user_turns),
        "article": ARTICLE_PANEL
        | {"ratio": ARTICLE_PANEL["prompt_throughput_tok_s"] / ARTICLE_PANEL["generation_throughput_tok_s"]},
        "loads": loads,
        "physics": max(
            (load["physics"] for load in loads if load["physics"]), key=lambda p: p["prefill_tok_s"], default=None
        ),
    }


def logged_ratio_estimate_s(
    probe: dict, shared_tokens: int, user_tokens: int, output_tokens: int, num_requests: int, max_running: int = 8
) -> float:
    """Rough seconds of ``logged_ratio_sweep`` with ``default_settings`` on the device ``probe``
    (``probes.probe_speed``) describes: four loads computing the turns, the cached prefix's two
    warm-ups, the shared prompts whole with the cache off; decode steps one request at a time
    (three loads) or ``max_running`` together (two)."""
    prefill_tokens = 4 * num_requests * user_tokens + 2 * shared_tokens + num_requests * (shared_tokens + user_tokens)
    waves = -(-num_requests // max_running)
    decode_steps = (output_tokens - 1) * (3 * num_requests + 2 * waves)
    return estimate_s(probe, prefill_tokens, decode_steps, prefills=5 * num_requests + 2)


def logged_ratios(result: dict) -> list[float]:
    """The logged prompt / generation ratio of each load of a ``logged_ratio_sweep`` (whole run)."""
    return [load["whole"]["prompt_to_generation_ratio"] for load in result["loads"]]


def format_logged_ratios(result: dict) -> str:
    """The table of a ``logged_ratio_sweep``: per load, the logged figures over the whole run and
    the load's own prompt tokens per output token, then the physics and the article for reference."""
    rows = [
        f"{'load':<44} {'hit rate':>8} {'running':>7} {'prompt tok/s':>12} {'gen tok/s':>9} {'logged':>7} "
        f"{'prompt/output':>13} {'computed':>9}",
        f"{'':<44} {'':>8} {'(mean)':>7} {'(logged)':>12} {'(logged)':>9} {'ratio':>7} {'tokens':>13} {'tok/s':>9}",
    ]
    for load in result["loads"]:
        w = load["whole"]
        rows.append(
            f"{load['label']:<44} {100 * w['prefix_cache_hit_rate']:>7.1f}% {load['mean_running']:>7.1f} "
            f"{w['prompt_throughput_tok_s']:>12,.0f} {w['generation_throughput_tok_s']:>9,.1f} "
            f"{w['prompt_to_generation_ratio']:>6.1f}x {load['load_ratio']:>12.1f}x "
            f"{w['computed_prompt_throughput_tok_s']:>9,.0f}"
        )
    a, p = result["article"], result["physics"]
    rows.append(
        f"\n(computed tok/s: the prompt tokens the steps actually ran, hits excluded; not in vLLM's line)\n"
        f"article's panel: {a['prompt_throughput_tok_s']:,.1f} vs {a['generation_throughput_tok_s']:.0f} tok/s "
        f"= {a['ratio']:.1f}x at a {100 * a['prefix_cache_hit_rate']:.0f}% hit rate"
    )
    if p:
        rows.append(
            f"physics here, one request at a time: prefill {p['prefill_tok_s']:,.0f} tok/s over batch-1 decode "
            f"{p['decode_tok_s']:.1f} tok/s = {p['ratio']:.0f}x"
        )
    return "\n".join(rows)


def log_lines(load: dict) -> list[str]:
    """The lines vLLM's logger would have printed during one load of a ``logged_ratio_sweep``."""
    return [LoggedStats.from_dict(x).line() for x in load["lines"]]
