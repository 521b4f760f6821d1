"""One engine driven from an asyncio event loop: the server's engine loop (``server.py`` serves HTTP
over it).

Between steps the loop queues the requests handlers submitted and aborts the ones whose clients
left; then it runs ``engine.step()`` in a thread of its own, so the event loop keeps accepting
connections and writing streams while the model computes, and puts each step's outputs on
per-request queues without waiting. With nothing to run (no request, or a static batch filling)
it sleeps until a request arrives or the batch's timeout.

Every ``log_interval_s`` seconds it logs vLLM's stats line (``measure.logged_throughput``: prompt
and generation throughput as vLLM's ``LoggingStatLogger`` counts them, running and waiting requests,
KV cache usage, prefix cache hit rate) through the ``logging`` logger of this module, at INFO (DEBUG
while the server stays idle, as vLLM does), and keeps each line's figures (``logged``). With a
``ServerMetrics`` it also feeds the Prometheus metrics every step and every finished request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.core.outputs import RequestOutput, StepRecord
from minieng.measure.logged_throughput import DEFAULT_LOG_INTERVAL_S, LoggedStats, StatLogger
from minieng.serve.metrics import ServerMetrics

logger = logging.getLogger(__name__)

# Step records the server keeps (for engine-side figures of recent traffic); older ones are dropped.
MAX_STEP_RECORDS = 10_000
MAX_LOGGED = 1_000  # stats lines whose figures AsyncEngine.logged keeps (the newest)


def new_request_id(prefix: str = "cmpl") -> str:
    """A fresh id, ``prefix``-hex, as OpenAI's ``cmpl-`` and ``chatcmpl-``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def check_log_interval(log_interval_s: float | None) -> None:
    """Raise ``ValueError`` unless ``log_interval_s`` is None or >= 0 seconds."""
    if log_interval_s is not None and not log_interval_s >= 0:
        raise ValueError(f"log_interval_s={log_interval_s!r} must be >= 0 (0 or None: no stats logged)")


class EngineStepError(RuntimeError):
    """An engine step raised: the requests in flight then get this on their queue instead of an
    output (the server answers a 500, or an error event in a stream), and the loop goes on."""


class AsyncEngine:
    """Drives one ``LLMEngine`` from an asyncio event loop.

    Args:
        engine: the engine; nothing else may call it while the loop runs.
        on_finished: called (on the event loop) with the final ``RequestOutput`` of every request
            that finished or was aborted, before the engine forgets it: the engine-side record
            of each request's timestamps.
        log_interval_s: seconds between two stats lines (vLLM's ``VLLM_LOG_STATS_INTERVAL``, 10 s);
            None or 0: no stats logged. ``stat_logger`` holds the counts of the current interval,
            ``logged`` the figures of the most recent ``MAX_LOGGED`` lines (``LoggedStats``).
        metrics: the Prometheus metrics to feed (``ServerMetrics``), or None.
    Raises ``ValueError`` for a negative ``log_interval_s``.
    """

    def __init__(
        self,
        engine: LLMEngine,
        on_finished: Callable[[RequestOutput], None] | None = None,
        log_interval_s: float | None = DEFAULT_LOG_INTERVAL_S,
        metrics: ServerMetrics | None = None,
    ):
        check_log_interval(log_interval_s)
        self.engine = engine
        self.on_finished = on_finished
        self.metrics = metrics
        self.log_interval_s = log_interval_s or None
        self.stat_logger: StatLogger | None = None
        self.logged: deque[LoggedStats] = deque(maxlen=MAX_LOGGED)
        self._log_task: asyncio.Task | None = None
        self._submitted: list[tuple[str, list[int], SamplingParams, float]] = []
        self._aborts: set[str] = set()
        self._queues: dict[str, asyncio.Queue] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        # Steps run in a thread of their own: the default pool is where handlers tokenize.
        self._stepper: ThreadPoolExecutor | None = None
        self.num_aborted = 0

    def start(self) -> None:
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._stepper = ThreadPoolExecutor(1, thread_name_prefix="minieng-step")
            self._task = loop.create_task(self._run(), name="minieng-engine-loop")
            if self.log_interval_s:
                self.stat_logger = StatLogger(self.engine.clock(), self.engine.block_manager.num_blocks)
                self._log_task = loop.create_task(self._log_stats(), name="minieng-log-stats")

    async def stop(self) -> None:
        for task in (self._log_task, self._task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if self._task is not None:
            self._task = self._log_task = None
            self._stepper.shutdown(wait=False)

    async def _log_stats(self) -> None:
        """Every ``log_interval_s``: close the stats interval and log vLLM's line (vLLM's API server
        runs the same loop, ``_force_log``)."""
        while True:
            await asyncio.sleep(self.log_interval_s)
            stats = self.stat_logger.log(self.engine.clock())
            self.logged.append(stats)
            logger.log(logging.DEBUG if self.stat_logger.idle else logging.INFO, stats.line())

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        arrival_s: float,
        request_id: str | None = None,
        queue: asyncio.Queue | None = None,
    ) -> tuple[str, asyncio.Queue]:
        """Queue an already validated request; returns its id (``request_id``, default
        ``new_request_id()``; it must be unused) and the queue its outputs arrive on (``queue``,
        default a new one: several requests may share one, each output naming its request)."""
        request_id = request_id or new_request_id()
        queue = asyncio.Queue() if queue is None else queue
        self._queues[request_id] = queue
        self._submitted.append((request_id, prompt_ids, params, arrival_s))
        self._wake.set()
        return request_id, queue

    def abort(self, request_id: str) -> None:
        """Abort a request (its client left); done before the next step. A no-op once it finished."""
        if request_id in self._queues:
            self._aborts.add(request_id)
            self._wake.set()

    def _between_steps(self) -> None:
        engine = self.engine
        for request_id, ids, params, arrival_s in self._submitted:
            engine.add_request(ids, params, request_id=request_id, arrival_s=arrival_s)
        self._submitted.clear()
        aborted = False
        for request_id in self._aborts:
            if request_id in engine.requests:
                engine.abort_request(request_id)
                self.num_aborted += 1
                aborted = True
                self._finish(engine.output(request_id))
        self._aborts.clear()
        if aborted and self.metrics is not None:  # no step may follow: the gauges as the aborts left them
            scheduler = engine.scheduler
            self.metrics.record_scheduler(
                len(scheduler.running), len(scheduler.waiting), engine.block_manager.num_used_blocks
            )
        if len(engine.step_records) > MAX_STEP_RECORDS:
            del engine.step_records[:-MAX_STEP_RECORDS]
            del engine.spec_records[:-MAX_STEP_RECORDS]

    def _fail_in_flight(self, error: EngineStepError) -> None:
        """Every request submitted or running fails with ``error``: its queue gets the error (the
        handler answers it), and the engine aborts and forgets it, freeing its blocks."""
        engine = self.engine
        self._submitted.clear()
        for request_id, queue in self._queues.items():
            queue.put_nowait(error)
            if request_id in engine.requests:
                engine.abort_request(request_id)
                engine.release_request(request_id)
        self.num_aborted += len(self._queues)
        self._queues.clear()

    def _finish(self, out: RequestOutput) -> None:
        self.engine.release_request(out.request_id)
        self._queues.pop(out.request_id, None)
        if self.metrics is not None:
            self.metrics.record_finished(out)
        if self.on_finished is not None:
            self.on_finished(out)

    def _record_step(self, step: StepRecord, outputs: list[RequestOutput]) -> None:
        """Feed the stats line and the metrics one step. A prompt scored without generating
        (``max_tokens=0``, ``echo``) finishes with no emission, so neither counts it as an emission;
        its prompt tokens are counted here, as vLLM counts the prompt of a request (which runs one
        token for it)."""
        emitted = [out for out in outputs if out.times.emissions]
        scored = [len(out.prompt_token_ids) for out in outputs if not out.times.emissions and out.finished]
        if self.stat_logger is not None:
            self.stat_logger.record(step, emitted)
            for num_tokens in scored:
                self.stat_logger.record_tokens(num_tokens, 0)
        if self.metrics is not None:
            self.metrics.record_step(step, emitted)
            if scored:
                self.metrics.prompt_tokens.inc(sum(scored))

    async def _run(self) -> None:
        engine, loop = self.engine, asyncio.get_running_loop()
        while True:
            self._between_steps()
            # Nothing to run (no request, or a static batch filling): sleep until a request is
            # submitted or aborted, or the batch's timeout, never stepping for nothing.
            wait_s = engine.idle_wait_s()
            if wait_s > 0:
                self._wake.clear()
                if not self._submitted and not self._aborts:
                    try:
                        await asyncio.wait_for(self._wake.wait(), None if math.isinf(wait_s) else wait_s)
                    except asyncio.TimeoutError:
                        pass
                continue
            num_steps = len(engine.step_records)
            try:
                outputs = await loop.run_in_executor(self._stepper, engine.step)
            except Exception as e:  # noqa: BLE001 (the loop outlives a failed step; its requests do not)
                logger.exception("an engine step failed: the requests in flight fail with it")
                self._fail_in_flight(EngineStepError(f"the engine step failed ({type(e).__name__}: {e})"))
                continue
            if len(engine.step_records) > num_steps:  # a step ran
                self._record_step(engine.step_records[-1], outputs)
            for out in outputs:
                queue = self._queues.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)
                if out.finished:
                    self._finish(out)
