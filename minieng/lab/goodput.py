"""Raw throughput is not goodput: one workload replayed under several batch caps, each judged by
goodput and P99 as well as throughput.

Each point of the sweep is a fresh engine sharing the model's weights, configured with a
``max_num_seqs`` (how many requests run together) and a ``max_num_batched_tokens`` (the step's
token budget: how much prefill a step may carry beside its decodes), replaying the same arrivals
in real time (``replay.run_workload``). Bigger caps raise output tok/s: more sequences share each
read of the weights. They also raise TPOT (bigger steps, and prefill chunks landing in the steps
of running decodes) until requests miss a TPOT objective; smaller caps keep steps short but let
requests queue, until they miss a TTFT objective. Goodput (DistServe: requests per second that
meet every objective, ``metrics.SLO``) peaks in between, and seldom where raw throughput does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from minieng.engine.llm_engine import LLMEngine
from minieng.lab.replay import run_workload
from minieng.measure.metrics import SLO, common_tail, serving_metrics
from minieng.measure.workloads import RequestSpec, workload_prompts


def batch_cap_sweep(
    engine: LLMEngine,
    specs: list[RequestSpec],
    caps: list[tuple[int, int]],
    slo: SLO,
    prompts: list[list[int]] | None = None,
    timeout_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Replay ``specs`` once per ``(max_num_seqs, max_num_batched_tokens)`` in ``caps``.

    Args:
        engine: supplies the weights and every other setting (each point builds its own engine,
            so the KV pool starts empty and the prefix cache cold).
        slo: the objectives goodput is measured against.
        prompts: token ids per spec (default: real text of each spec's length).
        timeout_s: per point; requests unfinished then count as failed (they miss the SLO).
    Returns:
        ``{"slo": ..., "points": [...], "best_throughput": i, "best_goodput": i}``: per point the
        caps, output tok/s, request throughput, TTFT and TPOT P50/P99 (ms) and their whole
        ``summarize_ms`` summaries (``ttft_ms``, ``tpot_ms``: counts and maxima, for a tail named by
        what its sample supports), goodput (req/s), the requests that met the SLO, completed
        requests and preemptions; the two indices point at
        the points with the highest output tok/s and the highest goodput.
    Raises:
        ValueError: no caps, or a cap below 1.
    """
    if not caps:
        raise ValueError("give at least one (max_num_seqs, max_num_batched_tokens) pair")
    if any(seqs < 1 or tokens < 1 for seqs, tokens in caps):
        raise ValueError(f"caps must be positive, got {caps}")
    prompts = prompts if prompts is not None else workload_prompts(engine.tokenizer, specs)
    points = []
    for max_num_seqs, max_num_batched_tokens in caps:
        if progress:
            progress(f"max_num_seqs={max_num_seqs}, max_num_batched_tokens={max_num_batched_tokens}")
        config = replace(engine.config, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
        point_engine = LLMEngine(config, loaded=engine.loaded)
        run = run_workload(point_engine, specs, prompts, timeout_s=timeout_s)
        m = serving_metrics(run.outputs, run.duration_s, slo)
        points.append(
            {
                "max_num_seqs": max_num_seqs,
                "max_num_batched_tokens": max_num_batched_tokens,
                "output_throughput_tok_s": m.output_throughput_tok_s,
                "request_throughput_req_s": m.request_throughput_req_s,
                "ttft_p50_ms": m.ttft_ms["p50"],
                "ttft_p99_ms": m.ttft_ms["p99"],
                "tpot_p50_ms": m.tpot_ms["p50"],
                "tpot_p99_ms": m.tpot_ms["p99"],
                "ttft_ms": m.ttft_ms,
                "tpot_ms": m.tpot_ms,
                "goodput_req_s": m.goodput_req_s,
                "num_good_requests": m.num_good_requests,
                "completed": m.completed,
                "num_requests": len(specs),
                "num_preemptions": m.num_preemptions,
            }
        )
        del point_engine  # its KV pool goes before the next one is allocated
    best = max(range(len(points)), key=lambda i: points[i]["output_throughput_tok_s"] or 0.0)
    good = max(
        range(len(points)),
        key=lambda i: (points[i]["goodput_req_s"] or 0.0, points[i]["output_throughput_tok_s"] or 0.0),
    )
    return {
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2el_ms": slo.e2el_ms},
        "points": points,
        "best_throughput": best,
        "best_goodput": good,
    }


def _head(key: str) -> str:
    """A tail column's header word: ``P99`` for the key ``p99``, ``max`` for ``max``."""
    return key.upper() if key.startswith("p") else key


def format_sweep(result: dict) -> list[str]:
    """The sweep as a table, the best-throughput and best-goodput rows marked. The tail columns are
    P99 when every point has the 100 requests a P99 needs, else each point's max, said so
    (``metrics.common_tail``)."""
    slo = ", ".join(f"{k} <= {v:g}" for k, v in result["slo"].items() if v is not None)
    points = result["points"]
    ttft_tail, ttft_key = common_tail([p["ttft_ms"] for p in points])
    tpot_tail, tpot_key = common_tail([p["tpot_ms"] for p in points])
    lines = [
        f"Batch caps on one workload; goodput under SLO ({slo})",
        f"  {'seqs':>5} {'budget':>7} {'out tok/s':>9} {_head(ttft_key) + ' TTFT ms':>11} "
        f"{_head(tpot_key) + ' TPOT ms':>11} {'goodput req/s':>13} {'good':>9}",
    ]
    for i, p in enumerate(result["points"]):
        marks = (" <- most throughput" if i == result["best_throughput"] else "") + (
            " <- most goodput" if i == result["best_goodput"] else ""
        )
        lines.append(
            f"  {p['max_num_seqs']:>5} {p['max_num_batched_tokens']:>7} {p['output_throughput_tok_s'] or 0:>9.1f} "
            f"{p['ttft_ms'][ttft_key] or 0:>11.0f} {p['tpot_ms'][tpot_key] or 0:>11.0f} {p['goodput_req_s'] or 0:>13.2f} "
            f"{p['num_good_requests']:>4}/{p['num_requests']:<4}{marks}"
        )
    tails = (("TTFT", ttft_tail, ttft_key), ("TPOT", tpot_tail, tpot_key))
    short = [f"{name} {tail}" for name, tail, key in tails if key == "max"]
    if short:
        lines.append(f"  (max: too few requests a point for a P99: {', '.join(short)})")
    return lines
