"""What a token costs, per phase: joules per token and price per million tokens (notebooks 01, 05, 08, 10; the bench).

One engine, one ``measure.energy.EnergyMeter`` (its idle power read first, before any work):

- prefill: prompts of ``prompt_tokens`` sent one at a time (``probes.minieng_prefill``), repeated
  until the interval lasts ``min_interval_s``; tokens = the prompt tokens prefilled;
- decode at each batch of ``decode_batches``: the batch decoding ``output_tokens`` together
  (``probes.minieng_decode``), less the same batch stopped after 2 tokens: the difference is the
  energy and time of ``output_tokens - 2`` decode steps, the prefill that both runs share taken
  out (the bench's transformers TPOT is taken the same way); repeated like the prefill.

Every row gives tok/s, J/token (total, and above idle: what the phase added) and the price per
million tokens from the same interval's throughput (``measure.token_cost``), at a price per
device-hour the reader sets; left unset, an example labelled as one. Where no energy source works
(a CPU without RAPL, as in most VMs), the rows keep tok/s and price and say why the joules are
missing.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

from minieng.engine.llm_engine import LLMEngine
from minieng.lab.probes import minieng_decode, minieng_prefill, warm_up
from minieng.lab.quantization import device_schemes
from minieng.measure.energy import DEFAULT_IDLE_S, EnergyMeter, EnergyReading
from minieng.measure.token_cost import (
    cost_per_million_tokens,
    cost_per_thousand_requests,
    phase_cost,
    price_note,
    ratio,
)
from minieng.measure.workloads import text_prompts


def _repeats(once_s: float, measurable: bool, min_interval_s: float, max_repeats: int) -> int:
    """Runs in one measured interval: enough to last ``min_interval_s`` (a short interval reads
    NVML's coarse counter and its 1-s power average), one when nothing is measurable."""
    if not measurable or once_s <= 0:
        return 1
    return max(1, min(max_repeats, math.ceil(min_interval_s / once_s)))


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def _runs(times: int, fn, *args) -> None:
    for _ in range(times):
        fn(*args)


def _decode_seconds_per_step(times: int, engine: LLMEngine, prompts: list[list[int]], output_tokens: int) -> float:
    """Run the batch's decode ``times`` times; the median duration of its decode-only steps (s), from
    the engine's step records: a slow prefill or a stall between runs does not move it."""
    steps = []
    for _ in range(times):
        steps += minieng_decode(engine, prompts, output_tokens)[1]
    return statistics.median(s.duration_s for s in steps)


def _decode_reading(full: EnergyReading, short: EnergyReading, step_seconds: float) -> EnergyReading:
    """The decode tokens' interval: the ``full`` runs less their 2-token twins (``short``), the
    prefill both share taken out, so joules and seconds come from one interval. Where noise makes
    that difference empty (a loaded machine stalled the short runs), the seconds are
    ``step_seconds`` (the decode steps' own time, from the step records) and the joules None, with
    the reason: the throughput is still measured."""
    energy = full.minus(short)
    if energy.seconds > 0:
        return energy
    why = "noise: the n-token runs took no longer than their 2-token twins, so their difference is not the decode's"
    return replace(energy, joules=None, seconds=step_seconds, reason=why)


def measure_token_cost(
    engine: LLMEngine,
    prompt_tokens: int = 512,
    decode_batches: tuple[int, ...] = (1, 8),
    output_tokens: int = 32,
    decode_prompt_tokens: int = 64,
    price_per_device_hour: float | None = None,
    min_interval_s: float = 2.0,
    max_repeats: int = 256,
    idle_s: float = DEFAULT_IDLE_S,
    meter: EnergyMeter | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Measure J/token and the price per million tokens of prefill and of decode at each batch.

    Args:
        prompt_tokens: the prefill prompts' length (each prompt prefilled alone, in one step).
        decode_batches: decode batch sizes (e.g. 1 and a sweep's largest), each <= ``max_num_seqs``.
        output_tokens: tokens each decode request generates (>= 4; ``output_tokens - 2`` are counted).
        decode_prompt_tokens: the decode requests' prompt length.
        price_per_device_hour: what an hour of the device costs, in any currency; None: the example
            ``measure.token_cost.EXAMPLE_PRICE_PER_DEVICE_HOUR``, labelled as such in the result.
        min_interval_s, max_repeats: each measured interval repeats its run until it lasts
            ``min_interval_s`` (at most ``max_repeats`` runs); one run where energy is not measurable.
        idle_s: the idle window of the meter this call opens (not of a ``meter`` passed in).
        meter: an ``EnergyMeter`` already started (its idle read), e.g. shared by several engines;
            default: one opened here on ``engine.device`` before the warm-up, closed at the end.
    Returns:
        a JSON-serializable dict: ``device``; ``energy`` (``source``, ``reason``, ``idle_watts``,
        ``description``); ``price_per_device_hour``, ``price_is_example``, ``price_note``;
        ``config``; ``rows``: per phase a ``measure.token_cost.PhaseCost`` dict (``phase``,
        ``batch_size``, ``tokens``, ``seconds``, ``tok_s``, ``joules``, ``j_per_token``,
        ``j_per_token_above_idle``, ``kwh_per_mtok``, ``cost_per_mtok``) plus ``repeats``, the
        reading (``energy``) and, for decode rows, ``j_per_token_vs_prefill_x``,
        ``j_per_token_above_idle_vs_prefill_x`` and ``cost_vs_prefill_x`` (None where unmeasured).
    Decode is the n-token runs less their 2-token twins (joules and seconds of one interval); where
    a loaded machine's noise makes that difference empty, its seconds are the decode steps' own (the
    median decode-only step from the engine's step records, x the steps counted) and its joules None,
    with the reason.
    Raises:
        ValueError: ``output_tokens < 4``, a batch above ``max_num_seqs``, a batch whose sequences do
            not fit the KV pool together, or a prompt longer than the model's context.
    """
    if output_tokens < 4:
        raise ValueError(f"output_tokens={output_tokens}: decode is measured as n tokens less 2, so n must be >= 4")
    if prompt_tokens >= engine.max_model_len:
        raise ValueError(f"prompt_tokens={prompt_tokens} must be below max_model_len={engine.max_model_len}")
    pool = engine.block_manager.num_blocks * engine.config.block_size
    for b in decode_batches:
        if not 1 <= b <= engine.config.max_num_seqs:
            raise ValueError(f"decode batch {b}: must be 1..max_num_seqs={engine.config.max_num_seqs}")
        if b * (decode_prompt_tokens + output_tokens) > pool:
            raise ValueError(
                f"decode batch {b}: {b} x ({decode_prompt_tokens} + {output_tokens}) tokens exceed the KV pool's "
                f"{pool} (preemptions would be timed): lower the batch or the lengths"
            )
    say = progress or (lambda msg: None)
    price, note = price_note(price_per_device_hour)
    own = meter is None
    if own:
        meter = EnergyMeter(engine.device, idle_s=idle_s).start()  # the idle power first, where measurable
        say(meter.describe())
    measurable = meter.source is not None
    tok = engine.tokenizer
    rows = []
    budget = max(engine.config.max_num_batched_tokens, prompt_tokens)
    try:
        with engine.block_manager.caching(False), engine.reconfigured(max_num_batched_tokens=budget):
            warm_up(engine)
            say(f"prefill: {prompt_tokens}-token prompts")
            first = text_prompts(tok, prompt_tokens, 1)
            minieng_prefill(engine, first)  # a new length is a new shape: discarded
            reps = _repeats(_timed(minieng_prefill, engine, first), measurable, min_interval_s, max_repeats)
            _, reading = meter.measure(minieng_prefill, engine, text_prompts(tok, prompt_tokens, reps))
            prefill = phase_cost("prefill", 1, reps * prompt_tokens, reading, price).to_dict()
            rows.append(prefill | {"repeats": reps, "prompt_tokens": prompt_tokens, "energy": reading.to_dict()})
            for b in decode_batches:
                say(f"decode: batch {b}")
                prompts = text_prompts(tok, decode_prompt_tokens, b)
                once = _timed(minieng_decode, engine, prompts, output_tokens)
                reps = _repeats(once, measurable, min_interval_s, max_repeats)
                decode_s, full = meter.measure(_decode_seconds_per_step, reps, engine, prompts, output_tokens)
                _, short = meter.measure(_runs, reps, minieng_decode, engine, prompts, 2)
                reading = _decode_reading(full, short, decode_s * reps * (output_tokens - 2))
                row = phase_cost("decode", b, reps * b * (output_tokens - 2), reading, price).to_dict()
                rows.append(
                    row
                    | {
                        "repeats": reps,
                        "energy": reading.to_dict(),
                        "j_per_token_vs_prefill_x": ratio(row["j_per_token"], prefill["j_per_token"]),
                        "j_per_token_above_idle_vs_prefill_x": ratio(
                            row["j_per_token_above_idle"], prefill["j_per_token_above_idle"]
                        ),
                        "cost_vs_prefill_x": ratio(row["cost_per_mtok"], prefill["cost_per_mtok"]),
                    }
                )
    finally:
        if own:
            meter.stop()
    return {
        "device": str(engine.device),
        "energy": {
            "source": meter.source,
            "reason": meter.reason,
            "idle_watts": meter.idle_watts,
            "description": meter.describe(),
        },
        "price_per_device_hour": price,
        "price_is_example": price_per_device_hour is None,
        "price_note": note,
        "config": {
            "prompt_tokens": prompt_tokens,
            "decode_batches": list(decode_batches),
            "output_tokens": output_tokens,
            "decode_prompt_tokens": decode_prompt_tokens,
            "min_interval_s": min_interval_s,
        },
        "rows": rows,
    }


def reprice(result: dict, price_per_device_hour: float | None) -> dict:
    """A copy of ``measure_token_cost``'s (or ``measure_token_cost_by_scheme``'s) result at another
    price per device-hour (None: the example, labelled), without measuring again: each row's price
    per million tokens is recomputed from its measured tok/s. For a notebook's price box."""
    if "schemes" in result:
        return {"schemes": [e | {"result": reprice(e["result"], price_per_device_hour)} for e in result["schemes"]]}
    price, note = price_note(price_per_device_hour)
    rows = [
        r | {"price_per_device_hour": price, "cost_per_mtok": cost_per_million_tokens(r["tok_s"], price)}
        for r in result["rows"]
    ]
    prefill = next((r for r in rows if r["phase"] == "prefill"), None)
    for r in rows:
        if r["phase"] == "decode" and prefill is not None:
            r["cost_vs_prefill_x"] = ratio(r["cost_per_mtok"], prefill["cost_per_mtok"])
    return result | {
        "price_per_device_hour": price,
        "price_is_example": price_per_device_hour is None,
        "price_note": note,
        "rows": rows,
    }


def _num(value: float | None, spec: str, width: int) -> str:
    return f"{'n/a':>{width}}" if value is None else f"{value:>{width}{spec}}"


def _label(row: dict) -> str:
    if row["phase"] == "prefill":
        return f"prefill {row['prompt_tokens']}-token prompt"
    return f"decode batch {row['batch_size']}"


def format_token_cost(result: dict) -> str:
    """``measure_token_cost``'s result as a table: per phase tok/s, J/token (total and above idle), kWh and
    price per million tokens; then how many times a decode token costs a prefill token; then what
    the price is (an example to replace, unless the reader set one)."""
    cfg, energy = result["config"], result["energy"]
    lines = [f"What a token costs on {result['device']}, per phase", f"  {energy['description']}"]
    lines.append(
        f"  {'phase':<28} {'tokens':>8} {'tok/s':>10} {'J/token':>9} {'above idle':>10} {'kWh/Mtok':>9} {'$/Mtok*':>9}"
    )
    for r in result["rows"]:
        lines.append(
            f"  {_label(r):<28} {r['tokens']:>8} {r['tok_s']:>10.1f} {_num(r['j_per_token'], '.4g', 9)} "
            f"{_num(r['j_per_token_above_idle'], '.4g', 10)} {_num(r['kwh_per_mtok'], '.3g', 9)} "
            f"{r['cost_per_mtok']:>9.3g}"
        )
    lines.append(
        f"  (decode: {cfg['decode_prompt_tokens']}-token prompts, {cfg['output_tokens']} tokens each, the 2 first "
        "taken out with the prefill; above idle: J/token less the idle draw over the same seconds)"
    )
    decodes = [r for r in result["rows"] if r["phase"] == "decode"]
    measured = [r for r in decodes if r["j_per_token_vs_prefill_x"] is not None]
    if measured:
        lines.append(
            "  energy: a decode token takes "
            + "; ".join(
                f"{r['j_per_token_vs_prefill_x']:.3g}x the joules of a prefill token at batch {r['batch_size']}"
                + (
                    f" ({r['j_per_token_above_idle_vs_prefill_x']:.3g}x above idle)"
                    if r["j_per_token_above_idle_vs_prefill_x"] is not None
                    else ""
                )
                for r in measured
            )
        )
    elif energy["source"] is None:
        lines.append("  J/token: not measurable on this machine (see the energy line); tok/s and price still are")
    if decodes:
        lines.append(
            "  price: a decode token costs "
            + "; ".join(f"{r['cost_vs_prefill_x']:.3g}x a prefill token at batch {r['batch_size']}" for r in decodes)
            + " (a device-hour makes that many times fewer decode tokens)"
        )
    lines.append(f"  * {result['price_note']}")
    return "\n".join(lines)


def measure_token_cost_by_scheme(
    engine: LLMEngine,
    schemes: list[str] | None = None,
    group_size: int = 64,
    idle_s: float = DEFAULT_IDLE_S,
    progress: Callable[[str], None] | None = None,
    **kwargs,
) -> dict:
    """``measure_token_cost`` on the float ``engine`` and on one engine per quantization scheme sharing its
    weights (default: every scheme whose kernel runs here, ``quantization.device_schemes``), one
    meter for all (the idle power read once). ``kwargs`` go to ``measure_token_cost``.

    Returns ``{"schemes": [{"scheme": "none" | scheme, "result": measure_token_cost's dict}, ...]}``, the
    float model first. Raises ``ValueError`` for an engine that is already quantized.
    """
    if engine.config.quantization is not None:
        raise ValueError(
            "measure_token_cost_by_scheme compares schemes with the float model: pass an engine with quantization=None"
        )
    schemes = schemes if schemes is not None else device_schemes(engine.device, engine.dtype)
    say = progress or (lambda msg: None)
    out = []
    with EnergyMeter(engine.device, idle_s=idle_s) as meter:
        out.append({"scheme": "none", "result": measure_token_cost(engine, meter=meter, progress=progress, **kwargs)})
        for s in schemes:
            say(f"quantization: the {s} engine")
            quantized = LLMEngine(
                replace(engine.config, quantization=s, quantization_group_size=group_size), loaded=engine.loaded
            )
            out.append({"scheme": s, "result": measure_token_cost(quantized, meter=meter, progress=progress, **kwargs)})
            del quantized  # its KV pool goes before the next one is allocated
    return {"schemes": out}


def format_token_cost_by_scheme(result: dict) -> str:
    """Per scheme and phase: J/token and price per million tokens, and each as a share of the
    float model's (below 1: the scheme saves)."""
    base = {(r["phase"], r["batch_size"]): r for r in result["schemes"][0]["result"]["rows"]}
    first = result["schemes"][0]["result"]
    lines = [
        f"What a token costs per quantization scheme on {first['device']} (x float: the share of the float model's)",
        f"  {first['energy']['description']}",
        f"  {'scheme':<6} {'phase':<17} {'tok/s':>10} {'J/token':>9} {'x float':>8} {'$/Mtok':>9} {'x float':>8}",
    ]
    for entry in result["schemes"]:
        for r in entry["result"]["rows"]:
            b = base[(r["phase"], r["batch_size"])]
            phase = "prefill" if r["phase"] == "prefill" else f"decode batch {r['batch_size']}"
            lines.append(
                f"  {entry['scheme']:<6} {phase:<17} {r['tok_s']:>10.1f} {_num(r['j_per_token'], '.4g', 9)} "
                f"{_num(ratio(r['j_per_token'], b['j_per_token']), '.2f', 8)} {r['cost_per_mtok']:>9.3g} "
                f"{_num(ratio(r['cost_per_mtok'], b['cost_per_mtok']), '.2f', 8)}"
            )
    lines.append(f"  {first['price_note']}")
    return "\n".join(lines)


def format_cap_costs(sweep: dict, price_per_device_hour: float | None = None) -> str:
    """The price of the goodput sweep's caps (``goodput.batch_cap_sweep``'s result), from its measured
    throughputs: per million output tokens, and per thousand requests that met the SLO (goodput).
    The cap with the most raw throughput makes the cheapest tokens; the price of a served request
    that met its objectives is lowest where goodput peaks."""
    price, note = price_note(price_per_device_hour)
    lines = [
        "What the caps cost: $/Mtok from output tok/s, $ per 1,000 requests that met the SLO from goodput",
        f"  {'seqs':>5} {'budget':>7} {'out tok/s':>10} {'$/Mtok':>9} {'goodput req/s':>13} {'$/1k good':>10}",
    ]
    for i, p in enumerate(sweep["points"]):
        marks = (" <- most throughput" if i == sweep["best_throughput"] else "") + (
            " <- most goodput" if i == sweep["best_goodput"] else ""
        )
        tok_s = p["output_throughput_tok_s"] or 0.0
        per_mtok = cost_per_million_tokens(tok_s, price) if tok_s > 0 else None
        per_good = cost_per_thousand_requests(p["goodput_req_s"] or 0.0, price)
        lines.append(
            f"  {p['max_num_seqs']:>5} {p['max_num_batched_tokens']:>7} {tok_s:>10.1f} {_num(per_mtok, '.3g', 9)} "
            f"{p['goodput_req_s'] or 0:>13.2f} {_num(per_good, '.3g', 10)}{marks}"
        )
    lines.append("  (n/a: nothing served, or no request met the SLO)")
    lines.append(f"  {note}")
    return "\n".join(lines)
