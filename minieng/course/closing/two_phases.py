"""Notebook 01's closing claims table: S1 (one request's physics, and as vLLM's log reads it), S2
(prefill's cost against the prompt), S3 (the decode floor), S14 (each phase follows its own length)
and S15 (TTFT and ITL, not total latency), from what the notebook measured on its backend
(``lab.backend``: an engine here, or a server through its API, whose rows that need the engine's step
records say why not)."""

from __future__ import annotations

from minieng.course import verdicts
from minieng.course.kit import claims_table
from minieng.lab.logged_ratio import logged_ratios
from minieng.measure.flops_bytes import prefill_params_per_token, prefill_work
from minieng.measure.roofline import format_percent, phase_ratio_floor, tpot_floor_s

NOT_MEASURED = "not measured through the API"


def _s1(backend, res: dict) -> tuple[str, str]:
    best, dec = max(res["prefill"], key=lambda r: r["tok_s"]), res["decode"]
    said = f"{best['tok_s']:.0f} vs {dec['tok_s']:.1f} tok/s, {best['tok_s'] / dec['tok_s']:.0f}x"
    if not backend.has_steps:
        return said, verdicts.not_testable(f"the roofline's prediction: {backend.why_not('napkin')}")
    peak, config = backend.ceilings.peak, backend.engine.model_config
    flops = prefill_work(config, best["prompt_tokens"], backend.engine.dtype.itemsize).total_flops
    predicted = phase_ratio_floor(
        flops, best["prompt_tokens"], dec["bytes"], peak.peak_tflops * 1e12, peak.bandwidth_gbps * 1e9
    )
    return said + f"; the roofline predicts {predicted:.0f}x here", verdicts.s1_physics(
        best["tok_s"], dec["tok_s"], predicted_ratio=predicted, noise=res.noise
    )


def _s1_logged(backend, logged: dict | None) -> tuple[str, str]:
    if logged is None:
        return NOT_MEASURED, verdicts.not_testable(backend.why_not("logged_ratio"))
    ratios = logged_ratios(logged)
    said = f"logged {min(ratios):.0f}x to {max(ratios):.0f}x across {len(ratios)} loads of one engine"
    return said, verdicts.s1_logged_ratio(ratios, load_ratios=[load["load_ratio"] for load in logged["loads"]])


def _s2(backend, res: dict, fit: dict) -> tuple[str, str]:
    longest = res["prefill"][-1]["prompt_tokens"]
    quad = fit["quadratic_share"] if fit["significant"] else None
    share = "not significant" if quad is None else f"{100 * quad:.0f}%"
    if not backend.has_steps:
        return f"fitted n² share of TTFT {share}", verdicts.not_testable(backend.why_not("attention_share"))
    config = backend.engine.model_config
    w = prefill_work(config, longest, backend.engine.dtype.itemsize)
    attention = w.attention_flops / w.total_flops
    said = f"attention {100 * attention:.0f}% of the FLOPs at {longest} tokens; fitted n² share of TTFT {share}"
    return said, verdicts.s2_quadratic(
        quad,
        attention_share=attention,
        prompt_tokens=longest,
        noise=res.noise,
        unphysical_fit=None if fit["physical"] is not False else fit["reason"],
        linear_s_per_token=fit.get("b_s_per_token"),
        params=prefill_params_per_token(config),
        peak_flops=backend.ceilings.peak.peak_tflops * 1e12,
    )


def _s3(backend, res: dict) -> tuple[str, str]:
    dec = res["decode"]
    if not backend.has_steps:
        return f"TPOT {dec['tpot_s'] * 1e3:.1f} ms", verdicts.not_testable(backend.why_not("floor"))
    floor_s = tpot_floor_s(dec["bytes"], backend.ceilings.peak.bandwidth_gbps * 1e9)
    said = f"floor {floor_s * 1e3:.1f} ms, measured {dec['tpot_s'] * 1e3:.1f} ms ({format_percent(dec['mbu_percent'])} MBU)"
    return said, verdicts.s3_floor(dec["tpot_s"], floor_s=floor_s, noise=res.noise)


def _s14(grid: dict, noise) -> tuple[str, str]:
    s, p, o = grid["short"], grid["long_prompt"], grid["long_output"]
    said = (
        f"prompt {s['prompt_tokens']} -> {p['prompt_tokens']} tok: TTFT {s['ttft_s'] * 1e3:.0f} -> "
        f"{p['ttft_s'] * 1e3:.0f} ms; answer {s['output_tokens']} -> {o['output_tokens']} tok: decode "
        f"{s['decode_s'] * 1e3:.0f} -> {o['decode_s'] * 1e3:.0f} ms"
    )
    return said, verdicts.s14_slopes(
        s["ttft_s"], p["ttft_s"], o["ttft_s"], s["decode_s"], p["decode_s"], o["decode_s"], noise=noise
    )


def _s15(m, noise) -> tuple[str, str]:
    said = f"TTFT {m.ttft_s * 1e3:.0f} ms, TPOT {m.tpot_s * 1e3:.1f} ms, total / tokens {m.e2el_s / m.output_tokens * 1e3:.1f} ms"
    if m.output_tokens < 2:
        return said, verdicts.not_testable("the reply had under two tokens")
    return said, verdicts.s15_total_latency(m.ttft_s, m.tpot_s, mean_output_tokens=m.output_tokens, noise=noise)


def table(*, backend, res, fit: dict, logged: dict | None, grid, chat):
    """The claims table of notebook 01. ``backend``: the lesson's (``lab.lesson_backend``); ``res``:
    ``lab.phase_result`` of section 2 (a ``CachedResult``: its ``.noise`` judges; a plain dict through
    an API: no noise of the remote machine); ``fit``: ``fit_ttft`` of its prefill rows; ``logged``:
    ``logged_ratio_sweep``'s result (None through an API); ``grid``: ``backend.phase_grid``'s;
    ``chat``: section 1's ``RequestMetrics``."""
    noise = getattr(res, "noise", None)
    rows = [
        ("S1: prefill tok/s >> decode tok/s", "12,968.6 vs 95 tok/s, 136x", *_s1(backend, res)),
        (
            "S1 as vLLM logs it: the 136x follows the load",
            "12,968.6 vs 95 tok/s logged, 97% prefix cache hits",
            *_s1_logged(backend, logged),
        ),
        (
            "S2: prefill ~ 2PN, attention n^2 dominates only at long context",
            "quadratic term grows with length",
            *_s2(backend, res, fit),
        ),
        ("S3: TPOT >= bytes / bandwidth", "RTX 3060: ~33 tok/s ceiling", *_s3(backend, res)),
        (
            "S14: prefill cost follows the prompt, decode the answer",
            "two sliders, two curves",
            *_s14(grid, getattr(grid, "noise", None)),
        ),
        ("S15: measure TTFT and ITL separately", "stream, not total latency", *_s15(chat, backend.noise)),
    ]
    if not backend.has_steps:
        rows = [(claim, article, f"{backend.label}: {said}", v) for claim, article, said, v in rows]
    return claims_table(rows, noise=noise)
