"""Memory, for issue 33's predictions: the peak bytes a parameter while a bf16 model is built
(``load-peak-bytes``), and notebook 10's engines held to a T4's memory (``nb10-t4``)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable

import torch

from minieng.config import published_config
from minieng.engine.llm_engine import LLMEngine
from .checkpoints import release
from .verdicts import decide
from minieng.measure.allocations import AllocationTrace
from minieng.model.loader import build_model, randomize

GIB = 1024**3


def load_peak(device: torch.device, smoke: bool) -> list[dict]:
    """Peak bytes a parameter while ``loader.build_model`` builds a bf16 model and
    ``loader.randomize`` fills it (what ``load_format="dummy"`` does): on CUDA the allocator's peak
    (``torch.cuda.max_memory_allocated``) over Llama-3-8B; elsewhere a dispatch trace
    (``measure.allocations.AllocationTrace``) over SmolLM2-135M (``smoke``, or any CPU: an 8B on a
    CPU takes minutes to fill)."""
    cuda = device.type == "cuda"
    name = "Llama-3-8B" if cuda and not smoke else "SmolLM2-135M"
    config = published_config(name)
    max_position = 256 if name == "SmolLM2-135M" else 8192
    if cuda:
        release()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        model = build_model(config, torch.bfloat16, device, max_position)
        randomize(model)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        method = "torch.cuda.max_memory_allocated"
        fp32_largest = None
    else:
        with AllocationTrace(device.type) as trace:
            model = build_model(config, torch.bfloat16, device, max_position)
            randomize(model)
        peak, method, fp32_largest = (
            trace.peak_bytes,
            "dispatch trace (measure.allocations)",
            trace.largest(torch.float32),
        )
    params = sum(p.numel() for p in model.parameters())
    del model
    release()
    details = {
        "model": name,
        "params": params,
        "peak_bytes": peak,
        "method": method,
        "largest_fp32_bytes": fp32_largest,
    }
    return [decide("load-peak-bytes", peak / params, f"{name}, {method}", details)]


# -- notebook 10 under a T4's memory ----------------------------------------------------------------

T4_MEMORY_CAP_GIB = 14.5  # a T4's 15 GiB less the CUDA context's share (tests/course/test_t4_memory.py)
T4_BANDWIDTH_BYTES_S = 320e9  # the T4's datasheet bandwidth, as tests/course/test_t4_memory.py picks its model
T4_FIXED_COST_PER_LAYER_S = 20e-6  # a graph replay's cost per layer, the same test's figure
T4_CUDA_CONTEXT_BYTES = 300 * 1024**2
NOTEBOOK10_KV_GIB = 1  # its KV_CACHE_GIB
NOTEBOOK10_CAPS = [(1, 512), (8, 1024), (64, 8192)]  # its CAPS in full mode


def notebook10_engine_set(device: torch.device) -> dict:
    """Notebook 10's engines in the order it builds them, on ``device``, as on a T4: the model
    ``course_model`` picks for a T4 (``model_choice.choose_model`` on its bandwidth and memory)
    with dummy weights in fp16, a 1 GiB pool; the embedded model's probe engine beside it (the 135M
    shape); the batch-cap sweep (``goodput.batch_cap_sweep``, its full-mode caps) and
    ``disaggregation.compare_disaggregation`` with the real-time baseline, over 24 requests of its
    workload (the trace's quantiles, lengths x 0.25, at most 512 prompt and 64 output tokens),
    arriving at once (the widest batches: the most memory). Returns what it ran."""
    from minieng.lab.disaggregation import compare_disaggregation  # lazy: these lessons' modules are heavy
    from minieng.lab.goodput import batch_cap_sweep
    from minieng.measure.metrics import SLO
    from minieng.measure.model_choice import choose_model
    from minieng.measure.workloads import sampled_trace_workload, scale_workload

    name = choose_model(T4_BANDWIDTH_BYTES_S, 15 * GIB - T4_CUDA_CONTEXT_BYTES, 2, T4_FIXED_COST_PER_LAYER_S).name
    common = dict(load_format="dummy", dtype="float16", device=str(device))
    probe = LLMEngine(model="SmolLM2-135M", kv_cache_memory_gib=0.25, max_model_len=1024, **common)
    engine = LLMEngine(model=name, kv_cache_memory_gib=NOTEBOOK10_KV_GIB, **common)
    specs = scale_workload(sampled_trace_workload(24, "conv", seed=0), 1.0, 0.25, 512, 64)
    specs = scale_workload(specs, time_scale=0.0)
    slo = SLO(ttft_ms=1000.0, tpot_ms=100.0)  # goodput is not what this run reads
    sweep = batch_cap_sweep(engine, specs, NOTEBOOK10_CAPS, slo)
    disagg = compare_disaggregation(engine, specs, slo, num_prefill=1, num_decode=1, real_time_baseline=True)
    del probe, engine
    release()
    return {
        "model": name,
        "sweep_points": len(sweep["points"]),
        "comparison_runs": [r["name"] for r in disagg["runs"]],
    }


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the device ran out of memory (torch's error, or a library's failed
    allocation: cuBLAS's ``CUBLAS_STATUS_ALLOC_FAILED``)."""
    text = str(e)
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in text.lower() or "ALLOC_FAILED" in text


def under_memory_cap(call: Callable[[], object], device: torch.device, cap_gib: float, cuda=torch.cuda) -> dict:
    """``nb10-t4``: ``call()`` with the process held to ``cap_gib`` of the device
    (``cuda.set_per_process_memory_fraction``, restored to 1 afterwards, whatever happens): the
    peak reserved (``cuda.max_memory_reserved``, GiB) against the cap, or, REFUTED with an infinite
    figure, an out-of-memory error or a fast path an engine dropped for want of memory (a CUDA graph
    capture that fell back to eager with a warning: it ran, but did not fit). What the process held
    before the call (``held_before_gib``: the section runs it first, so little) counts against the
    cap as it would not on a T4, and is reported. ``cuda``: the
    ``torch.cuda`` module (tests pass a fake). Errors other than out-of-memory propagate."""
    gc.collect()
    cuda.empty_cache()
    held_before_gib = cuda.memory_allocated(device) / GIB  # what earlier checks left: it counts against the cap
    total = cuda.get_device_properties(device).total_memory
    cuda.reset_peak_memory_stats(device)
    cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / total), device)
    oom = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ran = call()
    except Exception as e:  # noqa: BLE001 (out of memory is the finding; anything else propagates)
        if not out_of_memory(e):
            raise
        oom, ran = f"{type(e).__name__}: {str(e)[:200]}", None
        caught = []
    finally:
        cuda.set_per_process_memory_fraction(1.0, device)
        gc.collect()
        cuda.empty_cache()
    peak = cuda.max_memory_reserved(device) / GIB
    allocated = cuda.max_memory_allocated(device) / GIB
    dropped = [str(w.message)[:200] for w in caught if out_of_memory(w.message)]
    details = {
        "ran": ran,
        "held_before_gib": held_before_gib,
        "peak_reserved_gib": peak,
        "peak_allocated_gib": allocated,
        "dropped": dropped,
    }
    if oom or dropped:
        why = (
            f"out of memory under {cap_gib:g} GiB: {oom}"
            if oom
            else f"{len(dropped)} fast path(s) dropped: {dropped[0]}"
        )
        return decide("nb10-t4", float("inf"), f"{why} (peak {peak:.2f} GiB reserved)", details)
    return decide(
        "nb10-t4",
        peak,
        f"peak {allocated:.2f} GiB allocated, {peak:.2f} reserved: a margin of {cap_gib - peak:.2f} GiB "
        "(no allocation failed; the engines' pools are fixed, as on a T4)",
        details,
    )
