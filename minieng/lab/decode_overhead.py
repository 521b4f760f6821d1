"""Notebook 04's plumbing: what its decode runs say in words, the engines it compares (eager, CUDA
graphs, compiled), and the worked answers its pencil problems reveal.

The measurements are ``gpu_utilization.decode_utilization`` and ``gpu_utilization.profile_decode``;
this module builds the engines they run on, formats their results and reads them against the
napkin model's floor (``measure.napkin``).
"""

from __future__ import annotations

from minieng.engine.llm_engine import LLMEngine
from minieng.measure.roofline import format_percent


def util_answer(napkin, prompt_tokens: int) -> str:
    """A worked answer (Markdown) to "during batch-1 decode, util.gpu near 5, 50 or 100%? And MFU?",
    from the napkin's batch-1 decode step (``NapkinEstimate``): MFU at the floor is its compute floor
    over its bandwidth floor; util.gpu counts time any kernel runs, whatever it computes."""
    mfu = 100 * napkin.tpot_compute_floor_s / napkin.tpot_floor_s
    return (
        f"The napkin's batch-1 decode step ({prompt_tokens}-token context) reads {napkin.weights_bytes / 1e6:,.0f} MB "
        f"of weights at {napkin.bandwidth_gbps:,.0f} GB/s: **{napkin.tpot_bandwidth_floor_s * 1e3:.2f} ms** at the "
        f"floor, while its FLOPs need {napkin.tpot_compute_floor_s * 1e3:.3f} ms of the {napkin.peak_tflops:.3g} "
        f"TFLOP/s peak. So MFU is at most **{format_percent(mfu)}**, and less where the step is slower than its "
        "floor. util.gpu counts the share of time *any* kernel runs: a decode step is hundreds of kernels back to "
        "back, so it reads **near 100%** whatever each kernel uses. The article's 4-6% is an MFU-like figure, "
        "not what NVML's util.gpu shows."
    )


def util_lines(result: dict) -> list[str]:
    """``decode_utilization``'s batch-1 result in words: util.gpu against MFU and MBU, or, with no
    NVML reading, what util.gpu would read on an NVIDIA GPU."""
    u = result["utilization"]["measured"]
    util = (result["nvml_summary"] or {}).get("util_gpu_percent_median")
    if util is None:
        return [
            "No NVML reading here: " + (result["nvml_unavailable"] or "the GPU reported no util.gpu") + ".",
            "On an NVIDIA GPU this decode would keep some kernel running for most of each sample period, so util.gpu "
            f"would read high while MFU stayed near its {format_percent(u['mfu_percent'])} here.",
        ]
    return [
        f"util.gpu read {format_percent(util)} while the steps reached {format_percent(u['mfu_percent'])} MFU and "
        f"{format_percent(u['mbu_percent'])} MBU: util.gpu / MFU = {util / max(u['mfu_percent'], 1e-9):.0f}x."
    ]


def matmul_share(prof: dict) -> float:
    """The matrix products' share of a profiled step (``profile_decode``): of the GPU's kernel time
    where there is one, else of the host's."""
    return (prof["device"] or prof["cpu"])["matmul_share"]


def format_profile(prof: dict) -> list[str]:
    """``profile_decode``'s result in words: the step, the host's shares (products, other ops,
    outside any op) and, on a GPU, the kernels' shares and the idle time."""
    cpu = prof["cpu"]
    lines = [
        f"{prof['steps']} profiled decode steps, {prof['step_ms']:.1f} ms each (the profiler adds its own cost)",
        f"host (CPU) time: matrix products {format_percent(100 * cpu['matmul_share'])}, other ops "
        f"{format_percent(100 * cpu['other_ops_share'])}, outside any op {format_percent(100 * cpu['outside_ops_share'])}",
    ]
    if prof["device"]:
        dev = prof["device"]
        idle = max(0.0, 1 - dev["matmul_share"] - dev["other_ops_share"])
        lines.append(
            f"GPU time: matrix-product kernels {format_percent(100 * dev['matmul_share'])} of the wall time, other "
            f"kernels {format_percent(100 * dev['other_ops_share'])}; idle {format_percent(100 * idle)}"
        )
    return lines


def overhead_answer(napkin, step_ms: float) -> str:
    """A worked answer (Markdown) to "what can graphs or compilation remove?": the napkin's batch-1
    floor (bytes / bandwidth) against the measured step ``step_ms``; what lies above the floor is
    overhead, the most either lever can take away. Graphs cut the host's share, so TPOT falls and
    MBU rises by the same factor; util.gpu may rise, with fewer gaps between kernels."""
    floor_ms = napkin.tpot_floor_s * 1e3
    above = max(0.0, 1 - floor_ms / step_ms)
    return (
        f"The napkin's floor for this step is **{floor_ms:.2f} ms** (its bytes over the measured bandwidth); the "
        f"step measured in section 2 took **{step_ms:.2f} ms**. Everything above the floor, "
        f"**{format_percent(100 * above)}** of the step, is overhead: the most CUDA graphs or compilation can remove. "
        "Graphs remove launch gaps: TPOT falls, MBU rises by the same factor (the bytes do not change), and "
        "util.gpu can *rise*, with fewer idle gaps between kernels. Compilation fuses the small ops between the "
        "matrix products; it cannot shorten the products themselves."
    )


def engine_modes(engine: LLMEngine, kv_cache_memory_gib: float) -> tuple[dict[str, LLMEngine], str]:
    """Three engines sharing ``engine``'s weights: ``enforce_eager=True``, the default (CUDA graphs
    on CUDA) and ``compile=True``, by label; and a line on what the compiler did at start-up."""
    eager = LLMEngine(loaded=engine.loaded, enforce_eager=True, kv_cache_memory_gib=kv_cache_memory_gib)
    compiled = LLMEngine(loaded=engine.loaded, compile=True, kv_cache_memory_gib=kv_cache_memory_gib)
    runner = compiled.runner
    label = "compile=True" if runner.fast.regions is not None else "compile=True (no compiler: eager)"
    if runner.fast.compile_s is None:
        line = "compile=True: no compiler here, the engine runs eager"
    else:
        whole = " and the whole decode step" if runner.fast.compiled_decode is not None else ""
        line = f"compile=True compiled the layers' dense parts{whole} in {runner.fast.compile_s:.1f} s at start-up"
    return {"enforce_eager=True": eager, "default (graphs on CUDA)": engine, label: compiled}, line


def util_gpu(result: dict) -> float | None:
    """The median util.gpu of a ``decode_utilization`` run, None without NVML."""
    return (result["nvml_summary"] or {}).get("util_gpu_percent_median")


def format_modes(modes: dict[str, dict], cuda: bool) -> list[str]:
    """``decode_utilization`` results by engine label (eager, default, compiled, in that order):
    TPOT, MBU, MFU and util.gpu each, then eager and compiled TPOT over the default's."""
    lines = [f"{'engine':<34} {'TPOT ms':>8} {'MBU':>8} {'MFU':>8} {'util.gpu':>9}"]
    for label, r in modes.items():
        u = r["utilization"]["measured"]
        lines.append(
            f"{label:<34} {r['decode_step_ms']:>8.2f} {format_percent(u['mbu_percent']):>8} "
            f"{format_percent(u['mfu_percent']):>8} {format_percent(util_gpu(r)):>9}"
        )
    eager, default, compiled = (r["decode_step_ms"] for r in modes.values())
    note = "" if cuda else ": a CPU runs both eager, so only noise separates them"
    return lines + [
        f"\nTPOT eager / default = {eager / default:.2f}x{note}",
        f"TPOT compiled / default = {compiled / default:.2f}x",
    ]


def utilization_curve(by_batch: dict[int, dict]) -> dict:
    """``viz.curve``'s arguments for ``decode_utilization`` runs by batch size: MFU and MBU, and
    util.gpu where every run has it."""
    sizes = sorted(by_batch)
    us = [by_batch[b]["utilization"]["measured"] for b in sizes]
    series = {"MFU %": [u["mfu_percent"] for u in us], "MBU %": [u["mbu_percent"] for u in us]}
    utils = [util_gpu(by_batch[b]) for b in sizes]
    if all(v is not None for v in utils):
        series["util.gpu % (NVML)"] = utils
    return {
        "xs": sizes,
        "ys": series,
        "xlabel": "batch size (sequences decoding together)",
        "ylabel": "percent",
        "title": "Decode: utilization against batch size",
        "logx": len(sizes) > 1,
    }


def format_utilization_point(result: dict) -> str:
    """One ``decode_utilization`` run in a line: batch, TPOT, MFU, MBU, util.gpu."""
    u = result["utilization"]["measured"]
    return (
        f"batch {result['batch_size']}: TPOT {result['decode_step_ms']:.1f} ms, MFU {format_percent(u['mfu_percent'])}, "
        f"MBU {format_percent(u['mbu_percent'])}, util.gpu {format_percent(util_gpu(result))}"
    )
