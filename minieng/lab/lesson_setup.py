"""What notebooks 04, 05, 08 and 12 print after building their engine, and the keys of their cached results.

``device_peaks``: the measured ceilings and, on a GPU the datasheet knows, its datasheet peak (the
articles' MFU is against the datasheet). ``format_probe``: ``probes.probe_speed``'s result in one
line. ``result_key``: the parameters a ``course.cached`` result is stored under, with the model,
device and dtype that make it this run's.
"""

from __future__ import annotations

import torch

from minieng.engine.llm_engine import LLMEngine
from minieng.measure.peaks import Peak, datasheet_peak


def device_peaks(engine: LLMEngine, measured: Peak) -> list[Peak]:
    """``[measured]``, plus the datasheet peak of the engine's GPU where ``peaks.datasheet_peak``
    knows it (none on a CPU)."""
    if engine.device.type != "cuda":
        return [measured]
    sheet = datasheet_peak(torch.cuda.get_device_name(engine.device))
    return [measured] + ([sheet] if sheet else [])


def format_peaks(peaks: list[Peak]) -> list[str]:
    """One line per peak: its source, TFLOP/s, GB/s and ridge point."""
    return [
        f"{p.source} peak: {p.peak_tflops:.3g} TFLOP/s, {p.bandwidth_gbps:.3g} GB/s, ridge {p.ridge_flop_per_byte:.3g} "
        "FLOP/byte"
        for p in peaks
    ]


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
