"""Notebook 10's plumbing: the trace-shaped workload at a load sized from the device's probe, the
lines its cells print, and the worked answers of its pencil problems. The cells keep the physics:
the server, the load run, the two clocks, the objectives and goodput's formula, the plots.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from minieng.measure.loadgen import LoadResult
from minieng.measure.metrics import SLO, ServingMetrics, tail_text
from minieng.measure.workloads import RequestSpec, read_trace, sampled_trace_workload, scale_workload


@dataclass(frozen=True)
class LessonWorkload:
    """``lesson_workload``'s requests: ``specs`` arrive at ``rate_req_s``; ``alone_s`` is each
    request's time alone on this device (the probe's estimate)."""

    specs: list[RequestSpec]
    rate_req_s: float
    alone_s: list[float]
    load: float
    source: str

    @property
    def key(self) -> list[list[float]]:
        """The arrivals and sizes, for a results cache's key."""
        return [[float(s.arrival_s), float(s.prompt_tokens), float(s.output_tokens)] for s in self.specs]

    @property
    def median_prompt_tokens(self) -> int:
        return int(statistics.median(s.prompt_tokens for s in self.specs))

    def replay_s(self, max_num_seqs: int | None = None) -> float:
        """Rough seconds of a run: the arrivals' span, or where longer the requests' times alone shared
        ``max_num_seqs`` at a time (a cap of 1 serves them one after the other: a queue), then twice the
        longest request alone."""
        busy = sum(self.alone_s) / max_num_seqs if max_num_seqs else 0.0
        return max(self.specs[-1].arrival_s, busy) + 2 * max(self.alone_s)

    def line(self) -> str:
        return (
            f"{len(self.specs)} requests from {self.source}, at {self.rate_req_s:.2f} req/s ({self.load}x what one "
            f"request alone keeps busy: {statistics.mean(self.alone_s):.2f} s on average)"
        )


def lesson_workload(
    num_requests: int,
    trace_csv: str,
    length_scale: float,
    load: float,
    estimate_s: Callable[..., float],
    *,
    max_prompt_tokens: int,
    max_output_tokens: int,
    seed: int = 0,
) -> LessonWorkload:
    """``num_requests`` of the Azure 2023 conversation trace (``trace_csv``, or its quantiles where
    empty), lengths x ``length_scale`` and capped, arrivals stretched so that requests come ``load``
    times as fast as one request alone is served. ``estimate_s(prefill_tokens=, decode_steps=,
    prefills=)``: the backend's probe estimate (``Backend.estimate_s``)."""
    if trace_csv:
        raw, source = read_trace(trace_csv, num_requests), f"the Azure 2023 trace ({trace_csv})"
    else:
        raw = sampled_trace_workload(num_requests, "conv", seed=seed)
        source = "the Azure 2023 conv trace's quantiles (sampled from them, not the trace itself)"
    specs = scale_workload(
        raw, 1.0, length_scale, max_prompt_tokens=max_prompt_tokens, max_output_tokens=max_output_tokens
    )
    alone = [estimate_s(prefill_tokens=s.prompt_tokens, decode_steps=s.output_tokens, prefills=1) for s in specs]
    rate = load / statistics.mean(alone)
    span = specs[-1].arrival_s or 1.0
    specs = scale_workload(specs, time_scale=(len(specs) / rate) / span)
    return LessonWorkload(specs, rate, alone, load, f"{source}, lengths x {length_scale}")


def latency_samples(client: LoadResult) -> dict[str, list[float]]:
    """The run's TTFT and TPOT samples in ms, for ``viz.latency_cdfs`` (TPOT: requests of two tokens or more)."""
    ok = [r for r in client.requests if r.ok]
    return {
        "TTFT": [r.ttft_s * 1e3 for r in ok],
        "TPOT": [r.tpot_s * 1e3 for r in ok if r.tpot_s is not None],
    }


def slo_lines(m: ServingMetrics, slo: SLO) -> list[str]:
    """Raw throughput, and the means and tails the objectives are read against."""
    return [
        f"SLO: TTFT <= {slo.ttft_ms:g} ms, TPOT <= {slo.tpot_ms:g} ms",
        f"raw: {m.request_throughput_req_s:.2f} req/s, {m.output_throughput_tok_s:.1f} output tok/s",
        f"TTFT mean {m.ttft_ms['mean']:.0f} ms, P50 {m.ttft_ms['p50']:.0f} ms, {tail_text(m.ttft_ms, digits=0)}; "
        f"TPOT mean {m.tpot_ms['mean']:.1f} ms, P50 {m.tpot_ms['p50']:.1f} ms, {tail_text(m.tpot_ms)}",
    ]


def run_summary(label: str, m: ServingMetrics) -> str:
    """The recorded run in one line, as a load generator's user reads a server."""
    return (
        f"{label}: {m.completed} requests, TTFT P50 {m.ttft_ms['p50']:.0f} ms, {tail_text(m.ttft_ms, digits=0)}; "
        f"TPOT P50 {m.tpot_ms['p50']:.1f} ms, {tail_text(m.tpot_ms)}; goodput {m.goodput_req_s:.2f} req/s"
    )


def two_clocks_answer(ttft_alone_ms: float, decode_step_ms: float) -> str:
    """The worked answer of "the client's clock against the engine's", with the probe's figures."""
    return (
        "The engine stamps a request when the server hands it over and each token when a step emits it; the "
        "client stamps its send and each chunk's arrival. So the client's TTFT is the engine's plus the HTTP "
        "path both ways (parsing the request, the event's way back): on loopback a small addition to a TTFT of "
        f"about {ttft_alone_ms:.0f} ms for a median prompt alone here (the probe). TPOT and ITL are differences "
        "of two times on the same path: the path cancels, and both clocks read at least one decode step, "
        f"{decode_step_ms:.1f} ms alone, more where steps are shared."
    )


def objectives_answer(work: LessonWorkload, slo: SLO, ttft_alone_ms: float, decode_step_ms: float) -> str:
    """The worked answer of "what share meets the objectives, and where does the mean TTFT sit?"."""
    return (
        f"Alone, a median prompt's prefill takes about {ttft_alone_ms:.0f} ms against a TTFT objective of "
        f"{slo.ttft_ms:g} ms, and a decode step {decode_step_ms:.1f} ms against {slo.tpot_ms:g} ms: a request "
        f"alone meets both with room. But requests arrive {work.load}x as fast as one alone is served "
        f"({work.rate_req_s:.2f} req/s, {statistics.mean(work.alone_s):.2f} s each alone): they overlap, steps are "
        "shared (TPOT grows with the batch) and a request arriving behind a long prefill waits for it (its TTFT "
        "grows by that prefill). The misses are the queued and the crowded: expect most requests to meet both, "
        "and the mean TTFT above the P50, pulled toward the tail by the few that queued."
    )


def disaggregation_answer(work: LessonWorkload, estimate_s: Callable[..., float], decode_step_ms: float) -> str:
    """The worked answer of "two colocated replicas or a prefill and a decode engine?", from the
    probe's estimates of the workload's prefill and decode time."""
    prefill_s = sum(estimate_s(prefill_tokens=s.prompt_tokens, prefills=1) for s in work.specs)
    share = prefill_s / sum(work.alone_s)
    longest = max(estimate_s(prefill_tokens=s.prompt_tokens, prefills=1) for s in work.specs)
    return (
        f"Count the work. Prefilling every prompt takes about {prefill_s:.1f} s, {100 * share:.0f}% of the "
        "workload's time alone (the probe). Two colocated replicas share all of it evenly. A prefill engine "
        f"and a decode engine split it {100 * share:.0f}/{100 - 100 * share:.0f}: the busier one sets the "
        "pace, the other waits, and the KV hand-off adds its transfer. So per device, the split wins only where "
        "the two phases' work is close to balanced. Its gain is the tail: a decode engine never runs a "
        f"prefill, so no gap waits for one (up to {1e3 * longest:.0f} ms for this workload's longest prompt "
        f"against a decode step of {decode_step_ms:.1f} ms): a lower ITL tail."
    )
