"""Notebook 01 through the API (``lab.endpoint``'s ``ENDPOINT`` parameter): the speed probe that sizes
its runs (``endpoint_probe``), TTFT against prompt length and a batch-1 decode (``endpoint_two_phases``,
``format_two_phases``), and the three requests of ``phase_costs``' grid (``endpoint_phase_grid``),
each request sent alone and timed from its chunks (``endpoint.send_one``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from minieng.lab.endpoint import Endpoint, _texts, send_one
from minieng.lab.phase_costs import grid_medians, grid_shapes, run_grid
from minieng.measure.metrics import RequestMetrics, served_from_cache, summarize_ms
from minieng.measure.sweep_plan import prefill_knee, probe_lengths, scan_prefill


def _median_int(values) -> int:
    return int(round(statistics.median(values)))


def endpoint_probe(
    endpoint: Endpoint,
    max_prompt_tokens: int,
    budget_s: float = 15.0,
    repeats: int = 3,
    decode_tokens: int = 6,
    seed: int | None = None,
) -> dict:
    """``probes.probe_speed`` through the API: where the server's prefill tok/s stops growing, and
    its batch-1 decode step, in the dict ``probe_speed`` returns, so ``estimate_s`` and
    ``sweep_plan.prefill_sweep_lengths`` size a lesson's runs from it.

    Prompts at doubling lengths from 64 tokens (``sweep_plan.scan_prefill``, within ``budget_s``),
    each length's first discarded, then the median TTFT of ``repeats`` more, each sent alone and
    answered in one token; then the median TPOT of ``repeats`` decodes of ``decode_tokens`` tokens
    after a 64-token prompt. Lengths are the server's counts (``prefill_points``: its medians).
    ``max_prompt_tokens`` is capped by the server's ``max_model_len`` less the answer where known.
    Unlike ``probe_speed`` it cannot switch the server's prefix cache off or raise its step's token
    budget: distinct prompts share nothing a cache could serve, and a server that chunks a long prompt
    (vLLM does, past ``--max-num-batched-tokens``) times its chunks together.

    Returns:
        ``prefill_tok_s``, ``decode_step_s``, ``knee_tokens``, ``knee_reached``, ``overhead_s``,
        ``prefill_points``, ``max_prompt_tokens`` (``probe_speed``'s) and ``server``
        (``Endpoint.label``).
    Raises:
        ValueError: ``repeats`` < 1, ``decode_tokens`` < 2 or ``max_prompt_tokens`` < 1.
        RuntimeError: a request failed, or answered fewer than 2 tokens (no TPOT).
    """
    if repeats < 1 or decode_tokens < 2 or max_prompt_tokens < 1:
        raise ValueError(
            f"endpoint_probe: repeats={repeats} (>= 1), decode_tokens={decode_tokens} (>= 2) and "
            f"max_prompt_tokens={max_prompt_tokens} (>= 1)"
        )
    cap = max_prompt_tokens
    if endpoint.max_model_len:
        cap = max(1, min(cap, endpoint.max_model_len - decode_tokens - 8))  # 8: a BOS and the text's rounding
    rng = np.random.default_rng(seed)
    counted: dict[int, int] = {}

    def time_prefill(n: int) -> float:
        prompts = _texts(endpoint, n, repeats + 1, rng)
        send_one(endpoint, prompts[0], 1)  # a new length: on a GPU server, possibly a new shape to plan
        runs = [send_one(endpoint, p, 1) for p in prompts[1:]]
        counted[n] = _median_int(r.prompt_tokens for r in runs)
        return statistics.median(r.ttft_s for r in runs)

    asked = scan_prefill(time_prefill, probe_lengths(cap), budget_s, repeats + 1)
    points: list[tuple[int, float]] = []
    for n, t in asked:  # the server's counts, kept ascending (two close asked lengths may count alike)
        if not points or counted[n] > points[-1][0]:
            points.append((counted[n], t))
    knee = prefill_knee(points)
    decode_prompts = _texts(endpoint, min(64, cap), repeats, rng)
    tpots = [_tpot(send_one(endpoint, p, decode_tokens), endpoint) for p in decode_prompts]
    return {
        "prefill_tok_s": knee["peak_tok_s"],
        "decode_step_s": statistics.median(tpots),
        "knee_tokens": knee["knee_tokens"],
        "knee_reached": knee["knee_reached"],
        "overhead_s": knee["overhead_s"],
        "prefill_points": [list(p) for p in points],
        "max_prompt_tokens": cap,
        "server": endpoint.label,
    }


def _tpot(m: RequestMetrics, endpoint: Endpoint) -> float:
    if m.tpot_s is None:
        raise RuntimeError(
            f"{endpoint.label} answered {m.output_tokens} token(s): TPOT needs 2 or more "
            "(does it honour ignore_eos, vLLM's extension?)"
        )
    return m.tpot_s


def endpoint_two_phases(
    endpoint: Endpoint,
    prompt_tokens: Sequence[int],
    decode_tokens: int,
    repeats: int = 1,
    decode_prompt_tokens: int = 64,
    seed: int | None = None,
) -> dict:
    """Notebook 01's section 2 through the API: TTFT against prompt length, and the TPOT of a batch-1
    decode.

    For each length of ``prompt_tokens`` (asked; about that many of the server's tokens),
    ``repeats`` distinct prompts, each sent alone and answered in one token: their median TTFT, and
    prefill tok/s = the server's median prompt count / that TTFT. Then one request of about
    ``decode_prompt_tokens`` prompt tokens decoding ``decode_tokens`` tokens alone (batch 1): its
    TPOT (``stream_figures``: (E2EL - TTFT) / (tokens - 1)) and ITL. No step records: no MFU, MBU
    or roofline point (``ENGINE_ONLY``).

    Returns:
        a JSON-serializable dict: ``server`` (``Endpoint.label``), ``prefill``: per length, in the
        order of the server's counts, ``asked_tokens``, ``prompt_tokens`` (the server's median count), ``ttft_s``, ``tok_s``,
        ``cached_tokens`` (summed over the length's requests; None: not reported); ``decode``:
        ``prompt_tokens``, ``output_tokens``, ``tpot_s``, ``tok_s`` (1 / TPOT), ``itl_ms``
        (``summarize_ms``), ``cached_tokens``.
    Raises:
        ValueError: no length, a length < 1, ``repeats`` < 1 or ``decode_tokens`` < 2.
        RuntimeError: a request failed, or the decode answered fewer than 2 tokens.
    """
    if not prompt_tokens or min(prompt_tokens) < 1 or repeats < 1 or decode_tokens < 2:
        raise ValueError(
            f"endpoint_two_phases: prompt_tokens={list(prompt_tokens)} (one or more lengths >= 1), "
            f"repeats={repeats} (>= 1), decode_tokens={decode_tokens} (>= 2)"
        )
    rng = np.random.default_rng(seed)
    rows = []
    for n in prompt_tokens:
        runs = [send_one(endpoint, p, 1) for p in _texts(endpoint, n, repeats, rng)]
        counted, ttft = _median_int(r.prompt_tokens for r in runs), statistics.median(r.ttft_s for r in runs)
        rows.append(
            {
                "asked_tokens": n,
                "prompt_tokens": counted,
                "ttft_s": ttft,
                "tok_s": counted / ttft,
                "cached_tokens": served_from_cache(r.cached_tokens for r in runs),
            }
        )
    rows.sort(key=lambda r: r["prompt_tokens"])  # by the server's count, as a fit of TTFT against it needs
    m = send_one(endpoint, _texts(endpoint, decode_prompt_tokens, 1, rng)[0], decode_tokens)
    tpot = _tpot(m, endpoint)
    decode = {
        "prompt_tokens": m.prompt_tokens,
        "output_tokens": m.output_tokens,
        "tpot_s": tpot,
        "tok_s": 1 / tpot,
        "itl_ms": summarize_ms(m.itl_s),
        "cached_tokens": m.cached_tokens,
    }
    return {"server": endpoint.label, "prefill": rows, "decode": decode}


def format_two_phases(result: dict) -> list[str]:
    """``endpoint_two_phases``'s result as notebook 01's table: per length the server's prompt count,
    TTFT and prefill tok/s (and the cache's share where a prompt hit one), then the decode and the
    prefill / decode ratio."""
    lines = [
        f"measured through the API: {result['server']}",
        f"{'prompt tokens':>13} {'TTFT ms':>9} {'prefill tok/s':>13}",
    ]
    for r in result["prefill"]:
        hit = f"  ({r['cached_tokens']} served from its cache)" if r["cached_tokens"] else ""
        lines.append(f"{r['prompt_tokens']:>13} {r['ttft_s'] * 1e3:>9.1f} {r['tok_s']:>13.0f}{hit}")
    dec = result["decode"]
    best = max(result["prefill"], key=lambda r: r["tok_s"])
    lines += [
        "",
        f"batch-1 decode: {dec['output_tokens']} tokens after {dec['prompt_tokens']}: TPOT {dec['tpot_s'] * 1e3:.1f} ms "
        f"= {dec['tok_s']:.1f} tok/s, ITL P50 {dec['itl_ms']['p50']:.1f} ms",
        f"prefill / decode = {best['tok_s']:.0f} / {dec['tok_s']:.1f} = {best['tok_s'] / dec['tok_s']:.0f}x on this "
        "server; the article's vLLM panel: 12,968.6 / 95 = 136x",
    ]
    return lines


def endpoint_phase_grid(
    endpoint: Endpoint,
    prompt_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
    repeats: int = 1,
    seed: int | None = None,
) -> dict[str, dict]:
    """``phase_costs.phase_cost_grid`` through the API: the three requests of ``phase_costs.CASES``
    (short prompt and answer; long prompt; long answer), each sent alone: one untimed request of
    each, then ``repeats`` rounds (``phase_costs.run_grid``), timed as TTFT and decode time (E2EL -
    TTFT), medians. Returns per case ``prompt_tokens`` and ``output_tokens`` (the server's median
    counts), ``ttft_s``, ``decode_s``. Raises ``ValueError`` as ``phase_costs.grid_shapes`` does,
    ``RuntimeError`` for a failed request."""
    shapes = grid_shapes(prompt_tokens, output_tokens, repeats, "endpoint_phase_grid")
    rng = np.random.default_rng(seed)
    texts = {case: _texts(endpoint, p, repeats + 1, rng) for case, (p, _) in shapes.items()}
    runs = run_grid(shapes, repeats, lambda case, i: send_one(endpoint, texts[case][i], shapes[case][1]))
    grid = grid_medians(shapes, runs)
    for case, r in grid.items():  # the server's counts of what was sent, not the lengths asked for
        r["prompt_tokens"] = _median_int(x.prompt_tokens for x in runs[case])
        r["output_tokens"] = _median_int(x.output_tokens for x in runs[case])
    return grid
