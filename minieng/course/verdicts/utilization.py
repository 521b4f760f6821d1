"""The share of a device's peak each phase uses: S11 (MFU per phase), S12 (NVML's util.gpu), S18
(bigger GPUs sit idler in decode) and S20 (the efficiency gap between the phases).
"""

from __future__ import annotations

import numpy as np

from minieng.course.claims import verdict
from minieng.course.verdicts.wording import COMPUTED, FAILS, HOLDS, categorized

# S11: the article's ranges, against datasheet peaks.
PREFILL_MFU_RANGE = (40.0, 60.0)
DECODE_MFU_MAX = 5.0


def _against(mfu_datasheet, mfu_measured):
    if mfu_datasheet is not None:
        return mfu_datasheet, "datasheet"
    return mfu_measured, "measured ceiling (no datasheet for this device)"


SUSPECT = (
    "not testable here: MFU above 100% of the peak it is judged on: a wrong count, or a ceiling measured low "
    "(measured while other work shared the machine)"
)


def s11_prefill_mfu(
    mfu_datasheet_percent: float | None,
    mfu_measured_percent: float,
    *,
    noise,
    suspect: bool = False,
    limit: str | None = None,
) -> str:
    """S11, prefill: MFU in the article's 40-60%, or above it ("holds (above the range)": a prefill
    that uses more of the peak than the article's devices did still makes its point). Judged against the datasheet peak where the device
    has one (the article's MFU is against datasheet peaks), else against the measured matmul
    ceiling, and said so. Pass MFUs in percent. ``suspect``: the MFU is above 100% of the peak it is
    judged on (``phase_utilization``'s flag for that peak): no verdict. ``limit``: what bounds the step
    (``roofline_bound``'s "compute", "memory" or "overhead"); an overhead-bound prefill below the
    range says so."""
    if suspect:
        return SUSPECT
    low, high = PREFILL_MFU_RANGE

    def category(mfu_datasheet_percent, mfu_measured_percent):
        return HOLDS if _against(mfu_datasheet_percent, mfu_measured_percent)[0] >= low else FAILS

    def wording(mfu_datasheet_percent, mfu_measured_percent):
        mfu, peak = _against(mfu_datasheet_percent, mfu_measured_percent)
        if mfu > high:
            return f"{HOLDS} (above the range): {mfu:.0f}% of the {peak}, above the article's {low:.0f}-{high:.0f}%"
        if mfu >= low:
            return f"{HOLDS}: {mfu:.0f}% of the {peak}"
        why = "; limited by overhead: this model is too small to fill this device" if limit == "overhead" else ""
        return f"{FAILS}: {mfu:.0f}% of the {peak}, below the article's {low:.0f}-{high:.0f}%{why}"

    return categorized(
        category, wording, noise, mfu_datasheet_percent=mfu_datasheet_percent, mfu_measured_percent=mfu_measured_percent
    )


def s11_decode_mfu(
    mfu_datasheet_percent: float | None, mfu_measured_percent: float, *, noise, suspect: bool = False
) -> str:
    """S11, decode: batch-1 MFU under the article's 5%, against the datasheet where known (see
    ``s11_prefill_mfu``; ``suspect`` likewise)."""
    if suspect:
        return SUSPECT

    def judge(mfu_datasheet_percent, mfu_measured_percent):
        mfu, peak = _against(mfu_datasheet_percent, mfu_measured_percent)
        if mfu < DECODE_MFU_MAX:
            return f"{HOLDS}: {mfu:.1f}% of the {peak}"
        return f"{FAILS}: {mfu:.1f}% of the {peak} (a low ridge point lets decode use more of the peak)"

    return verdict(judge, noise, mfu_datasheet_percent=mfu_datasheet_percent, mfu_measured_percent=mfu_measured_percent)


UTIL_RANGE = (4.0, 6.0)


def s12_utilization(util_gpu_percent: float | None, *, mfu_percent: float | None) -> str:
    """S12: NVML's util.gpu during batch-1 decode reads the article's 4-6%. util.gpu is the share
    of time a kernel ran, a sampled count, not a timing: no noise check. None: no NVML here."""
    if util_gpu_percent is None:
        return "not testable here: no NVIDIA GPU (NVML reads nothing); the low figure here is MFU"
    low, high = UTIL_RANGE
    if low <= util_gpu_percent <= high:
        return f"{HOLDS}: util.gpu {util_gpu_percent:.0f}%"
    mfu = "" if mfu_percent is None else f", MFU {mfu_percent:.1f}%"
    return f"{FAILS}: util.gpu {util_gpu_percent:.0f}% counts busy time{mfu}: the low figure is MFU"


# S18: the article's "more than 90% idle": batch-1 decode's MFU on the reader's device below this.
IDLE_MFU_MAX = 10.0


def s18_idler(
    peak_tflops: list[float],
    decode_mfu_percent: list[float],
    *,
    measured_mfu_percent: float | None = None,
    measured_mbu_percent: float | None = None,
    noise=None,
) -> str:
    """S18: bigger GPUs sit idler in decode. Two terms.

    The ranking across devices is computed, not measured: ``decode_mfu_percent`` is projected from the
    reader's MBU onto the datasheets (``project_decode_mfu``: MBU x bandwidth x intensity / peak), so
    its ranks are the datasheets' ridges whatever the reader measured. Its rank correlation with
    ``peak_tflops`` reads "computed" when negative, "does not hold" when not.

    The article's figure, "more than 90% idle", is checked on the reader's own device when given:
    ``measured_mfu_percent``, batch-1 decode's MFU timed here (against the datasheet peak where the
    device has one), under ``IDLE_MFU_MAX`` holds, else fails; ``measured_mbu_percent`` is quoted
    beside it (the bandwidth that keeps the step busy). The MFU is one timing: judged within ``noise``."""
    if len(peak_tflops) != len(decode_mfu_percent) or len(peak_tflops) < 3:
        raise ValueError("s18_idler: one decode MFU per device, three devices at least")
    rho = _spearman(peak_tflops, decode_mfu_percent)
    if rho >= 0:
        return f"{FAILS}: rank correlation {rho:+.2f}: decode MFU does not fall with peak FLOP/s"
    ranking = f"rank correlation {rho:.2f} between peak FLOP/s and batch-1 decode MFU on the datasheets"
    if measured_mfu_percent is None:
        return f"{COMPUTED}: {ranking} (projected from the MBU measured here)"
    mbu = "" if measured_mbu_percent is None else f", the bandwidth {measured_mbu_percent:.0f}% busy"

    def judge(measured_mfu_percent):
        idle = f"{100 - measured_mfu_percent:.0f}% of this device's FLOP/s idle in batch-1 decode{mbu}"
        if measured_mfu_percent < IDLE_MFU_MAX:
            return f"{HOLDS}: {idle}; computed: {ranking}"
        return f"{FAILS}: only {idle}, not the article's more than 90%"

    return verdict(judge, noise, measured_mfu_percent=measured_mfu_percent)


def _spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (ties take their mean rank), 0 where a side is constant."""

    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = v.argsort()
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):  # ties: mean rank
            r[v == value] = r[v == value].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


# S20: "about 10x": within a factor of two of it, or beyond.
EFFICIENCY_GAP_X = 5.0


def s20_efficiency_gap(prefill_mfu_percent: float, decode_mfu_percent: float, *, noise) -> str:
    """S20: the same device's share of its peak FLOP/s used in prefill against batch-1 decode (MFU
    against one peak, so tok/s per unit of peak alike). Holds at ``EFFICIENCY_GAP_X`` or more (the
    article's ~10x within a factor of two, or wider)."""

    def judge(prefill_mfu_percent, decode_mfu_percent):
        gap = prefill_mfu_percent / decode_mfu_percent
        if gap >= EFFICIENCY_GAP_X:
            return f"{HOLDS}: prefill uses {gap:.0f}x the share of the peak batch-1 decode does"
        return f"{FAILS}: prefill uses only {gap:.1f}x the share of the peak batch-1 decode does"

    return verdict(judge, noise, prefill_mfu_percent=prefill_mfu_percent, decode_mfu_percent=decode_mfu_percent)
