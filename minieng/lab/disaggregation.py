"""Colocated against disaggregated serving on one workload, in the measured simulation.

``disagg_simulation`` is the simulation (each engine a device with its own clock, the KV link); this is
the experiment a notebook runs: the same requests on one colocated engine, on as many colocated
replicas as the disaggregated setup has engines (the same devices and KV memory: the fair
baseline), and on prefill + decode engines, optionally beside a real-time run of the colocated
engine (``replay.run_workload``) that checks the simulation's colocated twin against the wall
clock. The result is one JSON-serializable dict with serving metrics per run (``metrics``),
goodput per device (DistServe's figure of merit), the KV transfers and every request's
timeline; ``format_comparison`` prints it, ``run_metrics`` re-counts a run under another SLO,
``estimate_comparison_s`` says how long it will take.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.core.outputs import RequestOutput, StepRecord
from minieng.lab.disagg_simulation import (
    COLOCATED,
    DECODE,
    DEFAULT_LINK_BANDWIDTH_GBPS,
    PREFILL,
    ClusterRun,
    colocated_replay,
    default_params,
    disaggregated_replay,
    interleave,
)
from minieng.lab.probes import estimate_s, warm_up
from minieng.lab.replay import run_workload
from minieng.measure.metrics import (
    SLO,
    RequestMetrics,
    ServingMetrics,
    common_tail,
    labeled_percentile,
    request_metrics,
    serving_metrics,
    summarize_ms,
)
from minieng.measure.workloads import RequestSpec, workload_prompts
from minieng.units import cdiv


def compare_disaggregation(
    engine: LLMEngine,
    specs: list[RequestSpec],
    slo: SLO | None = None,
    prompts: list[list[int]] | None = None,
    *,
    num_prefill: int = 1,
    num_decode: int = 1,
    link_bandwidth_gbps: float = DEFAULT_LINK_BANDWIDTH_GBPS,
    prefill_overrides: dict | None = None,
    decode_overrides: dict | None = None,
    real_time_baseline: bool = False,
    params: Callable[[RequestSpec], SamplingParams] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Colocated against disaggregated serving on the same requests, in the simulation; a JSON dict.

    Runs, each on fresh engines sharing ``engine``'s weights and configuration (KV pools empty,
    prefix caches cold; every engine's pool ``comparison_pool``'s, unless the overrides say
    otherwise), after one short warm-up. The three simulated runs advance a step each in turn, so a
    machine slowing down (other work on it) slows them alike:

    - ``colocated``: one engine, one device (the simulation's twin of ``replay.run_workload``);
    - ``colocated_xN``: N = ``num_prefill + num_decode`` colocated replicas, as many devices as
      the disaggregated setup;
    - ``disaggregated``: ``num_prefill`` prefill and ``num_decode`` decode engines;
    - ``colocated_real_time`` (``real_time_baseline=True``): one engine replayed in real time by
      ``replay.run_workload``, wall clock: how far the simulation's colocated twin is from a real run.

    Args:
        engine: supplies the weights and the configuration of every engine.
        slo: goodput is counted against it (DistServe's definition, ``metrics.SLO``).
        prompts, params: as ``disagg_simulation.disaggregated_replay``.
        link_bandwidth_gbps: the assumed link, GB/s (``DEFAULT_LINK_BANDWIDTH_GBPS``).
        prefill_overrides, decode_overrides: ``EngineConfig`` fields for the prefill or decode
            engines (e.g. ``{"max_num_batched_tokens": 2048}``), the phase specialization; a
            ``num_kv_blocks`` there studies a smaller pool. On a GPU, 2 N + 1 engines (N =
            ``num_prefill + num_decode``: every engine of ``simulated_runs``) hold their pools and
            CUDA graphs at once, beside ``engine``, each with ``comparison_pool``'s pool at most. The warm-up's engine is
            released before them, and they before the real-time baseline's.
        progress: called with a line before each run.
    Returns:
        ``{"assumptions", "slo", "runs", "transfers", "timeline", "outputs_identical", "wall_s"}``:
        ``runs`` a list, per run: ``name``, ``label``, ``num_devices``, ``roles``, ``clock``
        ("simulated" or "wall"), ``duration_s``, ``metrics`` (``ServingMetrics.to_dict()``),
        ``goodput_per_device_req_s``, ``step_ms`` (``summarize_ms`` of steps with a prefill chunk
        and of decode-only steps) and ``requests`` (per request ``RequestMetrics`` as dicts, for
        ``run_metrics`` under other SLOs); ``transfers`` a summary of the hand-offs (count, bytes,
        time on the link, time waiting for the link and for the decode engine, ms);
        ``timeline`` the disaggregated run's ``ClusterRun.timeline()``; ``outputs_identical``
        how many requests produced the same tokens colocated and disaggregated (all, for greedy
        requests, up to fp near-ties); ``wall_s`` what the comparison took on this machine.
    Raises:
        ValueError: counts below 1, a bandwidth <= 0, or as ``disaggregated_replay``.
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
    warm_up(warm, [p[:16] for p in prompts[:2]], output_tokens=2)
    del warm  # its pool and graphs go before the runs' are allocated
    n = num_prefill + num_decode
    say(
        f"simulated: 1 colocated engine, {n} colocated replicas and {num_prefill} prefill + {num_decode} decode "
        "engines, a step of each in turn"
    )
    overrides = {COLOCATED: None, PREFILL: prefill_overrides, DECODE: decode_overrides}
    engines = {
        name: [make(overrides[role]) for role in roles]
        for name, roles in simulated_runs(num_prefill, num_decode).items()
    }
    colocated, replicas, disagg = interleave(
        [
            colocated_replay(engines["colocated"], specs, prompts, params, "colocated"),
            colocated_replay(engines[f"colocated_x{n}"], specs, prompts, params, f"colocated_x{n}"),
            disaggregated_replay(
                engines["disaggregated"][:num_prefill],
                engines["disaggregated"][num_prefill:],
                specs,
                prompts,
                params,
                link_bandwidth_gbps,
                "disaggregated",
            ),
        ]
    )
    del engines  # the runs' pools and graphs go before the real-time baseline's engine is built
    runs = [
        _run_record(colocated, "1 colocated engine", slo),
        _run_record(replicas, f"{n} colocated replicas", slo),
        _run_record(disagg, f"{num_prefill} prefill + {num_decode} decode engines", slo),
    ]
    if real_time_baseline:
        say("colocated, real time (serving.run_workload)")
        real = run_workload(make(), specs, prompts, params)
        runs.append(
            _record(
                "colocated_real_time",
                "1 colocated engine, real time",
                [COLOCATED],
                "wall",
                real.outputs,
                real.steps,
                slo,
            )
        )
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
            "num_prefill": num_prefill,
            "num_decode": num_decode,
            "prefill_overrides": prefill_overrides or {},
            "decode_overrides": decode_overrides or {},
        },
        "slo": asdict(slo) if slo is not None else None,
        "runs": runs,
        "transfers": disagg.transfer_summary(),
        "timeline": disagg.timeline(),
        "outputs_identical": {"compared": len(specs), "identical": same},
        "wall_s": time.perf_counter() - wall,
    }


def simulated_runs(num_prefill: int = 1, num_decode: int = 1) -> dict[str, list[str]]:
    """The simulated runs of ``compare_disaggregation``, by name, each a list of its engines' roles
    (``disagg_simulation.COLOCATED``, ``PREFILL``, ``DECODE``): ``colocated`` one engine,
    ``colocated_xN`` N = ``num_prefill + num_decode`` replicas, ``disaggregated`` the prefill then
    the decode engines. ``compare_disaggregation`` builds one engine per role listed here, all
    before the runs start (they advance a step each in turn). Raises ``ValueError`` for counts below 1."""
    if num_prefill < 1 or num_decode < 1:
        raise ValueError(f"num_prefill={num_prefill} and num_decode={num_decode} must be >= 1")
    n = num_prefill + num_decode
    return {
        "colocated": [COLOCATED],
        f"colocated_x{n}": [COLOCATED] * n,
        "disaggregated": [PREFILL] * num_prefill + [DECODE] * num_decode,
    }


def comparison_pool(engine: LLMEngine, specs: list[RequestSpec]) -> dict:
    """``EngineConfig`` fields for every engine of a comparison: ``max_model_len`` the workload's
    longest request, and a KV pool of ``engine``'s size capped at what the workload can fill (every
    request at once), so that the runs' pools, alive together, fit beside ``engine``'s on a GPU
    and cost little RAM on a CPU. Every device of every run gets the same pool."""
    bs = engine.config.block_size
    longest = max((s.prompt_tokens + s.output_tokens for s in specs), default=1)
    max_model_len = min(engine.max_model_len, longest + 1)
    need = max(cdiv(max_model_len, bs), sum(cdiv(s.prompt_tokens + s.output_tokens, bs) for s in specs))
    return {"max_model_len": max_model_len, "num_kv_blocks": min(engine.block_manager.num_blocks, need)}


def _run_record(run: ClusterRun, label: str, slo: SLO | None) -> dict:
    return _record(run.name, label, run.roles, "simulated", run.outputs, [s for steps in run.steps for s in steps], slo)


def _record(
    name: str,
    label: str,
    roles: list[str],
    clock: str,
    outputs: list[RequestOutput],
    steps: list[StepRecord],
    slo: SLO | None,
) -> dict:
    requests = [request_metrics(o) for o in outputs]
    m = serving_metrics(requests, None, slo)
    return {
        "name": name,
        "label": label,
        "num_devices": len(roles),
        "roles": list(roles),
        "clock": clock,
        "duration_s": m.duration_s,
        "metrics": m.to_dict(),
        "goodput_per_device_req_s": m.goodput_req_s / len(roles) if m.goodput_req_s is not None else None,
        "step_ms": {
            "with_prefill": summarize_ms(s.duration_s for s in steps if s.num_prefill_tokens),
            "decode_only": summarize_ms(s.duration_s for s in steps if not s.num_prefill_tokens),
        },
        "requests": [asdict(r) for r in requests],
    }


def run_metrics(run: dict, slo: SLO | None = None) -> ServingMetrics:
    """A run of ``compare_disaggregation``'s result summarized again, e.g. under another SLO."""
    return serving_metrics([RequestMetrics(**r) for r in run["requests"]], None, slo)


def format_comparison(result: dict) -> list[str]:
    """``compare_disaggregation``'s result as a table: one row per run, and the transfers."""
    slo = result["slo"] or {}
    slo_text = ", ".join(f"{k} <= {v:g}" for k, v in slo.items() if v is not None) or "no SLO"
    link = f"link {result['assumptions']['link_bandwidth_gbps']:g} GB/s assumed"
    # each tail column: P99 where every run's sample supports it, else every run's max (metrics.common_tail)
    tails = {key: common_tail([r["metrics"][key] for r in result["runs"]]) for key in ("ttft_ms", "tpot_ms", "itl_ms")}
    head = {key: "P99" if k == "p99" else "max" for key, (_, k) in tails.items()}
    lines = [
        f"Colocated against disaggregated serving ({slo_text}; {link})",
        (
            f"  {'run':<36} {'dev':>3} {'out tok/s':>9} {'TTFT P50/' + head['ttft_ms'] + ' ms':>16} "
            f"{'TPOT P50/' + head['tpot_ms'] + ' ms':>16} {'ITL ' + head['itl_ms'] + ' ms':>10} {'goodput/dev':>11}"
        ),
    ]

    def pair(d: dict, key: str) -> str:
        return f"{d['p50'] or 0:.0f}/{d[tails[key][1]] or 0:.0f}"

    for r in result["runs"]:
        m, good = r["metrics"], r["goodput_per_device_req_s"]
        lines.append(
            f"  {r['label'] + (' (wall)' if r['clock'] == 'wall' else ''):<36} {r['num_devices']:>3} "
            f"{m['output_throughput_tok_s'] or 0:>9.1f} {pair(m['ttft_ms'], 'ttft_ms'):>16} "
            f"{pair(m['tpot_ms'], 'tpot_ms'):>16} {m['itl_ms'][tails['itl_ms'][1]] or 0:>10.0f} {'-' if good is None else f'{good:.3f}':>11}"
        )
    short = [f"{key[:-3].upper()} {label}" for key, (label, k) in tails.items() if k == "max"]
    if short:
        lines.append(f"  (max: too few samples a run for a P99: {', '.join(short)})")
    t = result["transfers"]
    if t["count"]:
        link_tail, link_ms = labeled_percentile(t["link_ms"])
        wait_tail, wait_ms = labeled_percentile(t["link_wait_ms"])
        decode_tail, decode_ms = labeled_percentile(t["decode_wait_ms"])
        lines.append(
            f"  {t['count']} KV transfers, {t['total_bytes'] / 1e6:.1f} MB: link P50 {t['link_ms']['p50']:.2f} ms, "
            f"{link_tail}: {link_ms:.2f} ms; waiting for the link, {wait_tail}: {wait_ms:.2f} ms; "
            f"for the decode engine, {decode_tail}: {decode_ms or 0:.1f} ms"
        )
    o = result["outputs_identical"]
    lines.append(f"  outputs identical colocated and disaggregated: {o['identical']}/{o['compared']} requests")
    return lines


def estimate_comparison_s(
    probe: dict, specs: list[RequestSpec], max_num_seqs: int = 64, real_time_baseline: bool = False
) -> float:
    """Rough seconds ``compare_disaggregation`` takes, from ``probes.probe_speed``'s figures.

    The simulation skips idle time, so each of its three runs costs the workload's compute: every
    prompt prefilled once, plus the decode steps, counted as batch-1 steps of ``decode_step_s``.
    Decode steps are the output tokens divided by the mean number of requests decoding together,
    estimated by Little's law (arrival rate x time to decode one request), at least 1 and at
    most ``max_num_seqs``. The real-time baseline lasts at least the workload's span.
    """
    if not specs:
        return 0.0
    outs = [s.output_tokens for s in specs]
    span = max(s.arrival_s for s in specs) - min(s.arrival_s for s in specs)
    cap = min(len(specs), max_num_seqs)
    together = (
        cap if span <= 0 else min(cap, max(1.0, len(specs) / span * sum(outs) / len(outs) * probe["decode_step_s"]))
    )
    decode_steps = max(max(outs), sum(outs) / together)
    one = estimate_s(
        probe, prefill_tokens=sum(s.prompt_tokens for s in specs), decode_steps=round(decode_steps), prefills=len(specs)
    )
    return 3 * one + (max(span, one) if real_time_baseline else 0.0)
