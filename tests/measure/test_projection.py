"""The reader's efficiency projected onto the datasheet table (claims S17, S18): checked against
hand computations, and the GPU branch of notebook 03 run here on the CPU."""

from __future__ import annotations

import pytest

from minieng.course import verdicts
from minieng.measure.peaks import DATASHEET, Peak
from minieng.measure.projection import (
    datasheet_peaks,
    phase_projection_reading,
    project_decode_mfu,
    project_phase_times,
)

T4 = Peak("T4", 65, 320, "datasheet")
H200 = Peak("H200", 989, 4800, "datasheet")
RTX_3060 = Peak("RTX 3060", 25, 360, "datasheet")


def test_datasheet_peaks_are_the_table():
    peaks = datasheet_peaks()
    assert [p.name for p in peaks] == [name for _, name, _, _ in DATASHEET]
    assert all(p.source == "datasheet" for p in peaks)
    h200 = next(p for p in peaks if p.name == "H200")
    assert (h200.peak_tflops, h200.bandwidth_gbps) == (989, 4800)


def test_decode_mfu_by_hand():
    # 60% of a T4's 320 GB/s is 192 GB/s; at 1 FLOP/byte that is 0.192 TFLOP/s of 65: 0.2954%.
    # 60% of an H200's 4800 GB/s is 2880 GB/s: 2.88 TFLOP/s of 989: 0.2912%.
    rows = project_decode_mfu(60.0, 1.0, [H200, T4])
    assert [r["device"] for r in rows] == ["T4", "H200"]  # by ascending peak
    t4, h200 = rows
    assert t4["decode_tflops"] == pytest.approx(0.192)
    assert t4["mfu_percent"] == pytest.approx(100 * 0.192 / 65)
    assert h200["mfu_percent"] == pytest.approx(100 * 2.88 / 989)
    assert t4["ridge_flop_per_byte"] == pytest.approx(65e12 / 320e9)
    # MFU = MBU x intensity / ridge: doubling the intensity doubles it.
    assert project_decode_mfu(60.0, 2.0, [T4])[0]["mfu_percent"] == pytest.approx(2 * t4["mfu_percent"])


def test_decode_mfu_refuses_what_cannot_be_measured():
    with pytest.raises(ValueError, match="percentage"):
        project_decode_mfu(130.0, 1.0)
    with pytest.raises(ValueError, match="percentage"):
        project_decode_mfu(0.0, 1.0)
    with pytest.raises(ValueError, match="intensity"):
        project_decode_mfu(50.0, 0.0)
    with pytest.raises(ValueError, match="no device"):
        project_decode_mfu(50.0, 1.0, [])


def test_S18_on_the_datasheet_table_bigger_gpus_sit_idler():
    """The verdict on the whole table: the ranks come from the datasheets (MBU only scales them)."""
    rows = project_decode_mfu(55.0, 1.0)
    said = verdicts.s18_idler([r["peak_tflops"] for r in rows], [r["mfu_percent"] for r in rows])
    assert said.startswith("computed")
    assert said == verdicts.s18_idler(
        [r["peak_tflops"] for r in rows], [r["mfu_percent"] for r in project_decode_mfu(10.0, 1.0)]
    )


def test_phase_times_by_hand():
    # 1 TFLOP at 50% of 65 TFLOP/s: 1/32.5 s; 1 GB at 80% of 320 GB/s: 1/256 s.
    rows = project_phase_times(1e12, 1e9, prefill_mfu_percent=50.0, decode_mbu_percent=80.0, devices=[H200, T4])
    t4 = rows[0]
    assert t4["device"] == "T4"
    assert t4["ttft_s"] == pytest.approx(1 / 32.5)
    assert t4["tpot_s"] == pytest.approx(1 / 256)
    h200 = rows[1]
    assert h200["ttft_s"] == pytest.approx(1e12 / (0.5 * 989e12))
    assert h200["tpot_s"] == pytest.approx(1e9 / (0.8 * 4800e9))
    with pytest.raises(ValueError, match="must be > 0"):
        project_phase_times(0, 1e9, prefill_mfu_percent=50.0, decode_mbu_percent=80.0)
    with pytest.raises(ValueError, match="percentage"):
        project_phase_times(1e12, 1e9, prefill_mfu_percent=150.0, decode_mbu_percent=80.0)


def test_S17_gpu_branch_runs_on_the_cpu():
    """Notebook 03's GPU branch of S17: the projection over the whole table, its reading and the
    verdict's wording, with figures of an H200 run."""
    rows = project_phase_times(2.3e13, 3.5e9, prefill_mfu_percent=45.0, decode_mbu_percent=60.0)
    assert len(rows) == len(DATASHEET)
    reading = phase_projection_reading(rows)
    # The ridges furthest apart on the table: the L40S (362 / 864) and the RTX 3060 (25 / 360).
    assert "L40S" in reading and "RTX 3060" in reading
    assert "14.5x the FLOP/s" in reading and "2.4x its bandwidth" in reading
    assert "TTFT 14.5x shorter, TPOT 2.4x" in reading
    said = verdicts.not_testable("one GPU: a projection on datasheets, not a measurement") + "; " + reading
    assert said.startswith("not testable here: one GPU")


def test_phase_projection_reading_by_hand():
    rows = project_phase_times(1e12, 1e9, prefill_mfu_percent=50.0, decode_mbu_percent=50.0, devices=[T4, RTX_3060])
    reading = phase_projection_reading(rows)
    assert "the T4 has 2.6x the FLOP/s of the RTX 3060 and 0.9x its bandwidth" in reading
    assert "TTFT 2.6x shorter, TPOT 0.9x" in reading
    with pytest.raises(ValueError, match="two devices"):
        phase_projection_reading(rows[:1])
