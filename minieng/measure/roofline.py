"""Achieved against peak: MFU, MBU, the roofline (attainable FLOP/s, the ridge point, the floors of a
step), and what bounds a measured step. The FLOPs and bytes come from ``work``; the peaks (datasheet or
measured ceiling) from ``peaks``.

What bounds a measured step (``roofline_bound``): the arithmetic or the memory traffic when one
of them accounts for at least a quarter of the time (MFU or MBU >= 25%), else overhead, which is
what a small model shows on a large GPU: a floor of microseconds under a step of milliseconds.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from minieng.config import ModelConfig
from minieng.measure.flops_bytes import step_work
from minieng.model.weight_bytes import MatmulBytes


def format_percent(percent: float | None) -> str:
    """A utilization percentage as text, precise enough to tell 0.03% from 0.3%.

    ``percent`` is already in percent (43.0 for 43%; ``Utilization.percent``, the ``*_percent``
    keys). Below 10%: two significant digits ("0.030%", "0.30%", "4.6%"); from 10%: one decimal
    ("43.2%", "112.0%"). 0 is "0%", None (N/A) is "N/A", never 0. A fixed "{:.1f}%" prints a
    batch-1 decode's MFU on a GPU (~0.03%) as "0.0%", which reads as idle.
    """
    if percent is None:
        return "N/A"
    if percent == 0:
        return "0%"
    if not math.isfinite(percent):
        return f"{percent}%"
    size = abs(percent)
    if size >= 9.95:  # would round to 10: one decimal from here on
        return f"{percent:.1f}%"
    decimals = 1 - math.floor(math.log10(size))  # two significant digits
    if round(size, decimals) >= 10 ** (1 - decimals + 1):  # 0.0996 -> "0.10", keep two digits
        decimals -= 1
    return f"{percent:.{decimals}f}%"


class SuspectFigureWarning(UserWarning):
    """A utilization above 100%: the work count or the peak is wrong, not the hardware magic."""


@dataclass(frozen=True)
class Utilization:
    """A fraction of a peak, flagged when it cannot be true.

    ``fraction`` is achieved / peak (0.43 = 43%). ``suspect`` is True when it exceeds 1: the FLOP
    or byte count is too high, the time too short (an unsynchronized GPU), or the peak too low
    (a measured ceiling below what the step reached). ``str()`` then says SUSPECT beside the
    number, and building it emits a ``SuspectFigureWarning``, so it is never shown as a fact.
    """

    name: str
    fraction: float
    suspect: bool

    @property
    def percent(self) -> float:
        return 100 * self.fraction

    def __float__(self) -> float:
        return self.fraction

    def __str__(self) -> str:
        flag = " (SUSPECT: above the peak; check the count, the timing and which peak)" if self.suspect else ""
        return f"{self.name} {format_percent(self.percent)}{flag}"


def _utilization(name: str, amount: float, seconds: float, peak_per_s: float) -> Utilization:
    if seconds <= 0 or peak_per_s <= 0 or amount < 0:
        raise ValueError(
            f"{name}: need amount >= 0, seconds > 0 and peak > 0; got {amount}, {seconds} s, peak {peak_per_s}/s"
        )
    fraction = amount / seconds / peak_per_s
    suspect = fraction > 1.0
    if suspect:
        warnings.warn(
            f"{name} = {format_percent(100 * fraction)} exceeds 100%: a wrong count or peak",
            SuspectFigureWarning,
            stacklevel=3,
        )
    return Utilization(name, fraction, suspect)


def mfu(flops: float, seconds: float, peak_flops: float) -> Utilization:
    """Model FLOPs utilization: (flops / seconds) / peak_flops, peak in FLOP/s (dense, of the
    dtype; say whether datasheet or measured). Raises ``ValueError`` for seconds or peak <= 0."""
    return _utilization("MFU", flops, seconds, peak_flops)


def mbu(bytes: float, seconds: float, peak_bytes_per_s: float) -> Utilization:
    """Model bandwidth utilization: (bytes / seconds) / peak_bytes_per_s. Raises ``ValueError``
    for seconds or peak <= 0."""
    return _utilization("MBU", bytes, seconds, peak_bytes_per_s)


# -- roofline (Williams, Waterman & Patterson 2009) ---------------------------------------------


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """Roofline: attainable FLOP/s = min(peak_flops, intensity * bandwidth); intensity in
    FLOP/byte, peak in FLOP/s, bandwidth in bytes/s."""
    return min(peak_flops, intensity * bandwidth)


def ridge_point(peak: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the roofline turns flat: peak FLOP/s / bandwidth bytes/s.
    Below it a step is memory-bound, above it compute-bound."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth={bandwidth} bytes/s must be > 0")
    return peak / bandwidth


def tpot_floor_s(bytes_per_step: float, bandwidth: float) -> float:
    """Decode floor: no step can beat its bytes / bandwidth (bytes/s). For decode the bytes are
    the weights (params * bytes per param) plus the KV read: ``StepWork.total_bytes``."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth={bandwidth} bytes/s must be > 0")
    return bytes_per_step / bandwidth


def prefill_floor_s(flops: float, peak_flops: float) -> float:
    """Prefill floor: FLOPs / peak FLOP/s (compute-bound: the bytes hide under the math)."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops={peak_flops} FLOP/s must be > 0")
    return flops / peak_flops


# A roofline floor under a quarter of the measured time: overhead, not physics. A 135M model's
# steps on a large GPU explain 0.5-5% of their time; a 2-core CPU's batch-1 decode moves its bytes
# at 30-70% of a large copy's speed, and is memory-bound.
OVERHEAD_BOUND_BELOW = 0.25


@dataclass(frozen=True)
class Bound:
    """What limits a measured step (or phase): the arithmetic, the memory traffic, or neither.

    ``compute_floor_s`` = FLOPs / peak FLOP/s and ``memory_floor_s`` = bytes / bandwidth are the
    least time the step could take on a machine of that peak; the roofline's floor is the larger.
    ``explained`` = floor / measured time: the share of the time the FLOPs or the bytes account
    for, which is max(MFU, MBU). ``limit`` is "compute" or "memory" (the larger floor) when the
    floor explains at least ``OVERHEAD_BOUND_BELOW`` of the time, else "overhead": most of the
    time went to something neither the arithmetic nor the bytes require,
    such as kernel launches, Python and the host between kernels, or kernels running far below
    the peak. A small model on a large GPU is overhead-bound: its floor is microseconds, its step
    milliseconds.
    """

    seconds: float
    compute_floor_s: float
    memory_floor_s: float

    @property
    def floor_s(self) -> float:
        return max(self.compute_floor_s, self.memory_floor_s)

    @property
    def explained(self) -> float:
        return self.floor_s / self.seconds

    @property
    def limit(self) -> str:
        if self.explained < OVERHEAD_BOUND_BELOW:
            return "overhead"
        return "compute" if self.compute_floor_s >= self.memory_floor_s else "memory"

    def words(self) -> str:
        """One sentence: what bounds the time, with the share the roofline explains."""
        share = format_percent(100 * self.explained)
        side = "FLOPs at the peak" if self.compute_floor_s >= self.memory_floor_s else "bytes at the bandwidth"
        if self.limit == "overhead":
            return (
                f"limited by overhead: the {side} would take {_ms(self.floor_s)} of the {_ms(self.seconds)} "
                f"measured ({share}); the rest is fixed per-step cost (launches, Python, the host) or "
                "kernels far below the peak"
            )
        return f"{self.limit}-bound: the {side} account for {share} of the {_ms(self.seconds)} measured"


def phase_ratio_floor(
    prefill_flops: float, prompt_tokens: int, decode_bytes_per_step: float, peak_flops: float, bandwidth: float
) -> float:
    """The prefill-to-decode throughput ratio the roofline predicts: a prefill of ``prompt_tokens``
    at its compute floor (``prefill_flops`` / ``peak_flops``) against batch-1 decode at its bandwidth
    floor (``decode_bytes_per_step`` / ``bandwidth``, bytes/s), each in tokens per second:
    (prompt_tokens / prefill floor) / (1 / decode floor). Roughly the ridge point times the bytes
    per parameter over 2: it grows with the device's ridge (docs/architecture.md section 4)."""
    prefill_tok_s = prompt_tokens / prefill_floor_s(prefill_flops, peak_flops)
    decode_tok_s = 1 / tpot_floor_s(decode_bytes_per_step, bandwidth)
    return prefill_tok_s / decode_tok_s


def _ms(seconds: float) -> str:
    ms = 1e3 * seconds
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def roofline_bound(flops: float, nbytes: float, seconds: float, peak_flops: float, bandwidth: float) -> Bound:
    """``Bound`` of ``flops`` and ``nbytes`` done in ``seconds`` on a machine of ``peak_flops`` FLOP/s
    and ``bandwidth`` bytes/s. Raises ``ValueError`` for a non-positive time, peak or bandwidth."""
    if seconds <= 0 or peak_flops <= 0 or bandwidth <= 0:
        raise ValueError(f"need seconds, peak_flops and bandwidth > 0; got {seconds}, {peak_flops}, {bandwidth}")
    return Bound(seconds, flops / peak_flops, nbytes / bandwidth)


def phase_utilization(
    model_config: ModelConfig, dtype_bytes: float, steps, peaks, matmul_bytes: MatmulBytes | None = None
) -> dict:
    """FLOPs and bytes of recorded steps (``StepRecord``s) over their measured time: MFU and MBU.

    ``matmul_bytes``: a quantized engine's weight bytes (``LLMEngine.matmul_bytes``), as in
    ``step_work``.
    ``peaks``: ``peaks.Peak``s; one entry per peak, keyed by its source ("measured",
    "datasheet"), with MFU, MBU, what bounds the time (``roofline_bound``: ``limit``,
    ``explained_percent`` and ``bound``, a sentence). A figure over 100% carries ``suspect: True`` (a
    wrong count or ceiling) instead of being reported as fact. Returns a JSON-serializable dict.
    """
    seconds = sum(s.duration_s for s in steps)
    if not steps or seconds <= 0:
        raise ValueError("phase_utilization needs at least one step with a positive duration")
    work = sum(step_work(model_config, s.chunks, dtype_bytes, matmul_bytes=matmul_bytes) for s in steps)
    out = {
        "num_steps": len(steps),
        "flops": work.total_flops,
        "bytes": work.total_bytes,
        "seconds": seconds,
        "arithmetic_intensity_flop_per_byte": work.arithmetic_intensity_flop_per_byte,
        "achieved_tflops": work.total_flops / seconds / 1e12,
        "achieved_gbps": work.total_bytes / seconds / 1e9,
    }
    for peak in peaks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SuspectFigureWarning)  # the flag travels in the result
            f = mfu(work.total_flops, seconds, peak.peak_tflops * 1e12)
            b = mbu(work.total_bytes, seconds, peak.bandwidth_gbps * 1e9)
        bound = roofline_bound(
            work.total_flops, work.total_bytes, seconds, peak.peak_tflops * 1e12, peak.bandwidth_gbps * 1e9
        )
        out[peak.source] = {
            "mfu_percent": f.percent,
            "mbu_percent": b.percent,
            "suspect": f.suspect or b.suspect,
            "limit": bound.limit,
            "explained_percent": 100 * bound.explained,
            "bound": bound.words(),
        }
    return out
