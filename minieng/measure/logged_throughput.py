"""vLLM's logged throughputs: the line a vLLM server prints every few seconds, from minieng's records.

    Engine 000: Avg prompt throughput: 12968.6 tokens/s, Avg generation throughput: 95.0 tokens/s,
    Running: ... reqs, Waiting: ... reqs, GPU KV cache usage: ...%, Prefix cache hit rate: 97.0%

(the figures of the vLLM panel in "O erro de resumir performance a um número", Igor Nascimento).

Source: vLLM V1's ``LoggingStatLogger`` (``vllm/v1/metrics/loggers.py``), fed by
``IterationStats.update_from_output`` and ``CachingMetrics`` (``vllm/v1/metrics/stats.py``); its
API server calls ``log()`` every ``VLLM_LOG_STATS_INTERVAL`` (10 s by default). Per interval between
two logs, of ``interval_s`` seconds:

- **prompt throughput** = the prompt tokens of every request whose prefill completed in the interval
  (the step that emitted its first token), its *whole* prompt, prefix-cache hits included,
  / ``interval_s``. A request preempted and recomputed is counted once.
- **generation throughput** = the tokens emitted by all requests in the interval (the first token,
  which ends a prefill, included) / ``interval_s``.
- **Running**, **Waiting**: the scheduler's counts after the last step before the log.
- **GPU KV cache usage** = used blocks / all blocks after that step (a cached block no request
  holds is free, as in vLLM's block pool).
- **Prefix cache hit rate** = tokens the prefix cache served / prompt tokens looked up, over the most
  recent 1,000 requests at their first admission (``CachingMetrics``: a window of requests, not of
  time; readmissions after preemption are left out).

So the two throughputs are counts of a load, not speeds of a phase: over an interval long against
one request's life, prompt / generation throughput = prompt tokens / output tokens of the requests
served (Little's law: as many prefills complete as requests finish). A 97% hit rate lets a server
count prompt tokens 1 / (1 - 0.97) = 33x faster than it computes them.

Pure: reads ``StepRecord`` and ``RequestOutput`` as data (the fields named below); never builds or
steps an engine. ``StatLogger`` follows a running engine step by step (the server's log line);
``logged_intervals`` replays a finished run's records into the lines vLLM's logger would have printed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields

from minieng.core.outputs import RequestOutput, StepRecord

DEFAULT_LOG_INTERVAL_S = 10.0  # vLLM's VLLM_LOG_STATS_INTERVAL default
MAX_RECENT_REQUESTS = 1000  # the requests vLLM's CachingMetrics window keeps for the hit rate
LINE_FORMAT = (  # LoggingStatLogger.log's wording, word for word
    "Engine %03d: "
    "Avg prompt throughput: %.1f tokens/s, "
    "Avg generation throughput: %.1f tokens/s, "
    "Running: %d reqs, Waiting: %d reqs, "
    "GPU KV cache usage: %.1f%%, "
    "Prefix cache hit rate: %.1f%%"
)


@dataclass(frozen=True)
class LoggedStats:
    """One log line's figures: the interval ``(end_s - interval_s, end_s]`` on the engine's clock.

    Token counts are tokens; ``kv_cache_usage`` and ``prefix_cache_hit_rate`` are fractions in
    [0, 1] (the line prints percents); ``kv_cache_usage`` is None when the pool's size is unknown
    (printed as 0.0%). ``num_computed_prompt_tokens`` is not in vLLM's line: the prefill tokens the
    steps of the interval ran (``StepRecord.num_prefill_tokens``), cache hits excluded, recomputed
    ones after a preemption included, beside the logged count to show the difference.
    """

    end_s: float
    interval_s: float
    num_prompt_tokens: int
    num_generation_tokens: int
    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float | None
    prefix_cache_hit_rate: float
    num_computed_prompt_tokens: int = 0

    def _per_s(self, tokens: int) -> float:
        return tokens / self.interval_s if self.interval_s > 0 else 0.0  # vLLM: 0 for an empty interval

    @property
    def prompt_throughput_tok_s(self) -> float:
        """Logged "Avg prompt throughput": whole prompts of the prefills completed / interval (tok/s)."""
        return self._per_s(self.num_prompt_tokens)

    @property
    def generation_throughput_tok_s(self) -> float:
        """Logged "Avg generation throughput": tokens emitted by all requests / interval (tok/s)."""
        return self._per_s(self.num_generation_tokens)

    @property
    def computed_prompt_throughput_tok_s(self) -> float:
        """Prefill tokens the steps actually ran / interval (tok/s); not part of vLLM's line."""
        return self._per_s(self.num_computed_prompt_tokens)

    @property
    def prompt_to_generation_ratio(self) -> float | None:
        """Logged prompt throughput / logged generation throughput (the article's "136x"); None
        when nothing was generated in the interval."""
        if self.num_generation_tokens == 0:
            return None
        return self.num_prompt_tokens / self.num_generation_tokens

    def line(self, engine_index: int = 0) -> str:
        """The line vLLM's ``LoggingStatLogger.log`` prints for these figures, in its wording."""
        return LINE_FORMAT % (
            engine_index,
            self.prompt_throughput_tok_s,
            self.generation_throughput_tok_s,
            self.num_running_reqs,
            self.num_waiting_reqs,
            100 * (self.kv_cache_usage or 0.0),
            100 * self.prefix_cache_hit_rate,
        )

    @classmethod
    def from_dict(cls, d: dict) -> LoggedStats:
        """Back from ``to_dict`` (its derived keys ignored)."""
        return cls(**{f.name: d[f.name] for f in fields(cls)})

    def to_dict(self) -> dict:
        """The fields, the three throughputs and the ratio: JSON-serializable."""
        return asdict(self) | {
            "prompt_throughput_tok_s": self.prompt_throughput_tok_s,
            "generation_throughput_tok_s": self.generation_throughput_tok_s,
            "computed_prompt_throughput_tok_s": self.computed_prompt_throughput_tok_s,
            "prompt_to_generation_ratio": self.prompt_to_generation_ratio,
        }


def emission_tokens(out: RequestOutput, index: int = -1) -> tuple[float, int, int]:
    """Emission ``index`` of a request, as vLLM's ``IterationStats.update_from_output`` counts it:
    ``(time_s, prompt tokens, generation tokens)``. The first emission completes the prefill and
    brings the whole prompt (cache hits included); every emission brings the tokens it carried.
    Raises ``IndexError`` for a request without that emission."""
    emissions = out.times.emissions
    time_s, num_tokens = emissions[index]
    first = index == 0 or index == -len(emissions)
    return time_s, len(out.prompt_token_ids) if first else 0, num_tokens


class _HitRateWindow:
    """vLLM's ``CachingMetrics``: tokens hit / tokens queried over the most recent requests."""

    def __init__(self, max_recent_requests: int):
        self.max_recent_requests = max_recent_requests
        self.batches: deque[tuple[int, int, int]] = deque()  # (requests, queries, hits) per step
        self.requests = self.queries = self.hits = 0

    def observe(self, lookups: Sequence[tuple[int, int]]) -> None:
        if not lookups:  # vLLM never appends an empty batch (it would push real ones out)
            return
        batch = (len(lookups), sum(q for q, _ in lookups), sum(h for _, h in lookups))
        self.batches.append(batch)
        self.requests, self.queries, self.hits = (
            a + b for a, b in zip((self.requests, self.queries, self.hits), batch)
        )
        while len(self.batches) > 1 and self.requests > self.max_recent_requests:  # the newest batch stays
            old = self.batches.popleft()
            self.requests, self.queries, self.hits = (
                a - b for a, b in zip((self.requests, self.queries, self.hits), old)
            )

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class StatLogger:
    """vLLM's ``LoggingStatLogger`` over minieng's records: accumulates, then ``log`` closes an interval.

    Args:
        start_s: the engine-clock time the first interval starts (vLLM: the logger's creation).
        num_blocks: the KV pool's blocks, for the KV cache usage (None: usage unknown).
        max_recent_requests: the hit rate's window, in requests (vLLM: 1,000).
    Feed it every step in order (``record``), then call ``log(now_s)`` at each interval's end.
    Raises ``ValueError`` for ``num_blocks`` or ``max_recent_requests`` under 1.
    """

    def __init__(self, start_s: float, num_blocks: int | None = None, max_recent_requests: int = MAX_RECENT_REQUESTS):
        if num_blocks is not None and num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1 (or None when unknown)")
        if max_recent_requests < 1:
            raise ValueError(f"max_recent_requests={max_recent_requests} must be >= 1")
        self.num_blocks = num_blocks
        self.last_log_s = start_s
        self._window = _HitRateWindow(max_recent_requests)
        self._last_step: StepRecord | None = None
        self._prompt = self._generation = self._computed = 0
        self._last_tok_s = (0.0, 0.0)  # the previous line's throughputs (vLLM's idle rule)
        self.idle = True  # the last log and the one before it counted no token (vLLM logs those at DEBUG)

    def record_step(self, step: StepRecord) -> None:
        """A step's scheduler snapshot (running, waiting, used blocks), prefix-cache lookups and
        computed prefill tokens (``StepRecord`` fields)."""
        self._last_step = step
        self._window.observe(step.prefix_cache_lookups)
        self._computed += step.num_prefill_tokens

    def record_tokens(self, num_prompt_tokens: int, num_generation_tokens: int) -> None:
        """Tokens counted by one emission (``emission_tokens``)."""
        self._prompt += num_prompt_tokens
        self._generation += num_generation_tokens

    def record(self, step: StepRecord, outputs: Iterable[RequestOutput]) -> None:
        """One step of a running engine: its record and the outputs it returned (each output's
        latest emission is this step's)."""
        self.record_step(step)
        for out in outputs:
            self.record_tokens(*emission_tokens(out)[1:])

    def log(self, now_s: float) -> LoggedStats:
        """Close the interval ``(last log, now_s]``: its figures, counters reset (vLLM's ``log``)."""
        step = self._last_step
        usage = None
        if self.num_blocks:  # before any step, nothing is used
            usage = step.num_used_blocks / self.num_blocks if step is not None else 0.0
        stats = LoggedStats(
            end_s=now_s,
            interval_s=now_s - self.last_log_s,
            num_prompt_tokens=self._prompt,
            num_generation_tokens=self._generation,
            num_running_reqs=step.num_running if step else 0,
            num_waiting_reqs=step.num_waiting if step else 0,
            kv_cache_usage=usage,
            prefix_cache_hit_rate=self._window.hit_rate,
            num_computed_prompt_tokens=self._computed,
        )
        tok_s = (stats.prompt_throughput_tok_s, stats.generation_throughput_tok_s)
        self.idle = not any(tok_s + self._last_tok_s)
        self._last_tok_s = tok_s
        self.last_log_s = now_s
        self._prompt = self._generation = self._computed = 0
        return stats


def logged_intervals(
    step_records: Sequence[StepRecord],
    outputs: Iterable[RequestOutput],
    interval_s: float = DEFAULT_LOG_INTERVAL_S,
    start_s: float | None = None,
    end_s: float | None = None,
    num_blocks: int | None = None,
    max_recent_requests: int = MAX_RECENT_REQUESTS,
) -> list[LoggedStats]:
    """The lines vLLM's logger would print over a finished run, one every ``interval_s`` seconds.

    Args:
        step_records: the run's steps, in order (``engine.step_records[first:]``).
        outputs: the final ``RequestOutput`` of every request of the run (their ``times.emissions``
            and prompt lengths give the token counts).
        interval_s: seconds between two logs; ``math.inf``: one interval over the whole run.
        start_s: when the first interval starts (default: the first step's start).
        end_s: the last log, closing a last, shorter interval, as a log forced at shutdown would
            (default: the run's last step or emission). vLLM's next periodic log would divide the
            same tokens by a whole interval instead.
        num_blocks: the KV pool's blocks (``engine.block_manager.num_blocks``), for the KV usage.
    Returns:
        one ``LoggedStats`` per interval, in time order; an event at a log's time counts in the
        interval that log closes. Empty for a run without steps or emissions.
    Raises:
        ValueError: ``interval_s`` not > 0; an event before ``start_s`` or after ``end_s``.
    """
    if not interval_s > 0:
        raise ValueError(f"interval_s={interval_s!r} must be > 0 (math.inf: one interval)")
    steps = [(s.start_s + s.duration_s, 0, s) for s in step_records]
    emitted = [emission_tokens(out, i) for out in outputs for i in range(len(out.times.emissions))]
    events = sorted(steps + [(t, 1, counts) for t, *counts in emitted], key=lambda e: (e[0], e[1]))
    if not events:
        return []
    if start_s is None:
        start_s = step_records[0].start_s if step_records else events[0][0]
    end_s = events[-1][0] if end_s is None else end_s
    if events[0][0] < start_s or events[-1][0] > end_s:
        raise ValueError(
            f"the run's events span {events[0][0]!r}..{events[-1][0]!r} s, outside start_s={start_s!r}, end_s={end_s!r}"
        )
    logger = StatLogger(start_s, num_blocks, max_recent_requests)
    lines: list[LoggedStats] = []

    def log_until(time_s: float) -> None:
        """Log every periodic boundary before ``time_s`` and before the last log, ``end_s`` (a
        boundary within a nanosecond of it, rounding's, is that last log)."""
        while (boundary := start_s + (len(lines) + 1) * interval_s) < min(time_s, end_s - 1e-9):
            lines.append(logger.log(boundary))

    for time_s, kind, payload in events:
        log_until(time_s)
        if kind == 0:
            logger.record_step(payload)
        else:
            logger.record_tokens(*payload)
    log_until(end_s)
    lines.append(logger.log(end_s))
    return lines
