"""Drive the engine in real time through a workload, as a server would see it.

Requests are added when their arrival time comes (not all up front), so queueing shows up in
TTFT exactly as it would behind an API; between arrivals the engine steps whatever it has, and
sleeps when it has nothing. The result keeps everything the metrics and figures need: each
request's output with its timestamps, the engine's step records for the run, and telemetry
samples when a sampler is given.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.core.outputs import RequestOutput, StepRecord
from minieng.measure.metrics import serving_metrics
from minieng.measure.nvml import TelemetrySampler, summarize
from minieng.measure.roofline import phase_utilization
from minieng.measure.workloads import RequestSpec, workload_prompts


@dataclass
class WorkloadResult:
    """One run. Times are ``time.perf_counter()`` seconds; ``start_s`` is the run's t = 0."""

    start_s: float
    duration_s: float
    outputs: list[RequestOutput]  # of the requests that arrived, in the order of the specs
    steps: list[StepRecord]
    telemetry: list = field(default_factory=list)
    num_not_arrived: int = 0  # requests whose arrival came after a timeout (never sent)


def run_workload(
    engine: LLMEngine,
    specs: list[RequestSpec],
    prompts: list[list[int]] | None = None,
    params: Callable[[RequestSpec], SamplingParams] | None = None,
    sampler=None,
    timeout_s: float | None = None,
    progress: bool = False,
) -> WorkloadResult:
    """Replay ``specs`` against ``engine`` in real time.

    Args:
        specs: arrivals (s after start) and sizes; outputs are forced to ``output_tokens``
            (``ignore_eos``) unless ``params`` says otherwise.
        prompts: token ids per spec (default: real text of each spec's length).
        params: SamplingParams per spec (default: greedy, ``max_tokens=output_tokens``, ignore_eos).
        sampler: optional telemetry sampler (a context manager with a ``samples`` list).
        timeout_s: stop after this long: unfinished requests are aborted (they count as failed).
    Returns:
        a ``WorkloadResult`` whose ``outputs`` follow the order of ``specs``; requests still
        running at the timeout are aborted (failed), those not yet arrived are counted in
        ``num_not_arrived``.
    """
    prompts = prompts if prompts is not None else workload_prompts(engine.tokenizer, specs)
    params = params or (lambda s: SamplingParams.fixed_length(s.output_tokens))
    order = sorted(range(len(specs)), key=lambda i: specs[i].arrival_s)
    ids: list[str | None] = [None] * len(specs)
    first_step = len(engine.step_records)
    bar = tqdm(total=len(specs), desc="requests", unit="req", disable=not progress)
    ctx = sampler if sampler is not None else _Null()
    with ctx:
        start = time.perf_counter()
        nxt, done = 0, 0
        while done < len(specs):
            now = time.perf_counter()
            while nxt < len(order) and start + specs[order[nxt]].arrival_s <= now:
                i = order[nxt]
                ids[i] = engine.add_request(prompts[i], params(specs[i]), arrival_s=start + specs[i].arrival_s)
                nxt += 1
            if timeout_s is not None and now - start > timeout_s:
                for rid in ids:
                    if rid is not None:
                        engine.abort_request(rid)
                break
            idle_s = engine.idle_wait_s()  # 0: a step can run now; inf: nothing unfinished
            if idle_s == 0:
                finished = sum(out.finished for out in engine.step())
                done += finished
                bar.update(finished)
            else:  # nothing to run before the next arrival, or a static batch's deadline: sleep until then
                wake = start + specs[order[nxt]].arrival_s if nxt < len(order) else math.inf
                wake = min(wake, time.perf_counter() + idle_s)
                if timeout_s is not None:
                    wake = min(wake, start + timeout_s)
                if wake == math.inf:  # a static batch that can never fill (infinite timeout, no more arrivals)
                    for rid in ids:
                        if rid is not None:
                            engine.abort_request(rid)
                    raise ValueError(
                        "the static batch can never fill: no more requests arrive and "
                        "batch_timeout_s is infinite; give a finite batch_timeout_s"
                    )
                time.sleep(max(0.0, wake - time.perf_counter()))
        duration = time.perf_counter() - start
    bar.close()
    outputs = [engine.output(rid) for rid in ids if rid is not None]
    return WorkloadResult(
        start,
        duration,
        outputs,
        engine.step_records[first_step:],
        list(getattr(sampler, "samples", [])),
        len(specs) - len(outputs),
    )


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def serving_report(result: WorkloadResult, model_config, dtype_bytes: float, peaks, slo=None) -> dict:
    """Metrics of a run (``metrics.serving_metrics``), MFU/MBU of its prefill-carrying and its
    decode-only steps, and the telemetry summary: one JSON-serializable dict."""
    prefill_steps = [s for s in result.steps if s.num_prefill_tokens > 0]
    decode_steps = [s for s in result.steps if s.num_prefill_tokens == 0]
    return {
        "metrics": serving_metrics(result.outputs, result.duration_s, slo).to_dict(),
        "steps_with_prefill": phase_utilization(model_config, dtype_bytes, prefill_steps, peaks)
        if prefill_steps
        else None,
        "decode_only_steps": phase_utilization(model_config, dtype_bytes, decode_steps, peaks)
        if decode_steps
        else None,
        "telemetry": summarize(result.telemetry) if result.telemetry else None,
    }


def serving_bench(
    engine: LLMEngine, specs: list[RequestSpec], peaks, slo, workload: str
) -> tuple[dict, WorkloadResult]:
    """The bench's ``--workload`` run: ``specs`` replayed in real time (with NVML telemetry on CUDA),
    the serving report (TTFT/TPOT/ITL/E2EL percentiles, goodput under ``slo``, MFU and MBU against
    ``peaks``) and the workload's totals. Returns the report (JSON-serializable) and the raw run
    (for the figures)."""
    sampler = TelemetrySampler(engine.device) if engine.device.type == "cuda" else None
    run = run_workload(engine, specs, sampler=sampler)
    report = serving_report(run, engine.model_config, engine.dtype.itemsize, peaks, slo)
    report["workload"] = {
        "kind": workload,
        "num_requests": len(specs),
        "prompt_tokens_total": sum(s.prompt_tokens for s in specs),
        "output_tokens_total": sum(s.output_tokens for s in specs),
        "last_arrival_s": max(s.arrival_s for s in specs),
    }
    return report, run
