"""The server's Prometheus metrics (``GET /metrics``): vLLM's ``vllm:`` metrics under minieng's prefix.

``ServerMetrics`` follows vLLM's ``PrometheusStatLogger`` (``vllm/v1/metrics/loggers.py``), fed as
vLLM's ``IterationStats`` and ``FinishedRequestStats`` are (``vllm/v1/metrics/stats.py``), from the
records minieng's engine already leaves: each step's ``StepRecord`` (scheduler counts, used blocks,
preemptions, prefix-cache lookups) and each request's ``RequestOutput.times`` (arrival, first
scheduling, every emission, the finish). Same names with ``minieng:`` for ``vllm:``, the same
meaning, buckets and labels (``model_name``, ``engine``); prometheus_client adds ``_total`` to
counters, as in vLLM's output.

Per step (``record_step``): the gauges ``num_requests_running``, ``num_requests_waiting`` and
``kv_cache_usage_perc`` (used blocks / all blocks, a cached block no request holds being free, as
vLLM's block pool counts it); the counters ``num_preemptions``, ``prefix_cache_queries`` and
``prefix_cache_hits`` (prompt tokens looked up at a request's first admission, and those the cache
served: ``StepRecord.prefix_cache_lookups``); ``prompt_tokens`` (a request's whole prompt, cache hits
included, counted when its first token comes, as vLLM counts it) and ``generation_tokens``; the
histograms ``time_to_first_token_seconds`` (first emission - arrival) and
``inter_token_latency_seconds`` (each gap between two emissions; a step emitting several tokens,
speculative decoding, is one gap).

Per finished request (``record_finished``, aborted ones included): ``request_success`` by
``finished_reason`` (``stop``, ``length``, ``abort``: each present from 0); ``e2e_request_latency_seconds`` (finish -
arrival), ``request_queue_time_seconds`` (first scheduled - arrival), ``request_prefill_time_seconds``
(first token - first scheduled), ``request_decode_time_seconds`` (last token - first token),
``request_inference_time_seconds`` (last token - first scheduled),
``request_time_per_output_token_seconds`` (TPOT: decode time / (tokens - 1)),
``request_prompt_tokens`` and ``request_generation_tokens``. One difference from vLLM: a request
with fewer than two tokens has no TPOT (docs/architecture.md's definition, ``measure.metrics``),
where vLLM observes 0; and a request with no token observes none of the phases that need one.

All times are ``engine.clock()`` seconds (``time.perf_counter`` by default). Each app has a
``CollectorRegistry`` of its own (``registry``), so several servers live in one process.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from minieng.core.outputs import RequestOutput, StepRecord

PREFIX = "minieng:"
FINISH_REASONS = ("stop", "length", "abort")  # vLLM's FinishReason values, each counted from 0

# vLLM's buckets (vllm/v1/metrics/loggers.py), in seconds.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's ``build_1_2_5_buckets``, for token counts)."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class ServerMetrics:
    """vLLM's Prometheus metrics over one engine's records, in a registry of their own.

    Args:
        model_name: the served model's name (the ``model_name`` label).
        max_model_len: the context, in tokens (the token-count histograms' top bucket).
        num_blocks: the KV pool's blocks (``engine.block_manager.num_blocks``), >= 1.
        block_size: tokens per block, shown in ``minieng:cache_config_info`` (vLLM's info gauge).
    Feed it every step in order (``record_step``) and every finished request once
    (``record_finished``); ``render()`` is what ``GET /metrics`` answers.
    Raises ``ValueError`` for ``num_blocks`` or ``max_model_len`` under 1.
    """

    def __init__(self, model_name: str, max_model_len: int, num_blocks: int, block_size: int | None = None):
        if num_blocks < 1 or max_model_len < 1:
            raise ValueError(f"num_blocks={num_blocks} and max_model_len={max_model_len} must be >= 1")
        self.num_blocks = num_blocks
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}
        self._emissions_seen: dict[str, int] = {}  # request id -> emissions already observed

        def metric(kind, name: str, doc: str, extra_labels: tuple[str, ...] = (), **kwargs):
            m = kind(PREFIX + name, doc, [*labels, *extra_labels], registry=self.registry, **kwargs)
            return m if extra_labels else m.labels(**labels)

        self.running = metric(Gauge, "num_requests_running", "Number of requests in model execution batches.")
        self.waiting = metric(Gauge, "num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_cache_usage = metric(Gauge, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_cache_queries = metric(
            Counter, "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_cache_hits = metric(
            Counter, "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = metric(Counter, "num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = metric(Counter, "prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = metric(Counter, "generation_tokens", "Number of generation tokens processed.")
        self._success = metric(
            Counter, "request_success", "Count of successfully processed requests.", extra_labels=("finished_reason",)
        )
        self._labels = labels
        for reason in FINISH_REASONS:  # each shown from 0, as vLLM creates one per FinishReason
            self._success.labels(**labels, finished_reason=reason)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = metric(
            Histogram, "request_prompt_tokens", "Number of prefill tokens processed.", buckets=token_buckets
        )
        self.request_generation_tokens = metric(
            Histogram, "request_generation_tokens", "Number of generation tokens processed.", buckets=token_buckets
        )
        self.ttft = metric(
            Histogram,
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            buckets=TTFT_BUCKETS_S,
        )
        self.itl = metric(
            Histogram,
            "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            buckets=TOKEN_LATENCY_BUCKETS_S,
        )
        self.tpot = metric(
            Histogram,
            "request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            buckets=TOKEN_LATENCY_BUCKETS_S,
        )
        self.e2e = metric(
            Histogram,
            "e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            buckets=REQUEST_LATENCY_BUCKETS_S,
        )
        phases = {
            "queue": "Histogram of time spent in WAITING phase for request.",
            "prefill": "Histogram of time spent in PREFILL phase for request.",
            "decode": "Histogram of time spent in DECODE phase for request.",
            "inference": "Histogram of time spent in RUNNING phase for request.",
        }
        self.phase = {
            name: metric(Histogram, f"request_{name}_time_seconds", doc, buckets=REQUEST_LATENCY_BUCKETS_S)
            for name, doc in phases.items()
        }
        info = Gauge(
            PREFIX + "cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["engine", "block_size", "num_gpu_blocks"],
            registry=self.registry,
        )
        info.labels(engine="0", block_size=str(block_size or ""), num_gpu_blocks=str(num_blocks)).set(1)

    def record_scheduler(self, num_running: int, num_waiting: int, num_used_blocks: int) -> None:
        """The scheduler's gauges: requests running and waiting, KV blocks in use."""
        self.running.set(num_running)
        self.waiting.set(num_waiting)
        self.kv_cache_usage.set(num_used_blocks / self.num_blocks)

    def record_step(self, step: StepRecord, outputs: Iterable[RequestOutput]) -> None:
        """One engine step: its record and the outputs it returned (vLLM's ``record`` with the
        step's ``SchedulerStats`` and ``IterationStats``)."""
        self.record_scheduler(step.num_running, step.num_waiting, step.num_used_blocks)
        self.preemptions.inc(step.num_preempted)
        self.prefix_cache_queries.inc(sum(q for q, _ in step.prefix_cache_lookups))
        self.prefix_cache_hits.inc(sum(h for _, h in step.prefix_cache_lookups))
        for out in outputs:
            self._observe_emissions(out)

    def _observe_emissions(self, out: RequestOutput) -> None:
        """The emissions of ``out`` not yet observed: tokens, TTFT for the first, ITL for the others."""
        emissions, times = out.times.emissions, out.times
        seen = self._emissions_seen.get(out.request_id, 0)
        for i in range(seen, len(emissions)):
            time_s, num_tokens = emissions[i]
            if i == 0:
                self.prompt_tokens.inc(len(out.prompt_token_ids))
                self.ttft.observe(time_s - times.arrival_s)
            else:
                self.itl.observe(time_s - emissions[i - 1][0])
            self.generation_tokens.inc(num_tokens)
        self._emissions_seen[out.request_id] = len(emissions)

    def record_finished(self, out: RequestOutput) -> None:
        """A request that finished or was aborted (its final output), observed once."""
        self._observe_emissions(out)
        self._emissions_seen.pop(out.request_id, None)
        t = out.times
        self._success.labels(**self._labels, finished_reason=str(out.finish_reason)).inc()
        emissions = t.emissions
        end_s = t.finished_s if t.finished_s is not None else (emissions[-1][0] if emissions else t.arrival_s)
        self.e2e.observe(end_s - t.arrival_s)
        self.request_prompt_tokens.observe(len(out.prompt_token_ids))
        self.request_generation_tokens.observe(len(out.token_ids))
        if t.first_scheduled_s is not None:
            self.phase["queue"].observe(t.first_scheduled_s - t.arrival_s)
        if not emissions:
            return
        first_s, last_s = emissions[0][0], emissions[-1][0]
        if t.first_scheduled_s is not None:
            self.phase["prefill"].observe(first_s - t.first_scheduled_s)
            self.phase["inference"].observe(last_s - t.first_scheduled_s)
        self.phase["decode"].observe(last_s - first_s)
        num_tokens = sum(n for _, n in emissions)
        if num_tokens >= 2:
            self.tpot.observe((last_s - first_s) / (num_tokens - 1))

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The registry's text and its content type, in the format the ``Accept`` header asks for:
        Prometheus' text format 0.0.4 by default, OpenMetrics when asked (prometheus_client's
        ``choose_encoder``, as its own ASGI app negotiates)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
