"""The reader's measured efficiency projected onto the datasheet table: computed, not measured.

One device can measure only itself. What another GPU would do with the same model follows from two
figures measured here and the other device's datasheet (``peaks.DATASHEET``: dense bf16/fp16 peak
and memory bandwidth, docs/architecture.md section 4), under one assumption: the phase keeps the efficiency it
reached here (its MFU or its MBU). Every row these functions return is a projection, and a lesson
must label it so.

- Batch-1 decode reads its bytes at MBU x bandwidth, so it does MBU x bandwidth x I FLOP/s, I its
  arithmetic intensity (FLOP/byte, ``flops_bytes.decode_work``), and its MFU on a device of peak P is
  MBU x bandwidth x I / P = MBU x I / ridge (``project_decode_mfu``): the larger a device's ridge
  point, the idler batch-1 decode leaves it.
- A prefill of F FLOPs at MFU m takes F / (m x P); a decode step of B bytes at MBU u takes
  B / (u x bandwidth) (``project_phase_times``): TTFT follows the peak, TPOT the bandwidth.

Pure arithmetic: no torch, no device.
"""

from __future__ import annotations

from collections.abc import Sequence

from minieng.measure.peaks import DATASHEET, Peak


def datasheet_peaks() -> list[Peak]:
    """Every device of ``peaks.DATASHEET`` as a ``Peak`` (source "datasheet"), in the table's order."""
    return [Peak(name, tflops, gbps, "datasheet") for _, name, tflops, gbps in DATASHEET]


def _percent(name: str, value: float) -> float:
    if not 0 < value <= 100:
        raise ValueError(f"{name}={value} must be a percentage in (0, 100]")
    return value


def project_decode_mfu(
    mbu_percent: float, intensity_flop_per_byte: float, devices: Sequence[Peak] | None = None
) -> list[dict]:
    """Batch-1 decode's MFU on each device, were it to read its bytes at ``mbu_percent`` of the
    device's bandwidth: MFU = MBU x bandwidth x intensity / peak (module docstring).

    Args:
        mbu_percent: batch-1 decode's MBU measured here, in percent (0, 100].
        intensity_flop_per_byte: the step's arithmetic intensity in the devices' dtype (FLOP/byte;
            ``flops_bytes.decode_work(cfg, 1, context, 2)`` for the bf16/fp16 the datasheet peaks are for).
        devices: the peaks to project onto (default: ``datasheet_peaks()``).
    Returns:
        one dict per device, by ascending peak: ``device``, ``peak_tflops``, ``bandwidth_gbps``,
        ``ridge_flop_per_byte``, ``decode_tflops`` (the projected achieved TFLOP/s) and
        ``mfu_percent``.
    Raises:
        ValueError: an MBU outside (0, 100], a non-positive intensity, or no device.
    """
    _percent("mbu_percent", mbu_percent)
    if intensity_flop_per_byte <= 0:
        raise ValueError(f"intensity_flop_per_byte={intensity_flop_per_byte} must be > 0")
    devices = datasheet_peaks() if devices is None else list(devices)
    if not devices:
        raise ValueError("project_decode_mfu: no device to project onto")
    rows = []
    for d in sorted(devices, key=lambda p: p.peak_tflops):
        tflops = mbu_percent / 100 * d.bandwidth_gbps * 1e9 * intensity_flop_per_byte / 1e12
        rows.append(
            {
                "device": d.name,
                "peak_tflops": d.peak_tflops,
                "bandwidth_gbps": d.bandwidth_gbps,
                "ridge_flop_per_byte": d.ridge_flop_per_byte,
                "decode_tflops": tflops,
                "mfu_percent": 100 * tflops / d.peak_tflops,
            }
        )
    return rows


def project_phase_times(
    prefill_flops: float,
    decode_bytes: float,
    *,
    prefill_mfu_percent: float,
    decode_mbu_percent: float,
    devices: Sequence[Peak] | None = None,
) -> list[dict]:
    """TTFT and TPOT of the same prefill and decode step on each device, at the efficiency measured
    here: TTFT = FLOPs / (peak x MFU), TPOT = bytes / (bandwidth x MBU) (module docstring).

    Args:
        prefill_flops: one prefill's FLOPs (``flops_bytes.prefill_work(...).total_flops``).
        decode_bytes: one batch-1 decode step's bytes in the devices' dtype (``flops_bytes.decode_work``).
        prefill_mfu_percent, decode_mbu_percent: measured here, in percent (0, 100].
        devices: the peaks to project onto (default: ``datasheet_peaks()``).
    Returns:
        one dict per device, by ascending peak: ``device``, ``peak_tflops``, ``bandwidth_gbps``,
        ``ttft_s`` and ``tpot_s``.
    Raises:
        ValueError: non-positive FLOPs or bytes, a percentage outside (0, 100], or no device.
    """
    if prefill_flops <= 0 or decode_bytes <= 0:
        raise ValueError(f"prefill_flops={prefill_flops} and decode_bytes={decode_bytes} must be > 0")
    mfu = _percent("prefill_mfu_percent", prefill_mfu_percent) / 100
    mbu = _percent("decode_mbu_percent", decode_mbu_percent) / 100
    devices = datasheet_peaks() if devices is None else list(devices)
    if not devices:
        raise ValueError("project_phase_times: no device to project onto")
    return [
        {
            "device": d.name,
            "peak_tflops": d.peak_tflops,
            "bandwidth_gbps": d.bandwidth_gbps,
            "ttft_s": prefill_flops / (mfu * d.peak_tflops * 1e12),
            "tpot_s": decode_bytes / (mbu * d.bandwidth_gbps * 1e9),
        }
        for d in sorted(devices, key=lambda p: p.peak_tflops)
    ]


def phase_projection_reading(rows: Sequence[dict]) -> str:
    """What ``project_phase_times``' rows say, in one sentence: the two devices whose ridge points
    (peak / bandwidth) lie furthest apart, and how much shorter each phase is on the one with the
    higher peak. Raises ``ValueError`` for fewer than two rows."""
    if len(rows) < 2:
        raise ValueError("phase_projection_reading: two devices at least")
    by_ridge = sorted(rows, key=lambda r: r["peak_tflops"] / r["bandwidth_gbps"])
    low, high = by_ridge[0], by_ridge[-1]
    fast, slow = (high, low) if high["peak_tflops"] >= low["peak_tflops"] else (low, high)
    return (
        f"projected: the {fast['device']} has {fast['peak_tflops'] / slow['peak_tflops']:.1f}x the FLOP/s of the "
        f"{slow['device']} and {fast['bandwidth_gbps'] / slow['bandwidth_gbps']:.1f}x its bandwidth: TTFT "
        f"{slow['ttft_s'] / fast['ttft_s']:.1f}x shorter, TPOT {slow['tpot_s'] / fast['tpot_s']:.1f}x: "
        "each phase follows its own resource"
    )
