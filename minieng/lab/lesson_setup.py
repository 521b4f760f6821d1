"""What notebooks 02 to 05, 08, 11 and 12 print after building their engine, and the keys of their cached results.

``device_peaks``: the measured ceilings and, on a GPU the datasheet knows, its datasheet peak (the
articles' MFU is against the datasheet); ``format_peaks`` prints them. ``format_probe``: ``probes.probe_speed``'s result in one
line. ``result_key``: the parameters a ``course.cached`` result is stored under, with the model,
device and dtype that make it this run's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minieng.engine.llm_engine import LLMEngine
from minieng.measure.peaks import Peak, datasheet_peak


def device_peaks(engine: LLMEngine, measured: Peak) -> list[Peak]:
    """``[measured]`` (the machine's ceilings), plus the datasheet peak of the engine's GPU where
    ``peaks.datasheet_peak`` knows it (none on a CPU)."""
    sheet = datasheet_peak(torch.cuda.get_device_name(engine.device)) if engine.device.type == "cuda" else None
    return [measured] + ([sheet] if sheet else [])


def format_peaks(peaks: Sequence[Peak]) -> list[str]:
    """One line per peak: its FLOP/s, bandwidth and ridge point; a note when no datasheet is known."""
    lines = [
        f"{p.source:<9} peak {p.peak_tflops:.3g} TFLOP/s, {p.bandwidth_gbps:.3g} GB/s: "
        f"ridge {p.ridge_flop_per_byte:.3g} FLOP/byte ({p.name})"
        for p in peaks
    ]
    if len(peaks) == 1:
        lines.append("no datasheet for this device: MFU and MBU are against the measured ceilings only")
    return lines


def format_probe(probe: dict) -> str:
    """``probe_speed``'s result in one line: the best prefill tok/s, a prefill step's fixed cost, a
    batch-1 decode step, and where prefill tok/s stopped growing (or that it had not)."""
    knee = (
        f"stops growing at {probe['knee_tokens']} tokens"
        if probe["knee_reached"]
        else f"was still growing at {probe['knee_tokens']} tokens, the longest probed"
    )
    return (
        f"probe: prefill up to {probe['prefill_tok_s']:.0f} tok/s, a prefill step's fixed cost about "
        f"{probe['overhead_s'] * 1e3:.1f} ms, a batch-1 decode step about {probe['decode_step_s'] * 1e3:.1f} ms; "
        f"prefill tok/s {knee}"
    )


def result_key(engine: LLMEngine, model_name: str, **params) -> dict:
    """The parameters of a cached measurement (``course.cached``): ``params`` with the model's name
    and the engine's device and dtype, so a result is never read back for another of them."""
    return {"model": model_name, **params, "device": str(engine.device), "dtype": str(engine.dtype)}
