"""Disaggregated prefill and decode as a measured simulation, and colocated serving in the same one.

What it simulates. Splitwise (Patel et al. 2024) and DistServe (Zhong et al. 2024) run the two
phases on different instances: a prefill instance computes each prompt and its first token,
then the request's KV cache is sent over a link to a decode instance, which batches decodes
only. Three effects follow, and this simulation has each of them:

- phase-specialized instances: each engine is configured for its phase (its own token budget,
  batch cap and KV pool);
- no interference: a decode step never carries a prefill chunk, so inter-token gaps do not
  spike when prompts arrive, and a prefill never waits behind decodes;
- the KV transfer cost: the request's second token cannot come before its prompt's KV has
  crossed the link, ``kv_bytes / link_bandwidth_gbps``, added once, after the first token.

How, on one machine. Every engine is a real ``LLMEngine`` sharing one model's weights, each with
its own KV pool; the K/V blocks really move from the prefill engine's pool to the decode
engine's (``kv_transfer``), so outputs are the colocated engine's, token for token (greedy, up
to the floating-point near-ties any two batchings have). But one device cannot run two engines
at once, so time is simulated: a discrete-event replay in which each engine is a device with a
clock of its own (``VirtualClock``). An engine's step runs for real and is timed for real, and
is placed on its own clock at the moment that device would start it: when it is free and has
work (an arrival, a transfer that has landed, a running request). A transfer goes over one link
per prefill engine, first come first served, and takes ``kv_bytes / bandwidth`` (no latency
term, no overlap with the prefill; Splitwise overlaps it layer by layer, so this is its
pessimistic side). Requests are routed round-robin: arrivals among the engines that prefill,
hand-offs among the decode engines. Per-request timestamps (arrival, first token, transfer start
and end, admission on the decode engine, last token) are in that simulated time, seconds from the
first arrival, and give the same figures as a real run (``metrics``).

What one machine cannot show. Real concurrency (two devices stepping at the same instant, here
interleaved and each timed alone, so neither slows the other through shared memory bandwidth,
caches or the host); network contention beyond one FIFO link per sender, protocol latency,
stragglers; different hardware per phase (Splitwise runs prompts on the newest GPUs and studies
the token phase on older or power-capped ones; here both phases run on this one device, so both
step times are its own); tensor or pipeline parallelism inside an instance and the placement
search DistServe does; and scale: a fleet, many requests per second, long prompts. The link
bandwidth is an assumption for the user to set, not a measurement.

A disaggregated pair uses two devices: compare it with as many colocated replicas, per device
(``disaggregation.compare_disaggregation`` does).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter

from minieng.config import SamplingParams
from minieng.wings.parallel.kv_transfer import KVHandoff, admit_prefilled, can_admit, export_prefilled
from minieng.engine.llm_engine import LLMEngine
from minieng.core.outputs import RequestOutput, StepRecord
from minieng.measure.metrics import SLO, ServingMetrics, serving_metrics, summarize_ms
from minieng.measure.workloads import RequestSpec, workload_prompts

# An assumption, for the user to set: PCIe 4.0 x16 carries about 32 GB/s each way. NVLink-class
# links between GPUs of one node are an order of magnitude faster, datacenter networks between
# nodes (e.g. 100-400 Gb/s NICs, 12.5-50 GB/s) of the same order or slower.
DEFAULT_LINK_BANDWIDTH_GBPS = 32.0

COLOCATED, PREFILL, DECODE = "colocated", "prefill", "decode"


class VirtualClock:
    """A device's own clock: ``set(t)``, then the first reading is exactly ``t`` and later readings
    advance with real time (``time.perf_counter``). An engine given it as ``engine.clock`` stamps
    its steps and emissions in simulated time while their durations stay measured."""

    def __init__(self) -> None:
        self._base_s = 0.0
        self._real_s: float | None = None

    def set(self, t_s: float) -> None:
        self._base_s, self._real_s = t_s, None

    def __call__(self) -> float:
        real = time.perf_counter()
        if self._real_s is None:
            self._real_s = real
        return self._base_s + (real - self._real_s)


@dataclass
class Transfer:
    """One KV hand-off in the simulation, times in seconds from the first arrival.

    ``ready_s``: the prefill's first token (its KV is complete); ``start_s``: the link takes it
    (after earlier transfers on the same link); ``end_s = start_s + kv_bytes / bandwidth``;
    ``admitted_s``: the decode engine's step that takes it in (>= ``end_s``: later when the decode
    engine is busy or full).
    """

    request_id: str
    source: int  # index of the prefill engine
    destination: int  # index of the decode engine
    num_tokens: int
    kv_bytes: int
    ready_s: float
    start_s: float
    end_s: float
    admitted_s: float | None = None


@dataclass
class ClusterRun:
    """A replay in the simulation. ``outputs`` follow the order of the specs; their ``times`` are in
    simulated seconds from the first arrival. ``steps[i]`` are engine ``i``'s steps (simulated start times)."""

    name: str
    roles: list[str]
    outputs: list[RequestOutput]
    steps: list[list[StepRecord]]
    transfers: dict[str, Transfer] = field(default_factory=dict)
    homes: dict[str, int] = field(default_factory=dict)  # request id -> engine that finished it
    link_bandwidth_gbps: float | None = None

    @property
    def num_devices(self) -> int:
        return len(self.roles)

    def metrics(self, slo: SLO | None = None) -> ServingMetrics:
        """``metrics.serving_metrics`` of the run (duration: first arrival to last token)."""
        return serving_metrics(self.outputs, None, slo)

    def transfer_summary(self) -> dict:
        """The hand-offs: count, bytes, and per transfer (ms, ``metrics.summarize_ms``) the time on
        the link, the wait for the link (behind earlier transfers) and the wait for the decode
        engine after landing (busy with a step, or full)."""
        ts = list(self.transfers.values())
        return {
            "count": len(ts),
            "total_bytes": sum(t.kv_bytes for t in ts),
            "link_ms": summarize_ms(t.end_s - t.start_s for t in ts),
            "link_wait_ms": summarize_ms(t.start_s - t.ready_s for t in ts),
            "decode_wait_ms": summarize_ms(t.admitted_s - t.end_s for t in ts if t.admitted_s is not None),
        }

    def timeline(self) -> list[dict]:
        """Per request, in spec order: when each phase happened (simulated seconds) and where.

        Keys: ``request_id``, ``arrival_s``, ``first_scheduled_s`` (its prefill began),
        ``first_token_s``, ``last_token_s``, ``prompt_tokens``, ``output_tokens``,
        ``prefill_engine``, ``decode_engine`` (indices into ``roles``), and, for a request handed
        off, ``transfer_ready_s``, ``transfer_start_s``, ``transfer_end_s``, ``decode_admitted_s``,
        ``kv_bytes`` (``None`` otherwise: colocated, or finished at its first token).
        """
        rows = []
        for out in self.outputs:
            t, tr = out.times, self.transfers.get(out.request_id)
            home = self.homes.get(out.request_id)
            rows.append(
                {
                    "request_id": out.request_id,
                    "arrival_s": t.arrival_s,
                    "first_scheduled_s": t.first_scheduled_s,
                    "first_token_s": t.emissions[0][0] if t.emissions else None,
                    "last_token_s": t.emissions[-1][0] if t.emissions else None,
                    "prompt_tokens": len(out.prompt_token_ids),
                    "output_tokens": len(out.token_ids),
                    "prefill_engine": tr.source if tr else home,
                    "decode_engine": tr.destination if tr else home,
                    "transfer_ready_s": tr.ready_s if tr else None,
                    "transfer_start_s": tr.start_s if tr else None,
                    "transfer_end_s": tr.end_s if tr else None,
                    "decode_admitted_s": tr.admitted_s if tr else None,
                    "kv_bytes": tr.kv_bytes if tr else None,
                }
            )
        return rows


@dataclass
class _Engine:
    """An engine as a device of the simulation: its clock, when it is next free, what waits for it."""

    role: str
    engine: LLMEngine
    clock: VirtualClock = field(default_factory=VirtualClock)
    free_s: float = 0.0
    inbox: list = field(default_factory=list)  # (ready_s, spec index or KVHandoff), by ready_s
    link_free_s: float = 0.0  # a prefill engine's outgoing link

    def next_start_s(self) -> float:
        """When this device would start its next step: now if it has requests, else when the next
        item of its inbox is ready; ``inf`` when it has nothing."""
        if self.engine.has_unfinished_requests():
            return self.free_s
        return max(self.free_s, self.inbox[0][0]) if self.inbox else math.inf


def default_params(spec: RequestSpec) -> SamplingParams:
    """Greedy, exactly ``output_tokens`` tokens (``ignore_eos``): as ``replay.run_workload``."""
    return SamplingParams.fixed_length(spec.output_tokens)


def colocated_replay(
    engines: list[LLMEngine],
    specs: list[RequestSpec],
    prompts: list[list[int]] | None = None,
    params: Callable[[RequestSpec], SamplingParams] | None = None,
    name: str = "colocated",
) -> Iterator[None]:
    """Replay ``specs`` in the simulation on ``engines`` as colocated replicas (each prefills and decodes
    its requests; arrivals round-robin), a step at a time: an iterator to give ``interleave``. One
    engine is the simulation's twin of ``run_workload``. Args and Raises: as ``disaggregated_replay``."""
    return _replay(name, [_Engine(COLOCATED, e) for e in engines], specs, prompts, params, None)


def disaggregated_replay(
    prefill_engines: list[LLMEngine],
    decode_engines: list[LLMEngine],
    specs: list[RequestSpec],
    prompts: list[list[int]] | None = None,
    params: Callable[[RequestSpec], SamplingParams] | None = None,
    link_bandwidth_gbps: float = DEFAULT_LINK_BANDWIDTH_GBPS,
    name: str = "disaggregated",
) -> Iterator[None]:
    """Replay ``specs`` in the simulation, a step at a time: an iterator to give ``interleave``. Prefill
    engines take the arrivals (round-robin), compute the prompt and the first token, and hand each
    request with its KV to a decode engine (round-robin) over their link; the decode engines
    generate the rest.

    Args:
        prefill_engines, decode_engines: engines of one model (e.g. ``LLMEngine(config,
            loaded=engine.loaded)``), the same ``block_size`` and dtype, no speculative decoding,
            and no request of their own in flight; each is one device of the simulation.
        specs: arrivals (s from the start) and sizes.
        prompts: token ids per spec (default: real text of each spec's length).
        params: ``SamplingParams`` per spec (default ``default_params``: greedy, ``output_tokens``).
        link_bandwidth_gbps: GB/s (1e9 bytes/s) of each prefill engine's link: an assumption.
    Returns:
        the replay; ``interleave`` drives it to a ``ClusterRun`` (outputs in spec order, steps,
        transfers), times in simulated seconds.
    Raises:
        ValueError: no engine of a role or a bandwidth <= 0 (at once); when driven, an engine with
            requests in flight, or a request an engine refuses (``add_request``,
            ``kv_transfer.admit_prefilled``).
        RuntimeError: when driven, an engine whose KV pool cannot hold a request even when idle.
    """
    if not prefill_engines or not decode_engines:
        raise ValueError("disaggregated serving needs at least one prefill and one decode engine")
    if not link_bandwidth_gbps > 0:
        raise ValueError(f"link_bandwidth_gbps={link_bandwidth_gbps!r} must be > 0 (GB/s)")
    instances = [_Engine(PREFILL, e) for e in prefill_engines] + [_Engine(DECODE, e) for e in decode_engines]
    return _replay(name, instances, specs, prompts, params, link_bandwidth_gbps)


def interleave(replays: list[Iterator[None]]) -> list[ClusterRun]:
    """Drive replays (``colocated_replay``, ``disaggregated_replay``) a step each in turn, so that
    the machine's speed drifting (other work on a shared machine) slows them alike; each keeps its
    own simulated time. Returns their ``ClusterRun``s, in order. A replay that raises stops them all."""
    results: list[ClusterRun | None] = [None] * len(replays)
    live = list(range(len(replays)))
    try:
        while live:
            for i in list(live):
                try:
                    next(replays[i])
                except StopIteration as done:
                    results[i] = done.value
                    live.remove(i)
    finally:
        for replay in replays:
            replay.close()  # one that raised leaves the others' engines on their own clocks
    return results


def _replay(
    name: str, instances: list[_Engine], specs: list[RequestSpec], prompts, params, link_bandwidth_gbps: float | None
) -> Iterator[None]:
    """The discrete-event loop, a generator that yields after each step and returns the
    ``ClusterRun``. Invariant: steps run in the order of their simulated start times, so when an
    engine steps at t, every arrival and every transfer that lands by t is known."""
    if any(x.engine.has_unfinished_requests() for x in instances):
        raise ValueError("the engines must have no request in flight: use fresh engines")
    if len({id(x.engine) for x in instances}) != len(instances):
        raise ValueError("each engine is one device: pass distinct engines")
    prompts = prompts if prompts is not None else workload_prompts(instances[0].engine.tokenizer, specs)
    params = params or default_params
    order = sorted(range(len(specs)), key=lambda i: specs[i].arrival_s)
    entry = [x for x in instances if x.role != DECODE]
    decoders = [k for k, x in enumerate(instances) if x.role == DECODE]
    first_step = [len(x.engine.step_records) for x in instances]
    transfers: dict[str, Transfer] = {}
    homes: dict[str, int] = {}
    routed = sent = 0
    own_clocks = [x.engine.clock for x in instances]
    for x in instances:
        x.engine.clock = x.clock
    try:
        while len(homes) < len(specs):
            start_s, k = min((x.next_start_s(), k) for k, x in enumerate(instances))
            if routed < len(order) and specs[order[routed]].arrival_s <= start_s:
                i = order[routed]
                _post(entry[routed % len(entry)], specs[i].arrival_s, i)
                routed += 1
                continue
            if start_s == math.inf:
                raise RuntimeError("no engine has work left but requests are unfinished (a bug in the simulation)")
            x = instances[k]
            _deliver(x, start_s, specs, prompts, params, transfers)
            x.clock.set(start_s)
            steps_before = len(x.engine.step_records)
            outputs = x.engine.step()
            x.free_s = x.clock()
            if len(x.engine.step_records) == steps_before:
                raise RuntimeError(
                    f"{x.role} engine {k} has work but could not schedule a step at t={start_s:.3f} s: "
                    "its KV pool is too small for the request waiting (raise num_kv_blocks)"
                )
            for out in outputs:
                if out.finished:
                    homes[out.request_id] = k
                elif x.role == PREFILL:  # its first token is out: off to a decode engine
                    handoff = export_prefilled(x.engine, out.request_id)
                    ready = out.times.emissions[-1][0]
                    begin = max(ready, x.link_free_s)
                    x.link_free_s = end = begin + handoff.kv_bytes / (link_bandwidth_gbps * 1e9)
                    dest = decoders[sent % len(decoders)]
                    sent += 1
                    transfers[out.request_id] = Transfer(
                        out.request_id, k, dest, handoff.num_computed_tokens, handoff.kv_bytes, ready, begin, end
                    )
                    _post(instances[dest], end, handoff)
            yield
    finally:
        for x, clock in zip(instances, own_clocks):
            x.engine.clock = clock
    ids = [_request_id(i) for i in range(len(specs))]
    return ClusterRun(
        name,
        [x.role for x in instances],
        [instances[homes[r]].engine.output(r) for r in ids],
        [x.engine.step_records[n:] for x, n in zip(instances, first_step)],
        transfers,
        homes,
        link_bandwidth_gbps,
    )


def _request_id(i: int) -> str:
    return f"req-{i}"


def _post(x: _Engine, ready_s: float, item) -> None:
    x.inbox.append((ready_s, item))
    x.inbox.sort(key=itemgetter(0))  # stable: equal times keep their order


def _deliver(x: _Engine, now_s: float, specs, prompts, params, transfers: dict[str, Transfer]) -> None:
    """Hand ``x`` what is ready by ``now_s``, in order: arrivals are queued; a hand-off is admitted
    if it fits now, else it and everything behind it wait for a later step (first come, first served)."""
    while x.inbox and x.inbox[0][0] <= now_s:
        item = x.inbox[0][1]
        if isinstance(item, KVHandoff):
            if not can_admit(x.engine, item):
                break
            admit_prefilled(x.engine, item)
            transfers[item.request_id].admitted_s = now_s
        else:
            x.engine.add_request(
                prompts[item], params(specs[item]), request_id=_request_id(item), arrival_s=specs[item].arrival_s
            )
        x.inbox.pop(0)
