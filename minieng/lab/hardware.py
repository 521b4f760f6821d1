"""Notebook 00's plumbing: the ceilings beside the datasheet, the table of steps on the roofline, the
bound of each phase, and the worked answer of its pencil problem. The notebook keeps the physics (the
ceilings' call, ``prefill_work``/``decode_work``, ``attainable_flops``, the plot call); this formats.
"""

from __future__ import annotations

from collections.abc import Sequence

from minieng.measure.flops_bytes import StepWork
from minieng.measure.peaks import Peak

# An x86 core with two 256-bit FMA units (AVX2): 2 units x 8 fp32 lanes x 2 FLOP (multiply + add) a cycle.
AVX2_FP32_FLOP_PER_CYCLE = 32
ASSUMED_CLOCK_HZ = 3e9  # the pencil problem's CPU clock: an assumption, said as one
# What one DDR4-3200 channel moves at most (64 bits x 3.2 GT/s); DDR5-4800 moves 38.4 GB/s.
DDR4_CHANNEL_GBPS = 25.6


def against_datasheet(peak: Peak, datasheet: Peak | None) -> list[str]:
    """The measured ridge, and the ceilings as a share of the datasheet's (or why there is none)."""
    lines = [f"ridge point {peak.ridge_flop_per_byte:8.1f} FLOP/byte (measured peak / measured bandwidth)"]
    if datasheet is None:
        return lines + ["no datasheet for this device: every MFU/MBU here is against the measured ceilings"]
    return lines + [
        f"datasheet   {datasheet.peak_tflops:8.1f} TFLOP/s, {datasheet.bandwidth_gbps:.0f} GB/s, "
        f"ridge {datasheet.ridge_flop_per_byte:.0f} FLOP/byte",
        f"measured = {100 * peak.peak_tflops / datasheet.peak_tflops:.0f}% of the datasheet's FLOP/s, "
        f"{100 * peak.bandwidth_gbps / datasheet.bandwidth_gbps:.0f}% of its bandwidth",
    ]


def bound(work: StepWork, ridge: float) -> str:
    """ "compute" when the step's arithmetic intensity is right of the ridge (FLOP/byte), else "memory"."""
    return "compute" if work.arithmetic_intensity_flop_per_byte > ridge else "memory"


def phase_bounds(prefill: StepWork, decode: StepWork, ridge: float) -> str:
    """Which limit binds each phase: "prefill compute, decode memory" and the like."""
    return f"prefill {bound(prefill, ridge)}, decode {bound(decode, ridge)}"


def phase_bounds_answer(prefill: StepWork, decode: StepWork, ridge: float) -> str:
    """The worked answer of 00's pencil problem on the phases (Markdown): each step's FLOPs over its
    bytes (its arithmetic intensity) set against the measured ridge (FLOP/byte)."""
    lines = []
    for what, w in (("the prefill", prefill), ("the decode step", decode)):
        lines.append(
            f"- {what}: {w.total_flops / 1e9:.3g} GFLOP / {w.total_bytes / 1e6:.3g} MB = "
            f"**{w.arithmetic_intensity_flop_per_byte:.3g} FLOP/byte**, {_side(w, ridge)} of the ridge: "
            f"{bound(w, ridge)}-bound"
        )
    return "\n".join(
        [
            f"Each step's FLOPs over the bytes it must move (weights, K and V), against this machine's measured "
            f"ridge of **{ridge:.3g} FLOP/byte**:",
            "",
            *lines,
            "",
            f"So **{phase_bounds(prefill, decode, ridge)}**. Prefill's intensity grows with the prompt (each "
            "weight read serves every prompt token); a batch-1 decode step's stays near 2 FLOP per weight / its bytes per weight (1 in bf16, 0.5 in fp32).",
        ]
    )


def _side(work: StepWork, ridge: float) -> str:
    return "right" if work.arithmetic_intensity_flop_per_byte > ridge else "left"


def step_table(steps: Sequence[tuple[str, StepWork]], ridge: float) -> str:
    """Each step's GFLOP, MB moved, intensity and bound against ``ridge``, as a text table."""
    lines = [f"{'step':<18} {'GFLOP':>8} {'MB moved':>9} {'FLOP/byte':>10}  bound by"]
    for label, w in steps:
        lines.append(
            f"{label:<18} {w.total_flops / 1e9:8.2f} {w.total_bytes / 1e6:9.1f} "
            f"{w.arithmetic_intensity_flop_per_byte:10.1f}  {bound(w, ridge)}"
        )
    return "\n".join(lines + [f"ridge point: {ridge:.1f} FLOP/byte"])


def ceilings_answer(datasheet: Peak | None, threads: int, dtype: str) -> str:
    """The worked answer of 00's pencil problem on the ceilings (Markdown): the datasheet's figures and
    ridge where the device has one; for a CPU, the peak on paper (threads x clock x FLOP a cycle) and a
    memory channel's bandwidth, each assumption named."""
    if datasheet is not None:
        return (
            f"The datasheet of this {datasheet.name}: {datasheet.peak_tflops:g} TFLOP/s dense bf16/fp16 and "
            f"{datasheet.bandwidth_gbps:g} GB/s, so a ridge of {datasheet.peak_tflops:g}e12 / "
            f"{datasheet.bandwidth_gbps:g}e9 = **{datasheet.ridge_flop_per_byte:.0f} FLOP/byte**. A measured "
            "ceiling lands below both: clocks, power limits, and no real kernel reaches a datasheet's figure."
        )
    peak_gflops = threads * ASSUMED_CLOCK_HZ * AVX2_FP32_FLOP_PER_CYCLE / 1e9
    return (
        f"A CPU has no datasheet peak: work one out. torch runs {threads} threads here; at an assumed "
        f"{ASSUMED_CLOCK_HZ / 1e9:g} GHz and {AVX2_FP32_FLOP_PER_CYCLE} {dtype} FLOP a cycle (two AVX2 FMA units), "
        f"{threads} x {ASSUMED_CLOCK_HZ / 1e9:g}e9 x {AVX2_FP32_FLOP_PER_CYCLE} = **{peak_gflops:.0f} GFLOP/s** at most. "
        f"One DDR4-3200 memory channel moves {DDR4_CHANNEL_GBPS} GB/s (a laptop or a VM often has one or two): "
        f"a ridge near {peak_gflops:.0f} / {DDR4_CHANNEL_GBPS} = **{peak_gflops / DDR4_CHANNEL_GBPS:.0f} FLOP/byte** "
        "with one channel, half that with two, far below a GPU's hundreds."
    )
