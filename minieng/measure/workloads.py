"""Workloads: request streams (fixed, Poisson, trace replay) and real-text prompts of exact lengths.

The text is public-domain prose shipped in the course's ``data/text/`` (Jane Austen's
*Pride and Prejudice*, chapters 1-11; see its README). Real text rather than random ids: the
attention patterns and the tokens generated look like a real workload's.

The Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA 2024; CC BY 4.0) is read from a
CSV the user has (``read_trace``); the course itself carries only quantiles derived from it
(``data/azure-llm-trace-2023/``), from which ``sampled_trace_workload`` draws trace-shaped
requests where the CSV is absent.
"""

from __future__ import annotations

import csv
import itertools
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import numpy as np

from minieng.package_data import data_path

DEFAULT_TEXT = data_path("text", "pride_and_prejudice.txt")
TRACE_QUANTILES = data_path("azure-llm-trace-2023", "quantiles.json")
TRACE_SERVICES = ("conv", "code")
# The probabilities at which the trace's quantiles are kept: every percentile, finer in the top
# one, where the few longest gaps (minutes, in code.csv) carry much of the mean gap.
TRACE_PROBABILITIES = tuple(
    [p / 100 for p in range(99)] + [(990 + i) / 1000 for i in range(10)] + [0.9995, 0.9999, 1.0]
)


@lru_cache(maxsize=4)
def _text_token_ids(tokenizer, path: Path) -> tuple[int, ...]:
    if not path.is_file():
        raise ValueError(
            f"{path} not found: install minieng from its wheel or sdist, or run from a "
            "clone of the repository (the text corpus lives in its data/ folder)"
        )
    return tuple(tokenizer.encode(path.read_text(encoding="utf-8"), add_special_tokens=False))


def text_prompts(tokenizer, num_tokens: int, count: int = 1, path: Path = DEFAULT_TEXT) -> list[list[int]]:
    """``count`` distinct prompts of exactly ``num_tokens`` token ids, cut from real text.

    Consecutive prompts start at different places of the text (they share no prefix), wrapping
    around when the text is shorter than ``num_tokens * count``.
    Raises ``ValueError`` if the text is shorter than one prompt.
    """
    ids = _text_token_ids(tokenizer, path)
    if num_tokens > len(ids):
        raise ValueError(f"num_tokens={num_tokens} exceeds the {len(ids)} tokens of {path.name}")
    stride = max(1, (len(ids) - num_tokens) // max(1, count))
    return [list(ids[(i * stride) % (len(ids) - num_tokens + 1) :][:num_tokens]) for i in range(count)]


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: when it arrives (s after the start) and its sizes in tokens."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def fixed_workload(
    num_requests: int, prompt_tokens: int, output_tokens: int, interval_s: float = 0.0
) -> list[RequestSpec]:
    """Identical requests, arriving ``interval_s`` apart (0: all at once)."""
    _check_positive(num_requests=num_requests, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    if not interval_s >= 0:
        raise ValueError(f"interval_s={interval_s!r} must be >= 0")
    return [RequestSpec(i * interval_s, prompt_tokens, output_tokens) for i in range(num_requests)]


def poisson_workload(
    num_requests: int, rate_per_s: float, prompt_tokens: int, output_tokens: int, seed: int = 0
) -> list[RequestSpec]:
    """Arrivals of a Poisson process: exponential gaps of mean 1 / ``rate_per_s`` seconds."""
    _check_positive(
        num_requests=num_requests, rate_per_s=rate_per_s, prompt_tokens=prompt_tokens, output_tokens=output_tokens
    )
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, num_requests)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first request arrives at t = 0
    return [RequestSpec(float(t), prompt_tokens, output_tokens) for t in arrivals]


def spread_output_lengths(specs: list[RequestSpec], low: int, high: int, seed: int = 0) -> list[RequestSpec]:
    """The same arrivals and prompts with output lengths drawn uniformly from ``[low, high]``
    tokens (inclusive): answers that end at different times, as real ones do.
    Raises ``ValueError`` unless 1 <= low <= high."""
    if not 1 <= low <= high:
        raise ValueError(f"need 1 <= low <= high output tokens; got low={low}, high={high}")
    lengths = np.random.default_rng(seed).integers(low, high + 1, len(specs))
    return [RequestSpec(s.arrival_s, s.prompt_tokens, int(n)) for s, n in zip(specs, lengths)]


def read_trace(path: str | Path, num_requests: int | None = None, skip: int = 0) -> list[RequestSpec]:
    """Read a trace CSV with columns TIMESTAMP, ContextTokens, GeneratedTokens (Azure LLM trace).

    Arrivals are made relative to the first request read. Raises ``ValueError`` for a missing file
    or columns.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trace file {path} not found")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if not need <= set(reader.fieldnames or []):
            raise ValueError(f"{path.name} needs columns {sorted(need)}, has {reader.fieldnames}")
        rows = list(itertools.islice(reader, skip, None if num_requests is None else skip + num_requests))
    times = [_parse_timestamp(r["TIMESTAMP"]) for r in rows]
    return [RequestSpec(t - times[0], int(r["ContextTokens"]), int(r["GeneratedTokens"])) for t, r in zip(times, rows)]


def trace_quantiles(specs: list[RequestSpec], probabilities=TRACE_PROBABILITIES) -> dict:
    """Figures derived from a trace, the kind its licence lets the course keep instead of rows.

    ``specs``: the whole trace in arrival order (``read_trace``), at least 2 requests.
    Returns ``num_requests``, ``duration_s`` (first to last arrival), ``rate_per_s`` (gaps per
    second of that span), and the quantiles at ``probabilities`` (numpy's linear interpolation)
    of ``prompt_tokens``, ``output_tokens`` and ``interarrival_s`` (the gaps between successive
    arrivals). Tokens are rounded to 1e-3, seconds to 1e-6. Raises ``ValueError`` for arrivals out of time order or all at one instant, and for fewer than
    2 requests."""
    if len(specs) < 2:
        raise ValueError(f"a trace of {len(specs)} request(s) has no inter-arrival gap: give at least 2")
    arrivals = np.array([s.arrival_s for s in specs])
    gaps = np.diff(arrivals)
    duration_s = float(arrivals[-1] - arrivals[0])
    if duration_s <= 0 or (gaps < 0).any():
        raise ValueError("a trace needs its arrivals in time order, spanning more than 0 s: sort it by arrival time")

    def q(values, digits):
        return [round(float(v), digits) for v in np.quantile(np.asarray(values, dtype=float), probabilities)]

    return {
        "num_requests": len(specs),
        "duration_s": round(duration_s, 6),
        "rate_per_s": round(len(gaps) / duration_s, 6),
        "prompt_tokens": q([s.prompt_tokens for s in specs], 3),
        "output_tokens": q([s.output_tokens for s in specs], 3),
        "interarrival_s": q(gaps, 6),
    }


def stored_trace_quantiles(service: str = "conv", path: Path = TRACE_QUANTILES) -> dict:
    """The quantiles kept in the course (``data/azure-llm-trace-2023/quantiles.json``) for one
    service of the Azure trace: ``trace_quantiles``'s figures plus their ``probabilities``.
    Raises ``ValueError`` for an unknown service or a missing file."""
    if service not in TRACE_SERVICES:
        raise ValueError(f"trace service {service!r} unknown; use one of {', '.join(TRACE_SERVICES)}")
    if not path.is_file():
        raise ValueError(
            f"{path} not found: install minieng from its wheel or sdist, or run from a clone "
            "of the repository (the trace's quantiles live in its data/ folder)"
        )
    stored = json.loads(path.read_text(encoding="utf-8"))
    return {"probabilities": stored["probabilities"], **stored["services"][service]}


def sampled_trace_workload(
    num_requests: int, service: str = "conv", seed: int = 0, quantiles: dict | None = None
) -> list[RequestSpec]:
    """Trace-shaped requests sampled from the trace's quantiles, not the trace itself.

    Each request's prompt length, output length and gap to the previous arrival are drawn by
    inverse-CDF sampling (one uniform draw each, linear between the stored quantiles; lengths
    rounded, at least 1 token), independently: the marginal distributions are the trace's, the
    correlations between them (a long prompt with a long answer, bursts of arrivals) are not kept.
    The first request arrives at t = 0. ``quantiles``: ``stored_trace_quantiles(service)`` unless
    given. Reproducible per ``seed``. Raises ``ValueError`` for ``num_requests`` < 1 or an
    unknown service.
    """
    _check_positive(num_requests=num_requests)
    q = quantiles if quantiles is not None else stored_trace_quantiles(service)
    u = np.random.default_rng(seed).random((3, num_requests))

    def draw(name, row):
        return np.interp(u[row], q["probabilities"], q[name])

    prompts = np.maximum(1, np.rint(draw("prompt_tokens", 0))).astype(int)
    outputs = np.maximum(1, np.rint(draw("output_tokens", 1))).astype(int)
    gaps = draw("interarrival_s", 2)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    return [RequestSpec(float(t), int(p), int(o)) for t, p, o in zip(arrivals, prompts, outputs)]


def scale_workload(
    specs: list[RequestSpec],
    time_scale: float = 1.0,
    length_scale: float = 1.0,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
) -> list[RequestSpec]:
    """Shrink a real workload for a small machine: arrivals x ``time_scale`` (2 = half the rate),
    lengths x ``length_scale``, clipped to the maxima, never below 1 token."""

    def size(n: int, cap: int | None) -> int:
        n = max(1, round(n * length_scale))
        return min(n, cap) if cap else n

    return [
        RequestSpec(
            s.arrival_s * time_scale, size(s.prompt_tokens, max_prompt_tokens), size(s.output_tokens, max_output_tokens)
        )
        for s in specs
    ]


def workload_prompts(tokenizer, specs: list[RequestSpec], path: Path = DEFAULT_TEXT, seed: int = 0) -> list[list[int]]:
    """A real-text prompt of the exact length of each spec, each cut from a place ``seed`` draws:
    the same seed, the same prompts (a server's prefix cache then holds them from an earlier run)."""
    ids = _text_token_ids(tokenizer, path)
    rng = np.random.default_rng(seed)
    prompts = []
    for s in specs:
        if s.prompt_tokens > len(ids):
            raise ValueError(f"prompt_tokens={s.prompt_tokens} exceeds the {len(ids)} tokens of {path.name}")
        start = int(rng.integers(0, len(ids) - s.prompt_tokens + 1))
        prompts.append(list(ids[start : start + s.prompt_tokens]))
    return prompts


def _parse_timestamp(text: str) -> float:
    """Seconds since the epoch of '2023-11-16 18:17:03.9799600' (7 fractional digits, UTC)."""
    whole, _, frac = text.strip().partition(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name}={value!r} must be > 0")
