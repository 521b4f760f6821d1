"""Disaggregated prefill and decode as a measured model, against colocated serving (claim S9).

What it models. Splitwise (Patel et al. 2024) and DistServe (Zhong et al. 2024) run the two
phases on different instances: a prefill instance computes each prompt and its first token,
then the request's KV cache is sent over a link to a decode instance, which batches decodes
only. Three effects follow, and this model has each of them:

- phase-specialized instances: each engine is configured for its phase (its own token budget,
  batch cap and KV pool: ``prefill_overrides``, ``decode_overrides``);
- no interference: a decode step never carries a prefill chunk, so inter-token gaps do not
  spike when prompts arrive, and a prefill never waits behind decodes;
- the KV transfer cost: the request's second token cannot come before its prompt's KV has
  crossed the link, ``kv_bytes / link_bandwidth_gbps``, added once, after the first token.

How, on one machine. Every engine is a real ``LLMEngine`` sharing one model's weights, each with
its own KV pool; the K/V blocks really move from the prefill engine's pool to the decode
engine's (``kv_transfer``), so outputs are the colocated engine's, token for token (greedy, up
to the floating-point near-ties any two batchings have). But one
device cannot run two engines at once, so time is modelled: a discrete-event replay in which each
engine is a device with a clock of its own (``VirtualClock``). An engine's step runs for real and
is timed for real, and is placed on its own clock at the moment that device would start it: when
it is free and has work (an arrival, a transfer that has landed, a running request). A transfer
goes over one link per prefill engine, first come first served, and takes ``kv_bytes /
bandwidth`` (no latency term, no overlap with the prefill; Splitwise overlaps it layer by layer,
so this is its pessimistic side). Requests are routed round-robin: arrivals among the engines that
prefill, hand-offs among the decode engines. Per-request timestamps (arrival, first token,
transfer start and end, admission on the decode engine, last token) are in that model's time,
seconds from the first arrival, and give the same figures as a real run (``metrics``).

What one machine cannot show. Real concurrency (two devices stepping at the same instant, here
interleaved and each timed alone, so neither slows the other through shared memory bandwidth,
caches or the host); network contention beyond one FIFO link per sender, protocol latency,
stragglers; different hardware per phase (Splitwise runs prompts on the newest GPUs and studies
the token phase on older or power-capped ones; here both phases run on this one device, so both
step times are its own); tensor or pipeline parallelism inside an instance and the placement
search DistServe does; and scale: a fleet, many requests per second, long prompts. The link
bandwidth is an assumption for the user to set, not a measurement.

Fair comparison. A disaggregated pair uses two devices. Beside one colocated engine the
comparison runs as many colocated replicas as the disaggregated setup has engines (the same
devices and KV memory), and reports goodput per device, DistServe's figure of merit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from operator import itemgetter

from .config import SamplingParams
from .engine import LLMEngine
from .kv_transfer import KVHandoff, admit_prefilled, can_admit, export_prefilled
from .metrics import SLO, RequestMetrics, ServingMetrics, request_metrics, serving_metrics, summarize_ms
from .outputs import RequestOutput, StepRecord
from .serving import run_workload
from .workload import RequestSpec, workload_prompts

# An assumption, for the user to set: PCIe 4.0 x16 carries about 32 GB/s each way. NVLink-class
# links between GPUs of one node are an order of magnitude faster, datacenter networks between
# nodes (e.g. 100-400 Gb/s NICs, 12.5-50 GB/s) of the same order or slower.
DEFAULT_LINK_BANDWIDTH_GBPS = 32.0

COLOCATED, PREFILL, DECODE = "colocated", "prefill", "decode"


class VirtualClock:
    """A device's own clock: ``set(t)``, then the first reading is exactly ``t`` and later readings
    advance with real time (``time.perf_counter``). An engine given it as ``engine.clock`` stamps
    its steps and emissions in model time while their durations stay measured."""

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
    """One KV hand-off in the model, times in seconds from the first arrival.

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
    """A replay in the model. ``outputs`` follow the order of the specs; their ``times`` are in model
    seconds from the first arrival. ``steps[i]`` are engine ``i``'s steps (model start times)."""

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

    def timeline(self) -> list[dict]:
        """Per request, in spec order: when each phase happened (model seconds) and where.

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
            rows.append({
                "request_id": out.request_id, "arrival_s": t.arrival_s, "first_scheduled_s": t.first_scheduled_s,
                "first_token_s": t.emissions[0][0] if t.emissions else None,
                "last_token_s": t.emissions[-1][0] if t.emissions else None,
                "prompt_tokens": len(out.prompt_token_ids), "output_tokens": len(out.token_ids),
                "prefill_engine": tr.source if tr else home, "decode_engine": tr.destination if tr else home,
                "transfer_ready_s": tr.ready_s if tr else None, "transfer_start_s": tr.start_s if tr else None,
                "transfer_end_s": tr.end_s if tr else None, "decode_admitted_s": tr.admitted_s if tr else None,
                "kv_bytes": tr.kv_bytes if tr else None,
            })
        return rows


@dataclass
class _Engine:
    """An engine as a device of the model: its clock, when it is next free, what waits for it."""

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
    """Greedy, exactly ``output_tokens`` tokens (``ignore_eos``): as ``serving.run_workload``."""
    return SamplingParams(temperature=0, max_tokens=spec.output_tokens, ignore_eos=True)


def replay_colocated(engines: list[LLMEngine], specs: list[RequestSpec], prompts: list[list[int]] | None = None,
                     params: Callable[[RequestSpec], SamplingParams] | None = None, name: str = "colocated") -> ClusterRun:
    """Replay ``specs`` in the model on ``engines`` as colocated replicas (each prefills and decodes
    its requests; arrivals round-robin). One engine is the model's twin of ``run_workload``.

    Args, Returns and Raises: as ``replay_disaggregated``.
    """
    return _run(_replay(name, [_Engine(COLOCATED, e) for e in engines], specs, prompts, params, None))


def replay_disaggregated(prefill_engines: list[LLMEngine], decode_engines: list[LLMEngine], specs: list[RequestSpec],
                         prompts: list[list[int]] | None = None,
                         params: Callable[[RequestSpec], SamplingParams] | None = None,
                         link_bandwidth_gbps: float = DEFAULT_LINK_BANDWIDTH_GBPS,
                         name: str = "disaggregated") -> ClusterRun:
    """Replay ``specs`` in the model: prefill engines take the arrivals (round-robin), compute the
    prompt and the first token, and hand each request with its KV to a decode engine
    (round-robin) over their link; the decode engines generate the rest.

    Args:
        prefill_engines, decode_engines: engines of one model (e.g. ``LLMEngine(config,
            loaded=engine.loaded)``), the same ``block_size`` and dtype, no speculative decoding,
            and no request of their own in flight; each is one device of the model.
        specs: arrivals (s from the start) and sizes.
        prompts: token ids per spec (default: real text of each spec's length).
        params: ``SamplingParams`` per spec (default ``default_params``: greedy, ``output_tokens``).
        link_bandwidth_gbps: GB/s (1e9 bytes/s) of each prefill engine's link: an assumption.
    Returns:
        a ``ClusterRun`` (outputs in spec order, steps, transfers), times in model seconds.
    Raises:
        ValueError: no engine of a role, a bandwidth <= 0, an engine with requests in flight, or a
            request an engine refuses (``add_request``, ``kv_transfer.admit_prefilled``).
        RuntimeError: an engine whose KV pool cannot hold a request even when idle.
    """
    return _run(_disaggregated(prefill_engines, decode_engines, specs, prompts, params, link_bandwidth_gbps, name))


def _disaggregated(prefill_engines, decode_engines, specs, prompts, params, link_bandwidth_gbps, name) -> Iterator[None]:
    if not prefill_engines or not decode_engines:
        raise ValueError("disaggregated serving needs at least one prefill and one decode engine")
    if not link_bandwidth_gbps > 0:
        raise ValueError(f"link_bandwidth_gbps={link_bandwidth_gbps!r} must be > 0 (GB/s)")
    instances = [_Engine(PREFILL, e) for e in prefill_engines] + [_Engine(DECODE, e) for e in decode_engines]
    return _replay(name, instances, specs, prompts, params, link_bandwidth_gbps)


def _run(replay: Iterator[None]) -> ClusterRun:
    """Drive one replay to its end."""
    return _interleave([replay])[0]


def _interleave(replays: list[Iterator[None]]) -> list[ClusterRun]:
    """Drive several replays a step each in turn, so that the machine's speed drifting (other work
    on a shared machine) slows them alike; each keeps its own model time. Their results, in order."""
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


def _replay(name: str, instances: list[_Engine], specs: list[RequestSpec], prompts, params,
            link_bandwidth_gbps: float | None) -> Iterator[None]:
    """The discrete-event loop, a generator that yields after each step and returns the
    ``ClusterRun``. Invariant: steps run in the order of their model start times, so when an
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
                raise RuntimeError("no engine has work left but requests are unfinished (a bug in the model)")
            x = instances[k]
            _deliver(x, start_s, specs, prompts, params, transfers)
            x.clock.set(start_s)
            steps_before = len(x.engine.step_records)
            outputs = x.engine.step()
            x.free_s = x.clock()
            if len(x.engine.step_records) == steps_before:
                raise RuntimeError(f"{x.role} engine {k} has work but could not schedule a step at t={start_s:.3f} s: "
                                   "its KV pool is too small for the request waiting (raise num_kv_blocks)")
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
                    transfers[out.request_id] = Transfer(out.request_id, k, dest, handoff.num_computed_tokens,
                                                         handoff.kv_bytes, ready, begin, end)
                    _post(instances[dest], end, handoff)
            yield
    finally:
        for x, clock in zip(instances, own_clocks):
            x.engine.clock = clock
    ids = [_request_id(i) for i in range(len(specs))]
    return ClusterRun(name, [x.role for x in instances], [instances[homes[r]].engine.output(r) for r in ids],
                      [x.engine.step_records[n:] for x, n in zip(instances, first_step)], transfers, homes,
                      link_bandwidth_gbps)


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
            x.engine.add_request(prompts[item], params(specs[item]), request_id=_request_id(item),
                                 arrival_s=specs[item].arrival_s)
        x.inbox.pop(0)


# -- the comparison ---------------------------------------------------------------------------------

def compare_disaggregation(engine: LLMEngine, specs: list[RequestSpec], slo: SLO | None = None,
                           prompts: list[list[int]] | None = None, *, num_prefill: int = 1, num_decode: int = 1,
                           link_bandwidth_gbps: float = DEFAULT_LINK_BANDWIDTH_GBPS,
                           prefill_overrides: dict | None = None, decode_overrides: dict | None = None,
                           real_time_baseline: bool = False,
                           params: Callable[[RequestSpec], SamplingParams] | None = None,
                           progress: Callable[[str], None] | None = None) -> dict:
    """Colocated against disaggregated serving on the same requests, in the model; a JSON dict.

    Runs, each on fresh engines sharing ``engine``'s weights and configuration (KV pools empty,
    prefix caches cold; every engine's pool ``comparison_pool``'s, unless the overrides say
    otherwise), after one short warm-up. The three model runs advance a step each in turn, so a
    machine slowing down (other work on it) slows them alike:

    - ``colocated``: one engine, one device (the model's twin of ``serving.run_workload``);
    - ``colocated_xN``: N = ``num_prefill + num_decode`` colocated replicas, as many devices as
      the disaggregated setup;
    - ``disaggregated``: ``num_prefill`` prefill and ``num_decode`` decode engines;
    - ``colocated_real_time`` (``real_time_baseline=True``): one engine replayed in real time by
      ``serving.run_workload``, wall clock: how far the model's colocated twin is from a real run.

    Args:
        engine: supplies the weights and the configuration of every engine.
        slo: goodput is counted against it (DistServe's definition, ``metrics.SLO``).
        prompts, params: as ``replay_disaggregated``.
        link_bandwidth_gbps: the assumed link, GB/s (``DEFAULT_LINK_BANDWIDTH_GBPS``).
        prefill_overrides, decode_overrides: ``EngineConfig`` fields for the prefill or decode
            engines (e.g. ``{"max_num_batched_tokens": 2048}``), the phase specialization; a
            ``num_kv_blocks`` there studies a smaller pool. On a GPU, 2 N + 1 engines (N =
            ``num_prefill + num_decode``) hold their pools and CUDA graphs at once, beside ``engine``.
        progress: called with a line before each run.
    Returns:
        ``{"assumptions", "slo", "runs", "transfers", "timeline", "outputs_identical", "wall_s"}``:
        ``runs`` a list, per run: ``name``, ``label``, ``num_devices``, ``roles``, ``clock``
        ("model" or "wall"), ``duration_s``, ``metrics`` (``ServingMetrics.to_dict()``),
        ``goodput_per_device_req_s``, ``step_ms`` (``summarize_ms`` of steps with a prefill chunk
        and of decode-only steps) and ``requests`` (per request ``RequestMetrics`` as dicts, for
        ``run_metrics`` under other SLOs); ``transfers`` a summary of the hand-offs (count, bytes,
        time on the link, time waiting for the link and for the decode engine, ms);
        ``timeline`` the disaggregated run's ``ClusterRun.timeline()``; ``outputs_identical``
        how many requests produced the same tokens colocated and disaggregated (all, for greedy
        requests, up to fp near-ties); ``wall_s`` what the comparison took on this machine.
    Raises:
        ValueError: counts below 1, a bandwidth <= 0, or as ``replay_disaggregated``.
    """
    if num_prefill < 1 or num_decode < 1:
        raise ValueError(f"num_prefill={num_prefill} and num_decode={num_decode} must be >= 1")
    if not link_bandwidth_gbps > 0:
        raise ValueError(f"link_bandwidth_gbps={link_bandwidth_gbps!r} must be > 0 (GB/s)")
    wall = time.perf_counter()
    prompts = prompts if prompts is not None else workload_prompts(engine.tokenizer, specs)
    params = params or default_params
    say = progress or (lambda _: None)

    pool = comparison_pool(engine, specs)
    base = replace(engine.config, **pool)

    def make(overrides: dict | None = None) -> LLMEngine:
        return LLMEngine(replace(base, **(overrides or {})), loaded=engine.loaded)

    warm = make()  # first calls of a shape cost more: not inside any run
    warm.generate([p[:16] for p in prompts[:2]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    del warm
    n = num_prefill + num_decode
    say(f"model: 1 colocated engine, {n} colocated replicas and {num_prefill} prefill + {num_decode} decode "
        "engines, a step of each in turn")
    colocated, replicas, disagg = _interleave([
        _replay("colocated", [_Engine(COLOCATED, make())], specs, prompts, params, None),
        _replay(f"colocated_x{n}", [_Engine(COLOCATED, make()) for _ in range(n)], specs, prompts, params, None),
        _disaggregated([make(prefill_overrides) for _ in range(num_prefill)],
                       [make(decode_overrides) for _ in range(num_decode)], specs, prompts, params,
                       link_bandwidth_gbps, "disaggregated")])
    runs = [_run_record(colocated, "1 colocated engine", slo), _run_record(replicas, f"{n} colocated replicas", slo),
            _run_record(disagg, f"{num_prefill} prefill + {num_decode} decode engines", slo)]
    if real_time_baseline:
        say("colocated, real time (serving.run_workload)")
        real = run_workload(make(), specs, prompts, params)
        runs.append(_record("colocated_real_time", "1 colocated engine, real time", [COLOCATED], "wall",
                            real.outputs, real.steps, slo))
    same = sum(a.token_ids == b.token_ids for a, b in zip(colocated.outputs, disagg.outputs))
    kv_dtype = engine.kv_cache.k.dtype
    return {
        "assumptions": {
            "link_bandwidth_gbps": link_bandwidth_gbps,
            "link": "one FIFO link per prefill engine; transfer = KV bytes / bandwidth, no latency, after the prefill",
            "clock": "each engine's steps run and are timed for real on this device, placed on that engine's own clock",
            "routing": "round-robin: arrivals among prefill engines, hand-offs among decode engines",
            "kv_bytes_per_token": engine.model_config.kv_bytes_per_token(kv_dtype.itemsize),
            "kv_dtype": str(kv_dtype).removeprefix("torch."),
            "device": str(engine.device),
            "engine_pool": pool,
            "num_prefill": num_prefill, "num_decode": num_decode,
            "prefill_overrides": prefill_overrides or {}, "decode_overrides": decode_overrides or {},
        },
        "slo": asdict(slo) if slo is not None else None,
        "runs": runs,
        "transfers": transfer_summary(disagg),
        "timeline": disagg.timeline(),
        "outputs_identical": {"compared": len(specs), "identical": same},
        "wall_s": time.perf_counter() - wall,
    }


def comparison_pool(engine: LLMEngine, specs: list[RequestSpec]) -> dict:
    """``EngineConfig`` fields for every engine of a comparison: ``max_model_len`` the workload's
    longest request, and a KV pool of ``engine``'s size capped at what the workload can fill (every
    request at once), so that the runs' pools, alive together, fit beside ``engine``'s on a GPU
    and cost little RAM on a CPU. Every device of every run gets the same pool."""
    bs = engine.config.block_size
    longest = max((s.prompt_tokens + s.output_tokens for s in specs), default=1)
    max_model_len = min(engine.max_model_len, longest + 1)
    need = max(-(-max_model_len // bs), sum(-(-(s.prompt_tokens + s.output_tokens) // bs) for s in specs))
    return {"max_model_len": max_model_len, "num_kv_blocks": min(engine.block_manager.num_blocks, need)}


def _run_record(run: ClusterRun, label: str, slo: SLO | None) -> dict:
    return _record(run.name, label, run.roles, "model", run.outputs, [s for steps in run.steps for s in steps], slo)


def _record(name: str, label: str, roles: list[str], clock: str, outputs: list[RequestOutput],
            steps: list[StepRecord], slo: SLO | None) -> dict:
    requests = [request_metrics(o) for o in outputs]
    m = serving_metrics(requests, None, slo)
    return {
        "name": name, "label": label, "num_devices": len(roles), "roles": list(roles), "clock": clock,
        "duration_s": m.duration_s, "metrics": m.to_dict(),
        "goodput_per_device_req_s": m.goodput_req_s / len(roles) if m.goodput_req_s is not None else None,
        "step_ms": {"with_prefill": summarize_ms(s.duration_s for s in steps if s.num_prefill_tokens),
                    "decode_only": summarize_ms(s.duration_s for s in steps if not s.num_prefill_tokens)},
        "requests": [asdict(r) for r in requests],
    }


def transfer_summary(run: ClusterRun) -> dict:
    """The hand-offs of a run: count, bytes, and per transfer (ms, ``summarize_ms``) the time on
    the link, the wait for the link (behind earlier transfers) and the wait for the decode engine
    (busy with a step, or full) after landing."""
    ts = list(run.transfers.values())
    return {
        "count": len(ts), "total_bytes": sum(t.kv_bytes for t in ts),
        "link_ms": summarize_ms(t.end_s - t.start_s for t in ts),
        "link_wait_ms": summarize_ms(t.start_s - t.ready_s for t in ts),
        "decode_wait_ms": summarize_ms(t.admitted_s - t.end_s for t in ts if t.admitted_s is not None),
    }


def run_metrics(run: dict, slo: SLO | None = None) -> ServingMetrics:
    """A run of ``compare_disaggregation``'s result summarized again, e.g. under another SLO."""
    return serving_metrics([RequestMetrics(**r) for r in run["requests"]], None, slo)


def format_comparison(result: dict) -> list[str]:
    """``compare_disaggregation``'s result as a table: one row per run, and the transfers."""
    slo = result["slo"] or {}
    slo_text = ", ".join(f"{k} <= {v:g}" for k, v in slo.items() if v is not None) or "no SLO"
    link = f"link {result['assumptions']['link_bandwidth_gbps']:g} GB/s assumed"
    lines = [f"Colocated against disaggregated serving ({slo_text}; {link})",
             (f"  {'run':<36} {'dev':>3} {'out tok/s':>9} {'TTFT P50/P99 ms':>16} {'TPOT P50/P99 ms':>16} "
              f"{'ITL P99 ms':>10} {'goodput/dev':>11}")]

    def pair(d: dict) -> str:
        return f"{d['p50'] or 0:.0f}/{d['p99'] or 0:.0f}"

    for r in result["runs"]:
        m, good = r["metrics"], r["goodput_per_device_req_s"]
        lines.append(f"  {r['label'] + (' (wall)' if r['clock'] == 'wall' else ''):<36} {r['num_devices']:>3} "
                     f"{m['output_throughput_tok_s'] or 0:>9.1f} {pair(m['ttft_ms']):>16} {pair(m['tpot_ms']):>16} "
                     f"{m['itl_ms']['p99'] or 0:>10.0f} {'-' if good is None else f'{good:.3f}':>11}")
    t = result["transfers"]
    if t["count"]:
        lines.append(f"  {t['count']} KV transfers, {t['total_bytes'] / 1e6:.1f} MB: link P50 {t['link_ms']['p50']:.2f} ms, "
                     f"P99 {t['link_ms']['p99']:.2f} ms; waiting for the link P99 {t['link_wait_ms']['p99']:.2f} ms, "
                     f"for the decode engine P99 {t['decode_wait_ms']['p99'] or 0:.1f} ms")
    o = result["outputs_identical"]
    lines.append(f"  outputs identical colocated and disaggregated: {o['identical']}/{o['compared']} requests")
    return lines


def estimate_comparison_s(probe: dict, specs: list[RequestSpec], max_num_seqs: int = 64,
                          real_time_baseline: bool = False) -> float:
    """Rough seconds ``compare_disaggregation`` takes, from ``bench.probe_speed``'s figures.

    The model skips idle time, so each of its three runs costs the workload's compute: every
    prompt prefilled once, plus the decode steps, counted as batch-1 steps of ``decode_step_s``.
    Decode steps are the output tokens divided by the mean number of requests decoding together,
    estimated by Little's law (arrival rate x time to decode one request), at least 1 and at
    most ``max_num_seqs``. The real-time baseline lasts at least the workload's span.
    """
    from .bench import estimate_s

    if not specs:
        return 0.0
    outs = [s.output_tokens for s in specs]
    span = max(s.arrival_s for s in specs) - min(s.arrival_s for s in specs)
    cap = min(len(specs), max_num_seqs)
    together = cap if span <= 0 else min(cap, max(1.0, len(specs) / span * sum(outs) / len(outs) * probe["decode_step_s"]))
    decode_steps = max(max(outs), sum(outs) / together)
    one = estimate_s(probe, prefill_tokens=sum(s.prompt_tokens for s in specs), decode_steps=round(decode_steps),
                     prefills=len(specs))
    return 3 * one + (max(span, one) if real_time_baseline else 0.0)
