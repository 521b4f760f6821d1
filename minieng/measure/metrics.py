"""Serving figures from recorded timestamps: TTFT, TPOT, ITL, E2EL, percentiles, goodput, acceptance.

Pure functions of what the engine leaves behind (``RequestTimes``, ``RequestOutput``); nothing here
runs a model, reads a clock or imports torch. The definitions are docs/architecture.md, Figures, which
follows vLLM's serving benchmark (``calculate_metrics`` in ``vllm/benchmarks/serve.py``):

TTFT = first emission - arrival (queueing included); E2EL = last emission - arrival;
TPOT = (E2EL - TTFT) / (n_out - 1) for n_out >= 2 only; ITL = each gap between successive
emissions, so a step emitting several tokens (speculative decoding) is one gap and TPOT < ITL.
Summaries pool completed requests only, as vLLM pools successful ones; goodput follows DistServe
(Zhong et al. 2024): completed requests meeting every SLO given, per second of the run.
Everything returned is a dataclass of plain numbers and lists: ``dataclasses.asdict`` is JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from minieng.core.outputs import RequestOutput

PERCENTILES = (50, 90, 95, 99)
COMPLETED_REASONS = ("stop", "length")  # finish reasons of a request that ran to its end


@dataclass
class RequestMetrics:
    """One request's figures, in seconds. ``None`` where a figure is undefined (no token, n_out < 2).

    ``ok`` is True for a request that completed (finish reason ``stop`` or ``length``); aborted
    and unfinished ones are not ok and are left out of latency summaries and goodput.
    """

    ttft_s: float | None
    tpot_s: float | None
    e2el_s: float | None
    itl_s: list[float]
    queue_s: float | None  # first scheduled - arrival
    prompt_tokens: int
    output_tokens: int
    finish_reason: str | None
    ok: bool
    arrival_s: float = 0.0  # absolute (perf_counter) time, to place the request in the run
    num_preemptions: int = 0
    cached_tokens: int | None = 0  # prompt tokens served by the prefix cache; None: the server's usage left it out

    @classmethod
    def from_emissions(
        cls,
        arrival_s: float,
        emissions: Sequence[tuple[float, int]],
        prompt_tokens: int,
        finish_reason: str | None = "stop",
        first_scheduled_s: float | None = None,
        num_preemptions: int = 0,
    ) -> RequestMetrics:
        """Build from raw timestamps: ``emissions`` = ``[(time_s, num_tokens), ...]`` in time order.

        Raises:
            ValueError: an emission of fewer than 1 token, or emission times out of order.
        """
        times = [t for t, _ in emissions]
        if any(n < 1 for _, n in emissions) or any(b < a for a, b in zip([arrival_s] + times, times)):
            raise ValueError(
                f"emissions must carry >= 1 token each, at non-decreasing times from "
                f"arrival_s={arrival_s}; got {list(emissions)}"
            )
        n_out = sum(n for _, n in emissions)
        ttft = times[0] - arrival_s if times else None
        e2el = times[-1] - arrival_s if times else None
        tpot = (e2el - ttft) / (n_out - 1) if n_out >= 2 else None
        queue = first_scheduled_s - arrival_s if first_scheduled_s is not None else None
        return cls(
            ttft,
            tpot,
            e2el,
            [b - a for a, b in zip(times, times[1:])],
            queue,
            prompt_tokens,
            n_out,
            finish_reason,
            finish_reason in COMPLETED_REASONS,
            arrival_s,
            num_preemptions,
        )


def request_metrics(out: RequestOutput) -> RequestMetrics:
    """The figures of one engine ``RequestOutput`` (its ``times`` and token counts)."""
    t = out.times
    m = RequestMetrics.from_emissions(
        t.arrival_s, t.emissions, len(out.prompt_token_ids), out.finish_reason, t.first_scheduled_s, t.num_preemptions
    )
    m.cached_tokens = out.num_cached_tokens
    assert m.output_tokens == len(out.token_ids), (
        f"request {out.request_id}: emissions carry {m.output_tokens} tokens, output has {len(out.token_ids)}"
    )
    return m


def summarize_ms(values_s: Iterable[float]) -> dict[str, float | int | None]:
    """mean, p50, p90, p95, p99, max (milliseconds) and count of values given in seconds.

    Percentiles are ``numpy.percentile`` with its default linear interpolation (as vLLM).
    An empty input gives ``count`` 0 and ``None`` everywhere else.
    """
    ms = np.asarray(list(values_s), dtype=np.float64) * 1e3
    if ms.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None, "count": 0}
    return {
        "mean": float(ms.mean()),
        **{f"p{p}": float(np.percentile(ms, p)) for p in PERCENTILES},
        "max": float(ms.max()),
        "count": int(ms.size),
    }


def percentile_label(p: float, count: int) -> str:
    """How to name the ``p``-th percentile of ``count`` samples: ``"P99"`` or ``"max of 24"``.

    A percentile means something only when at least one sample lies above it: ``count * (1 - p/100)
    >= 1`` (100 samples for P99, 20 for P95, 10 for P90). Below that, ``numpy.percentile``'s linear
    interpolation only blends the top samples, and the honest name of the figure is the maximum:
    ``percentile_label(99, 24) == "max of 24"``, ``percentile_label(99, 100) == "P99"``.

    Args:
        p: the percentile, in (0, 100].
        count: how many samples the percentile was computed over (>= 0).

    Raises:
        ValueError: ``p`` outside (0, 100] or a negative ``count``.
    """
    if not 0 < p <= 100:
        raise ValueError(f"percentile p={p!r} must lie in (0, 100]")
    if count < 0:
        raise ValueError(f"count={count!r} must be >= 0")
    # count * (1 - p/100) >= 1, in percent units so that 10 samples support P90 despite float rounding
    return f"P{p:g}" if count * (100 - p) >= 100 - 1e-9 else f"max of {count}"


def labeled_percentile(data: dict | Sequence[float], p: float = 99) -> tuple[str, float | None]:
    """The ``p``-th percentile under the name its sample supports (``percentile_label``), with its value.

    ``data``: a ``summarize_ms`` dict (its ``count``, ``p50`` ... ``p99`` and ``max``; ``p`` one of
    ``PERCENTILES``) or the samples themselves (any unit; ``numpy.percentile``, linear). Returns
    ``("P99", the percentile)`` when the sample supports it, else ``("max of N", the maximum)``:
    the figure a reader can trust, under its honest name. The value is None for no samples.

    Raises:
        ValueError: ``p`` outside (0, 100], or a summary that does not hold ``p``.
    """
    if isinstance(data, dict):
        count, key = int(data["count"]), f"p{p:g}"
        if key not in data:
            raise ValueError(f"the summary holds {sorted(k for k in data if k.startswith('p'))}, not {key}")
        label = percentile_label(p, count)
        return label, data[key] if label.startswith("P") else data["max"]
    values = np.asarray(list(data), dtype=np.float64)
    label = percentile_label(p, values.size)
    if values.size == 0:
        return label, None
    return label, float(np.percentile(values, p)) if label.startswith("P") else float(values.max())


def tail_text(data: dict | Sequence[float], p: float = 99, unit: str = "ms", digits: int = 1) -> str:
    """The ``p``-th percentile as a reader should see it printed: "P99 12.3 ms", or "max of 24 12.3 ms"
    when the sample is too small for a P99 (``labeled_percentile``: a P99 needs 100 samples, no
    exception), or "no samples". ``data`` as ``labeled_percentile`` takes it (a ``summarize_ms``
    dict is in ms)."""
    label, value = labeled_percentile(data, p)
    return "no samples" if value is None else f"{label} {value:.{digits}f} {unit}"


def common_tail(summaries: Sequence[dict], p: float = 99) -> tuple[str, str]:
    """One tail column for a table of several ``summarize_ms`` dicts (one row each): the ``p``-th
    percentile when every row's sample supports it, else every row's maximum.

    Returns ``(label, key)``: ``("P99", "p99")``, or ``("max of N", "max")`` with N the fewest
    samples of a row, so the column's header and footnote name the figure as it is.

    Raises:
        ValueError: no summaries, or ``p`` outside (0, 100].
    """
    if not summaries:
        raise ValueError("common_tail: give at least one summary")
    label = percentile_label(p, min(int(s["count"]) for s in summaries))
    return label, (f"p{p:g}" if label.startswith("P") else "max")


@dataclass
class SLO:
    """Latency objectives in milliseconds; ``None`` means no objective on that figure."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value is not None and not value > 0:
                raise ValueError(f"SLO {name}={value!r} must be a positive number of milliseconds, or None")
        if all(v is None for v in asdict(self).values()):
            raise ValueError("an SLO needs at least one of ttft_ms, tpot_ms, e2el_ms")

    def met_by(self, m: RequestMetrics) -> bool:
        """Whether a request meets every objective given (bounds inclusive, as vLLM's ``s >= r``).

        Not-ok (aborted, failed, unfinished) requests miss. A request with no TPOT (n_out <= 1)
        meets a TPOT objective vacuously: vLLM counts its TPOT as 0 for goodput. A request with no
        token has no TTFT/E2EL and misses objectives on them.
        """
        if not m.ok:
            return False
        checks = [
            (self.ttft_ms, m.ttft_s),
            (self.tpot_ms, 0.0 if m.tpot_s is None else m.tpot_s),
            (self.e2el_ms, m.e2el_s),
        ]
        return all(
            value_s is not None and value_s * 1e3 <= bound_ms for bound_ms, value_s in checks if bound_ms is not None
        )


@dataclass
class ServingMetrics:
    """Run-level figures: vLLM's benchmark report plus queueing, preemptions and goodput. Token totals
    and throughputs count completed requests only (as vLLM); throughputs are ``None`` if duration <= 0."""

    duration_s: float | None
    num_requests: int
    completed: int
    aborted: int
    failed: int  # neither completed nor aborted: still unfinished when measured
    total_prompt_tokens: int
    total_output_tokens: int
    request_throughput_req_s: float | None
    output_throughput_tok_s: float | None
    prefill_throughput_tok_s: float | None
    ttft_ms: dict = field(default_factory=dict)
    tpot_ms: dict = field(default_factory=dict)
    itl_ms: dict = field(default_factory=dict)
    e2el_ms: dict = field(default_factory=dict)
    queue_ms: dict = field(default_factory=dict)
    num_excluded_from_tpot: int = 0  # completed requests with fewer than 2 output tokens
    num_preemptions: int = 0
    slo: dict | None = None
    num_good_requests: int | None = None
    goodput_req_s: float | None = None
    cached_prompt_tokens: int | None = 0  # None: no request's usage reported its cached tokens
    prefix_cache_hit_rate: float | None = None  # prompt tokens served from cache / prompt tokens

    def to_dict(self) -> dict:
        return asdict(self)


def run_duration_s(requests: Sequence[RequestMetrics]) -> float | None:
    """From the first arrival to the last emission of any request; ``None`` without an emission."""
    ends = [m.arrival_s + m.e2el_s for m in requests if m.e2el_s is not None]
    return max(ends) - min(m.arrival_s for m in requests) if ends else None


def served_from_cache(cached: Iterable[int | None], absent_is_zero: bool | None = None) -> int | None:
    """Prompt tokens a prefix cache served, summed over requests (each a usage block's
    ``prompt_tokens_details.cached_tokens``; None where the usage left it out). vLLM leaves the
    field out when it is 0, so a missing count is 0 once the server is known to report it:
    ``absent_is_zero``, or, when None, as soon as one of these requests reported it. None when a
    count stays unknown (a server that never reports it)."""
    cached = list(cached)
    if absent_is_zero is None:
        absent_is_zero = any(c is not None for c in cached)
    if absent_is_zero:
        return sum(c or 0 for c in cached)
    return None if any(c is None for c in cached) else sum(cached)


def serving_metrics(
    requests: Iterable[RequestMetrics | RequestOutput], duration_s: float | None = None, slo: SLO | None = None
) -> ServingMetrics:
    """Summarize a run (docs/architecture.md, Figures). ``requests`` are engine outputs or ``RequestMetrics``.

    Args:
        duration_s: the run's wall time; default ``run_duration_s`` (first arrival to last emission).
        slo: when given, goodput = completed requests meeting it (``SLO.met_by``) / duration_s.
    """
    ms = [r if isinstance(r, RequestMetrics) else request_metrics(r) for r in requests]
    if duration_s is None and ms:
        duration_s = run_duration_s(ms)
    done = [m for m in ms if m.ok]
    aborted = sum(m.finish_reason == "abort" for m in ms)

    def per_s(x: float) -> float | None:
        return x / duration_s if duration_s is not None and duration_s > 0 else None

    prompt_tokens, output_tokens = sum(m.prompt_tokens for m in done), sum(m.output_tokens for m in done)
    good = sum(slo.met_by(m) for m in done) if slo is not None else None
    cached = served_from_cache(m.cached_tokens for m in done)
    return ServingMetrics(
        duration_s,
        len(ms),
        len(done),
        aborted,
        len(ms) - len(done) - aborted,
        prompt_tokens,
        output_tokens,
        per_s(len(done)),
        per_s(output_tokens),
        per_s(prompt_tokens),
        ttft_ms=summarize_ms(m.ttft_s for m in done if m.ttft_s is not None),
        tpot_ms=summarize_ms(m.tpot_s for m in done if m.tpot_s is not None),
        itl_ms=summarize_ms(gap for m in done for gap in m.itl_s),
        e2el_ms=summarize_ms(m.e2el_s for m in done if m.e2el_s is not None),
        queue_ms=summarize_ms(m.queue_s for m in done if m.queue_s is not None),
        num_excluded_from_tpot=sum(m.tpot_s is None for m in done),
        num_preemptions=sum(m.num_preemptions for m in ms),
        slo=asdict(slo) if slo is not None else None,
        num_good_requests=good,
        goodput_req_s=per_s(good) if good is not None else None,
        cached_prompt_tokens=cached,
        prefix_cache_hit_rate=cached / prompt_tokens if cached is not None and prompt_tokens else None,
    )


@dataclass
class AcceptanceMetrics:
    """Speculative-decoding acceptance (docs/architecture.md, Figures and Speculative decoding; vLLM's spec-decode metrics).
    A *draft* is one sequence's proposal checked in one verification step."""

    num_drafts: int
    num_draft_tokens: int  # proposed
    num_accepted_tokens: int
    acceptance_rate: float | None  # accepted / proposed
    mean_acceptance_length: float | None  # tokens emitted per draft, bonus included: 1 + accepted / drafts
    acceptance_rate_per_position: list[float]  # [i]: drafts accepting position i / drafts proposing it


def acceptance_metrics(num_accepted: Sequence[int], num_proposed: int | Sequence[int]) -> AcceptanceMetrics:
    """Acceptance figures from per-draft counts.

    Args:
        num_accepted: ``[num_drafts]``, draft tokens accepted in each draft; acceptance is a prefix
            (verification stops at the first rejection), so position i is accepted iff accepted > i.
        num_proposed: draft tokens proposed, one int k for every draft or ``[num_drafts]``.
    Per-position rates divide by the drafts that proposed that position; with a fixed k this is
    vLLM's accepted-per-position / num_drafts. Empty input gives ``None`` rates. The engine's
    ``spec_records`` count over the tokens a request emits: a draft past its stop is neither
    proposed nor accepted (``Speculator.release`` says why).
    Raises:
        ValueError: mismatched lengths, or an accepted count outside [0, proposed].
    """
    accepted = [int(a) for a in num_accepted]
    proposed = [int(num_proposed)] * len(accepted) if np.ndim(num_proposed) == 0 else [int(p) for p in num_proposed]
    if len(proposed) != len(accepted):
        raise ValueError(f"num_proposed has {len(proposed)} entries for {len(accepted)} drafts: one per draft")
    bad = [(a, p) for a, p in zip(accepted, proposed) if not 0 <= a <= p]
    if bad:
        raise ValueError(f"accepted counts must lie in [0, proposed]; got (accepted, proposed) {bad[:5]}")
    n, total_p, total_a = len(accepted), sum(proposed), sum(accepted)
    per_position = [
        sum(a > i for a in accepted) / sum(p > i for p in proposed)  # divisor >= 1 here
        for i in range(max(proposed, default=0))
    ]
    return AcceptanceMetrics(
        n, total_p, total_a, total_a / total_p if total_p else None, 1 + total_a / n if n else None, per_position
    )
