"""What GPU utilization means: NVML's util.gpu against MFU and MBU, and where a decode step's time goes.

Notebook 04's experiment. A batch of sequences decodes for a few seconds (NVML averages its util
over 1/6 s to 1 s, so shorter runs say nothing) while ``nvml.TelemetrySampler`` reads NVML
on a GPU; the same steps' FLOPs and bytes (``roofline.phase_utilization``) give MFU and MBU. The two
answer different questions: util.gpu is the share of time at least one kernel ran, so a decode
that launches one small kernel after another reads high; MFU is the share of the peak FLOP/s the
steps achieved, and at batch 1 it is tiny. GPM (Hopper and newer) reports SM occupancy and DRAM
bandwidth utilization, the honest counterparts; without GPM, or without NVML, they are N/A (None),
never 0.

Where a step's time goes is read with ``torch.profiler``: per op (``aten::mm``, ``aten::addmm``, ...)
its self time, so nested ops are not counted twice. The matrix products are the part that reads
the weights, the part bandwidth bounds; every other op, and the time outside any op (Python, the
scheduler, sampling), is overhead, which a GPU pays as kernel launches and host work between them.

This module runs the engine and measures, and formats its table rows; its one judgement is
``graphs_verdict`` (CUDA graphs against eager decode, a lesson beyond the articles).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from contextlib import contextmanager

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.core.outputs import StepRecord
from minieng.measure.nvml import VALUE_FIELDS, TelemetrySampler, summarize
from minieng.measure.op_count import OpCounter, count_layer_ops
from minieng.measure.roofline import format_percent, phase_utilization

# The matrix-product ops of torch's dispatcher. ``aten::linear`` and ``aten::matmul`` are
# composites whose self time is the dispatch around the ``mm``/``addmm`` they call. On x86-64 CPUs
# minieng's linear layers run as oneDNN's ``mkldnn::_linear_pointwise`` (``model.linear``).
MATMUL_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::matmul",
        "aten::linear",
        "aten::mv",
        "aten::addmv",
        "aten::dot",
        "mkldnn::_linear_pointwise",
    }
)
# On a GPU the profiler times kernels, named by their library: cuBLAS/cuBLASLt GEMM and GEMV kernels
# ("sm90_xmma_gemm_...", "ampere_bf16_s16816gemm_...", "gemv2T_kernel...", "nvjet_..."), CUTLASS.
GEMM_KERNEL_PATTERNS = ("gemm", "gemv", "xmma", "cutlass", "cublas", "nvjet")
OUTSIDE_OPS = "(outside any op: Python, scheduler, sampling)"


def decode_for(
    engine: LLMEngine, prompts: Sequence[Sequence[int]], seconds: float, min_steps: int = 2, warmup_steps: int = 2
) -> list[StepRecord]:
    """Decode ``len(prompts)`` sequences together for at least ``seconds`` (s) of decode steps.

    The prompts are prefilled first, then the batch decodes greedily, ``ignore_eos``; the first
    ``warmup_steps`` decode steps are not kept (on CUDA the first step of a batch size captures its
    graph). It runs until ``seconds`` have passed since the first kept step and at least
    ``min_steps`` were kept; the requests are then aborted. A batch that reaches ``max_model_len``
    is sent again. Returns the kept decode-only ``StepRecord``s.
    Raises ``ValueError`` for no prompts, ``seconds`` < 0, or a prompt leaving no room to decode.
    """
    if not prompts or seconds < 0:
        raise ValueError(f"need at least one prompt and seconds >= 0; got {len(prompts)} prompts, {seconds} s")
    room = engine.max_model_len - max(len(p) for p in prompts)
    if room < 2:
        raise ValueError(
            f"a prompt of {max(len(p) for p in prompts)} tokens leaves no room to decode within "
            f"max_model_len={engine.max_model_len}: shorten it"
        )
    params = SamplingParams.fixed_length(room)
    first = len(engine.step_records)
    ids: list[str] = []
    decode: list[StepRecord] = []
    while not decode or len(decode) < min_steps or time.perf_counter() - decode[0].start_s < seconds:
        if not engine.has_unfinished_requests():
            ids = [engine.add_request(list(p), params) for p in prompts]
        engine.step()
        decode = [s for s in engine.step_records[first:] if s.num_prefill_tokens == 0][warmup_steps:]
    for request_id in ids:
        engine.abort_request(request_id)
    return decode


def decode_utilization(
    engine: LLMEngine, prompts: Sequence[Sequence[int]], seconds: float, peaks, sampler="auto", interval_s: float = 0.1
) -> dict:
    """A decode run of ``seconds`` with NVML sampled beside it: what each figure says.

    Args:
        prompts: one per sequence; the batch size is their number.
        peaks: ``peaks.Peak``s; the first one sets the per-step MFU/MBU trace.
        sampler: ``"auto"``: a ``nvml.TelemetrySampler`` every ``interval_s`` on CUDA, none
            elsewhere; None: no telemetry; or a ``TelemetrySampler`` not yet started (tests pass
            one over a fake NVML).
    Returns:
        a JSON-serializable dict: ``batch_size``, ``num_steps``, ``duration_s``, ``decode_step_ms``
        (the median decode step: one token per sequence, so each sequence's TPOT), ``utilization`` (``phase_utilization`` of the decode steps, keyed by
        peak source), ``steps`` (per step: ``time_s`` from the first decode step, ``mfu_percent``,
        ``mbu_percent`` against the first peak), ``nvml`` (``time_s`` and every ``nvml.Sample``
        field over the decode steps, None where N/A) or None, ``nvml_summary``
        (``nvml.summarize`` of those samples) or None, ``nvml_unavailable`` (why there is no
        NVML reading, else None) and ``na_reasons`` (field -> why it is N/A).
    """
    why = None
    if sampler == "auto":
        if engine.device.type == "cuda":
            sampler = TelemetrySampler(engine.device, interval_s=interval_s)
        else:
            sampler, why = (
                None,
                (f"no NVIDIA GPU: the engine runs on the {engine.device.type}, and NVML reports on NVIDIA GPUs only"),
            )
    elif sampler is None:
        why = "telemetry switched off"
    if sampler is not None:
        why = sampler.start().unavailable_reason
    try:
        steps = decode_for(engine, prompts, seconds)
    finally:
        samples = sampler.stop() if sampler is not None else []
    dtype_bytes = engine.dtype.itemsize
    origin = steps[0].start_s
    per_step = [phase_utilization(engine.model_config, dtype_bytes, [s], peaks[:1])[peaks[0].source] for s in steps]
    in_run = [s for s in samples if origin <= s.time_s <= steps[-1].start_s + steps[-1].duration_s]
    nvml = None
    if sampler is not None and sampler.available:
        nvml = {"time_s": [s.time_s - origin for s in in_run]} | {
            f: [getattr(s, f) for s in in_run] for f in VALUE_FIELDS
        }
    return {
        "batch_size": len(prompts),
        "num_steps": len(steps),
        "duration_s": steps[-1].start_s + steps[-1].duration_s - origin,
        "decode_step_ms": 1e3 * statistics.median(s.duration_s for s in steps),
        "utilization": phase_utilization(engine.model_config, dtype_bytes, steps, peaks),
        "steps": {
            "time_s": [s.start_s - origin for s in steps],
            "mfu_percent": [u["mfu_percent"] for u in per_step],
            "mbu_percent": [u["mbu_percent"] for u in per_step],
        },
        "nvml": nvml,
        "nvml_summary": summarize(in_run) if nvml is not None else None,
        "nvml_unavailable": why,
        "na_reasons": dict(sampler.na_reasons) if sampler is not None else {},
    }


def format_utilization(result: dict, source: str = "measured") -> list[str]:
    """``utilization_rows`` as a table: figure, its value here, and what it measures."""
    lines = [f"{'figure':<24} {'here':<32} what it measures"]
    lines += [f"{name:<24} {value:<32} {meaning}" for name, value, meaning in utilization_rows(result, source)]
    return lines


def utilization_rows(result: dict, source: str = "measured") -> list[tuple[str, str, str]]:
    """``decode_utilization``'s figures as table rows: (figure, value here, what it measures).

    An NVML field the GPU cannot report reads "N/A: why"; with no NVML at all it reads "N/A"
    (``result["nvml_unavailable"]`` says why, once).
    """
    summary = result.get("nvml_summary") or {}
    reasons = result.get("na_reasons") or {}

    def nvml(field: str) -> str:
        value = summary.get(f"{field}_median")
        if value is not None:
            return f"{format_percent(value)} (median of {summary['num_samples']} samples)"
        return "N/A" if result.get("nvml_unavailable") else f"N/A: {reasons.get(field, 'not reported')}"

    u = result["utilization"][source]
    return [
        ("util.gpu (NVML)", nvml("util_gpu_percent"), "share of time at least one kernel ran"),
        ("SM occupancy (GPM)", nvml("sm_occupancy_percent"), "warps resident on the SMs / the most they hold"),
        ("DRAM bandwidth (GPM)", nvml("dram_bw_util_percent"), "bytes moved / peak bandwidth, as the GPU counts them"),
        ("tensor activity (GPM)", nvml("tensor_util_percent"), "share of time tensor cores ran"),
        (f"MFU ({source} peak)", format_percent(u["mfu_percent"]), "FLOP/s the steps needed / peak FLOP/s"),
        (f"MBU ({source} peak)", format_percent(u["mbu_percent"]), "bytes/s the steps needed / peak bandwidth"),
    ]


def trace_series(result: dict, source: str = "measured") -> dict:
    """``decode_utilization``'s result as ``viz.phases.utilization_trace`` series: NVML's util.gpu and
    the GPM fields it reported (a field N/A throughout is left out, not drawn as 0), and MFU and
    MBU per step (against the first peak, named ``source``)."""
    series = {}
    nvml = result.get("nvml")
    if nvml:
        for field, label in (
            ("util_gpu_percent", "util.gpu % (NVML)"),
            ("sm_occupancy_percent", "SM occupancy % (GPM)"),
            ("dram_bw_util_percent", "DRAM bandwidth % (GPM)"),
        ):
            if any(v is not None for v in nvml[field]):
                series[label] = (nvml["time_s"], nvml[field])
    steps = result["steps"]
    series[f"MFU % per step ({source} peak)"] = (steps["time_s"], steps["mfu_percent"])
    series[f"MBU % per step ({source} peak)"] = (steps["time_s"], steps["mbu_percent"])
    return series


# -- where a step's time goes ----------------------------------------------------------------------


def is_matmul(name: str) -> bool:
    """A matrix product: one of ``MATMUL_OPS``, or a GPU kernel named as a GEMM/GEMV library's."""
    return name in MATMUL_OPS or (
        not name.startswith("aten::") and any(p in name.lower() for p in GEMM_KERNEL_PATTERNS)
    )


def op_shares(op_us: dict[str, float], wall_us: float, top: int = 12) -> dict:
    """Split a run's wall time into matrix products, other ops, and time outside any op.

    Args:
        op_us: op name -> self time (us) over the run, as ``torch.profiler`` totals it (self
            times of nested ops do not overlap, so they add up).
        wall_us: the run's wall time (us); what the ops do not cover is Python and bookkeeping.
    Returns:
        ``wall_us``, ``matmul_us``, ``other_ops_us``, ``outside_ops_us`` (>= 0), their shares of
        the wall time (``matmul_share``, ``other_ops_share``, ``outside_ops_share``), and
        ``top_ops``: the ``top`` largest ``[name, us, is_matmul]`` with the outside time among them.
    Raises:
        ValueError: ``wall_us`` <= 0 or a negative op time.
    """
    if wall_us <= 0 or any(us < 0 for us in op_us.values()):
        raise ValueError(f"need wall_us > 0 and op times >= 0; got wall_us={wall_us}")
    matmul = sum(us for name, us in op_us.items() if is_matmul(name))
    other = sum(us for name, us in op_us.items() if not is_matmul(name))
    outside = max(0.0, wall_us - matmul - other)
    rows = [[name, us, is_matmul(name)] for name, us in op_us.items() if us > 0] + [[OUTSIDE_OPS, outside, False]]
    rows.sort(key=lambda r: -r[1])
    return {
        "wall_us": wall_us,
        "matmul_us": matmul,
        "other_ops_us": other,
        "outside_ops_us": outside,
        "matmul_share": matmul / wall_us,
        "other_ops_share": other / wall_us,
        "outside_ops_share": outside / wall_us,
        "top_ops": rows[:top],
    }


def op_times(events) -> tuple[dict[str, float], dict[str, float]]:
    """Self times (us) by name from ``torch.profiler``'s ``key_averages()``: (host ops, device).

    Host: every CPU-side event's self CPU time (aten ops, and on CUDA the runtime's launch calls).
    Device: the self time of every GPU-side event (kernels, memcpys), keyed by kernel name; with
    no GPU-side rows (older profilers attach kernels to their op), the ops' self device time.
    """
    cpu_us: dict[str, float] = {}
    device_us: dict[str, float] = {}
    op_device_us: dict[str, float] = {}
    for e in events:
        device = getattr(e, "self_device_time_total", None)
        device = getattr(e, "self_cuda_time_total", 0.0) if device is None else device  # torch before 2.4
        if getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU:
            cpu_us[e.key] = cpu_us.get(e.key, 0.0) + e.self_cpu_time_total
            if device:
                op_device_us[e.key] = op_device_us.get(e.key, 0.0) + device
        elif device:
            device_us[e.key] = device_us.get(e.key, 0.0) + device
    return cpu_us, device_us or op_device_us


@contextmanager
def decoding(engine: LLMEngine, prompts: Sequence[Sequence[int]], max_tokens: int, warm_steps: int = 0):
    """A batch of ``prompts`` ready to decode: queued, prefilled, ``warm_steps`` decode steps run;
    the block steps its decodes (``max_tokens`` each at most). Afterwards the requests are
    aborted and released, leaving the engine as it was. Yields their request ids."""
    params = SamplingParams.fixed_length(max_tokens)
    ids = [engine.add_request(list(p), params) for p in prompts]
    seqs = [engine.requests[i].seq for i in ids]
    try:
        while any(len(s.output_token_ids) <= warm_steps for s in seqs):
            engine.step()  # the prefills (each emits a first token), then the warm decode steps
        yield ids
    finally:
        for i in ids:
            engine.abort_request(i)
            engine.release_request(i)


def decode_ops(engine: LLMEngine, prompts: Sequence[Sequence[int]]) -> dict:
    """The ops one decode step of ``len(prompts)`` sequences dispatches (``measure.op_count``),
    counted after the prefill: ``step_ops`` in all, and per decoder layer ``computing_per_layer``
    and ``ops_per_layer`` (views included). On a GPU each computing op is a kernel launch."""
    layers = engine.model.layers
    with decoding(engine, prompts, 4), OpCounter() as whole, count_layer_ops(layers) as inside:
        engine.step()
    per_layer = inside.result()
    return {
        "batch_size": len(prompts),
        "step_ops": whole.result().total,
        "computing_per_layer": per_layer.computing / len(layers),
        "ops_per_layer": per_layer.total / len(layers),
    }


def profile_decode(engine: LLMEngine, prompts: Sequence[Sequence[int]], steps: int = 8) -> dict:
    """``steps`` decode steps of ``len(prompts)`` sequences under ``torch.profiler``; where the time went.

    The prompts are prefilled and one decode step runs before profiling starts. On CUDA the
    profiler also records kernel time on the device. The profiler adds its own cost to every op,
    so ``step_ms`` here reads higher than an unprofiled step: compare shares, not seconds.
    Returns:
        ``batch_size``, ``steps``, ``step_ms`` (profiled), ``cpu`` (``op_shares`` of the host ops'
        self CPU time against the wall time) and ``device`` (``op_shares`` of the GPU kernels'
        time against the same wall time, on CUDA: what it leaves is the GPU idle; else None).
        See ``op_times``.
    Raises ``ValueError`` for ``steps`` < 1 or no prompts.
    """
    if steps < 1 or not prompts:
        raise ValueError(f"need steps >= 1 and at least one prompt; got steps={steps}, {len(prompts)} prompts")
    cuda = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with decoding(engine, prompts, steps + 2, warm_steps=1), profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        wall_us = (time.perf_counter() - start) * 1e6
    cpu_us, device_us = op_times(prof.key_averages())
    return {
        "batch_size": len(prompts),
        "steps": steps,
        "step_ms": wall_us / steps / 1e3,
        "cpu": op_shares(cpu_us, wall_us),
        "device": op_shares(device_us, wall_us) if cuda else None,
    }


# CUDA graphs: eager TPOT over graphed TPOT at or above this says the graphs removed a cost the step
# was bound by (launches and host work between kernels), beyond what noise or a warm cache explains.
GRAPHS_GAIN_X = 1.2


def graphs_verdict(eager_step_ms: float, graphs_step_ms: float, *, cuda: bool) -> str:
    """Beyond the articles: a small model's batch-1 decode on a GPU is bound by kernel launches before
    bandwidth, so CUDA graphs (``enforce_eager=False``, the default on CUDA) shorten its step by
    ``GRAPHS_GAIN_X`` or more against ``enforce_eager=True``. ``*_step_ms``: median decode step
    (``decode_utilization``'s ``decode_step_ms``). On a CPU (``cuda`` False) there are no kernel
    launches and both engines run the same code: not testable. The two timings are noisy: judge
    through ``course.claims.verdict`` with the run's noise."""
    if not cuda:
        return "not testable here: a CPU launches no kernels, both engines run the same eager code"
    gain = eager_step_ms / graphs_step_ms
    if gain >= GRAPHS_GAIN_X:
        return f"holds: CUDA graphs cut TPOT {gain:.2f}x"
    return f"does not hold here: CUDA graphs cut TPOT only {gain:.2f}x (the step is not launch-bound)"
