"""Notebook 10 through the API (``lab.endpoint``'s ``ENDPOINT`` parameter): its workload as texts for a
server (``endpoint_requests``) and a load run's figures as the client timed them (``format_client_clock``).
"""

from __future__ import annotations

import numpy as np

from minieng.lab.endpoint import NOT_REPORTED, Endpoint, _texts
from minieng.measure.loadgen import LoadRequest
from minieng.measure.metrics import ServingMetrics, common_tail
from minieng.measure.workloads import RequestSpec


def endpoint_requests(endpoint: Endpoint, specs: list[RequestSpec], seed: int | None = None) -> list:
    """Notebook 10's workload for a server: one ``loadgen.LoadRequest`` per spec, at its arrival, a text
    of about its prompt length (the server counts it) asking for its output length. Send them with
    ``loadgen.run_load(endpoint.base_url, endpoint.model, ...)``."""
    rng = np.random.default_rng(seed)
    return [LoadRequest(s.arrival_s, _texts(endpoint, s.prompt_tokens, 1, rng)[0], s.output_tokens) for s in specs]


def format_client_clock(summary: ServingMetrics, endpoint: Endpoint) -> list[str]:
    """A load run's figures as its client timed them (``metrics.serving_metrics`` of its stream
    figures): per figure the sample size, P50 and tail (P99 where 100 samples support it, else the
    max), then the prefix cache's share (or ``NOT_REPORTED``)."""
    lines = [
        f"measured through the API: {endpoint.label}",
        f"  {'ms':<6} {'n':>5} {'client P50':>11} {'client tail':>12}  tail",
    ]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        s = getattr(summary, key)
        if not s["count"]:
            lines.append(f"  {key[:-3].upper():<6} (not measured: no samples)")
            continue
        label, tail = common_tail([s])
        lines.append(f"  {key[:-3].upper():<6} {s['count']:>5} {s['p50']:>11.1f} {s[tail]:>12.1f}  {label}")
    rate = summary.prefix_cache_hit_rate
    lines.append(f"  prefix cache: {NOT_REPORTED if rate is None else f'{rate:.1%} of prompt tokens served from it'}")
    return lines
