"""The energy of an interval: NVML's counter and its fallback against the fake NVML, RAPL against a
fake powercap folder, the idle subtraction, and this machine's CPU path."""

from __future__ import annotations

import time

import pytest
from fake_nvml import FakeGPU, FakeNVML, NVMLError_DriverNotLoaded, NVMLError_NotSupported

from minieng.measure import energy
from minieng.measure.energy import (
    NVML_COUNTER_WRAP_MJ,
    EnergyMeter,
    EnergyReading,
    counter_delta,
    energy_source,
    integrate_power_j,
    rapl_zones,
)

NO_COUNTER = {"nvmlDeviceGetTotalEnergyConsumption": NVMLError_NotSupported}


def busy(gpu: FakeGPU, power_mw: int, seconds: float):
    """The work: the fake GPU draws ``power_mw`` for ``seconds``, then goes back to what it drew."""

    def run():
        before = gpu.power_mw
        gpu.set_power_mw(power_mw)
        time.sleep(seconds)
        gpu.set_power_mw(before)
        return "done"

    return run


# -- the arithmetic ----------------------------------------------------------------------------


def test_counter_delta_and_its_wrap():
    assert counter_delta(1_000, 4_500, NVML_COUNTER_WRAP_MJ) == 3_500
    assert counter_delta(2**64 - 1_000, 2_000, NVML_COUNTER_WRAP_MJ) == 3_000  # NVML's 64-bit counter wrapped
    assert counter_delta(262_143_328_850 - 100, 400, 262_143_328_850) == 500  # a RAPL range read on a Xeon
    with pytest.raises(ValueError, match="range"):
        counter_delta(0, 1, 0)


def test_integrate_power_by_hand():
    assert integrate_power_j([(0.0, 100.0), (1.0, 100.0)], 0.0, 2.0) == pytest.approx(200.0)  # held after the last
    # a ramp 100 -> 300 W over [0, 1] s, then 300 W: over [0.5, 1.5] = 0.5 x (200 + 300) / 2 + 0.5 x 300
    assert integrate_power_j([(0.0, 100.0), (1.0, 300.0)], 0.5, 1.5) == pytest.approx(125.0 + 150.0)
    assert integrate_power_j([(0.0, None), (1.0, 50.0)], 0.0, 1.0) == pytest.approx(50.0)  # N/A skipped
    assert integrate_power_j([(0.0, None)], 0.0, 1.0) is None
    with pytest.raises(ValueError, match="before it starts"):
        integrate_power_j([(0.0, 1.0)], 1.0, 0.5)


def test_idle_subtraction_by_hand():
    r = EnergyReading(joules=50.0, seconds=0.2, idle_watts=100.0, source="nvml-counter")
    assert r.mean_watts == pytest.approx(250.0)
    assert r.idle_joules == pytest.approx(20.0)
    assert r.joules_above_idle == pytest.approx(30.0)
    short = EnergyReading(joules=5.0, seconds=0.02, idle_watts=100.0, source="nvml-counter")
    diff = r.minus(short)
    assert (diff.joules, diff.seconds) == (pytest.approx(45.0), pytest.approx(0.18))
    assert diff.joules_above_idle == pytest.approx(45.0 - 18.0)
    d = r.to_dict()
    assert d["joules_above_idle"] == pytest.approx(30.0) and d["source"] == "nvml-counter"
    assert "30 J above idle" in r.describe()
    with pytest.raises(ValueError, match="subtract"):
        r.minus(EnergyReading(1.0, 0.1, None, "rapl"))
    none = EnergyReading(None, 0.5, None, None, "no RAPL here")
    assert none.joules_above_idle is None and none.mean_watts is None
    assert "not measurable on this machine: no RAPL here" in none.describe()


# -- NVML --------------------------------------------------------------------------------------


def test_the_counter_measures_the_interval_and_the_idle_before_it():
    gpu = FakeGPU(power_mw=100_000)
    fake = FakeNVML([gpu])
    with EnergyMeter("cuda", idle_s=0.2, interval_s=0.02, nvml=fake) as meter:
        value, r = meter.measure(busy(gpu, 300_000, 0.3))
    assert value == "done" and meter.source == r.source == "nvml-counter" and r.reason is None
    assert meter.idle_watts == pytest.approx(100.0, rel=0.03)
    assert r.idle_watts == meter.idle_watts
    assert r.joules == pytest.approx(300.0 * r.seconds, rel=0.03)
    assert r.joules_above_idle == pytest.approx(200.0 * r.seconds, rel=0.05)
    assert meter.domains == ["NVIDIA H200"]
    assert fake.initialized == 0, "the meter's sampler must release NVML"


def test_the_counter_wrapping_inside_the_interval():
    gpu = FakeGPU(power_mw=0, energy_mj=NVML_COUNTER_WRAP_MJ - 30_000)  # 30 J to go: 0.1 s at 300 W
    with EnergyMeter("cuda", idle_s=0, interval_s=0.02, nvml=FakeNVML([gpu])) as meter:
        _, r = meter.measure(busy(gpu, 300_000, 0.25))
    start, end = gpu.energy_reads[-2:]
    assert end < start, "the fake's counter should have wrapped during the interval"
    assert r.joules == pytest.approx(300.0 * r.seconds, rel=0.03)
    assert r.idle_watts is None and r.joules_above_idle is None  # no idle window read


def test_a_gpu_without_the_counter_falls_back_to_sampled_power():
    """Pascal and older answer NotSupported for the counter: the power is sampled and integrated."""
    gpu = FakeGPU(power_mw=100_000, errors=dict(NO_COUNTER))
    with EnergyMeter("cuda", idle_s=0.2, interval_s=0.01, nvml=FakeNVML([gpu])) as meter:
        _, r = meter.measure(busy(gpu, 300_000, 0.4))
    assert r.source == "nvml-power" and "Volta" in r.reason and "sampled" in r.reason
    assert meter.idle_watts == pytest.approx(100.0, rel=0.05)
    # the step up and down are smeared over one sampling period at each edge: at most 2 x 0.01 s x 200 W
    assert r.joules == pytest.approx(300.0 * r.seconds, abs=6.0)
    assert r.joules_above_idle == pytest.approx(200.0 * r.seconds, abs=6.0)
    assert "power" in meter.describe()


def test_a_gpu_without_counter_or_power_measures_nothing_and_says_why():
    errors = NO_COUNTER | {"nvmlDeviceGetPowerUsage": NVMLError_NotSupported}
    fake = FakeNVML([FakeGPU(errors=errors)])
    with EnergyMeter("cuda", idle_s=0.1, interval_s=0.01, nvml=fake) as meter:
        value, r = meter.measure(lambda: 7)
    assert value == 7 and r.source is None and r.joules is None and r.seconds >= 0
    assert "nvmlDeviceGetPowerUsage" in r.reason and "Not Supported" in r.reason
    assert fake.initialized == 0


def test_no_driver_is_not_measurable_with_the_reason():
    fake = FakeNVML(init_error=NVMLError_DriverNotLoaded)
    source, line = energy_source("cuda", nvml=fake)
    assert source is None and "not measurable on this machine" in line and "driver is not loaded" in line


def test_other_devices_are_not_measurable():
    with EnergyMeter("meta", idle_s=0) as meter:
        _, r = meter.measure(lambda: None)
    assert r.source is None and "meta" in r.reason


# -- RAPL --------------------------------------------------------------------------------------


def zone(root, name, label, energy_uj, max_uj=1_000_000_000):
    path = root / name
    path.mkdir(parents=True)
    (path / "name").write_text(label + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


@pytest.fixture
def powercap(tmp_path):
    """Two packages with a dram subzone, and what must not be counted: core, psys, the MMIO twin."""
    root = tmp_path / "powercap"
    (root / "intel-rapl").mkdir(parents=True)  # the control type: no counter
    zones = {
        "pkg0": zone(root, "intel-rapl:0", "package-0", 5_000_000),
        "core0": zone(root, "intel-rapl:0:0", "core", 1_000),
        "dram0": zone(root, "intel-rapl:0:1", "dram", 2_000_000),
        "pkg1": zone(root, "intel-rapl:1", "package-1", 999_000_000),  # near its wrap
        "psys": zone(root, "intel-rapl:2", "psys", 7),
        "mmio": zone(root, "intel-rapl-mmio:0", "package-0", 5_000_000),
    }
    return root, zones


def set_uj(path, value):
    (path / "energy_uj").write_text(f"{value}\n")


def test_rapl_counts_packages_and_dram_only(powercap):
    root, _ = powercap
    zones, why = rapl_zones(root)
    assert why is None and sorted(z.name for z in zones) == ["dram", "package-0", "package-1"]


def test_rapl_sums_its_zones_across_a_wrap(powercap):
    root, z = powercap

    def work():  # +3 J on package-0, +1.5 J on dram, package-1 wraps: 999 J -> 0.5 J of a 1,000 J range
        set_uj(z["pkg0"], 8_000_000)
        set_uj(z["dram0"], 3_500_000)
        set_uj(z["pkg1"], 500_000)
        set_uj(z["core0"], 10**8)  # not counted
        set_uj(z["psys"], 10**8)

    with EnergyMeter("cpu", idle_s=0, powercap=root) as meter:
        _, r = meter.measure(work)
    assert r.source == "rapl" and sorted(meter.domains) == ["dram", "package-0", "package-1"]
    assert r.joules == pytest.approx(3.0 + 1.5 + 1.5)


def test_rapl_idle_is_read_first_and_subtracted(powercap, monkeypatch):
    root, z = powercap
    # the idle window: 2 J on package-0 over the "sleep" (its real duration, made 0.1 s)
    monkeypatch.setattr(energy, "_sleep", lambda s: (set_uj(z["pkg0"], 7_000_000), time.sleep(0.1)))
    with EnergyMeter("cpu", idle_s=0.1, powercap=root) as meter:
        _, r = meter.measure(lambda: (set_uj(z["pkg0"], 17_000_000), time.sleep(0.1)))
    assert meter.idle_watts == pytest.approx(2.0 / 0.1, rel=0.2)
    assert r.joules == pytest.approx(10.0)
    assert r.joules_above_idle == pytest.approx(10.0 - meter.idle_watts * r.seconds)
    assert "idle" in meter.describe()


def test_rapl_missing_or_root_only(tmp_path, powercap, monkeypatch):
    assert "does not exist" in rapl_zones(tmp_path / "nothing")[1]
    (tmp_path / "empty").mkdir()
    assert "no intel-rapl package zone" in rapl_zones(tmp_path / "empty")[1]
    root, _ = powercap

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(energy, "_read_int", lambda p: denied(p) if p.name == "energy_uj" else int(p.read_text()))
    with EnergyMeter("cpu", idle_s=0, powercap=root) as meter:
        _, r = meter.measure(lambda: None)
    assert r.source is None and "root only" in r.reason and "CVE-2020-8694" in r.reason


def test_this_machines_cpu_says_what_it_measures():
    """Here, a VM: no RAPL, so nothing is measured and the reason says so; on a machine with
    readable RAPL, a figure from it."""
    source, line = energy_source("cpu")
    with EnergyMeter("cpu", idle_s=0.05 if source else 0) as meter:
        _, r = meter.measure(time.sleep, 0.05)
    if source is None:
        assert r.joules is None and "RAPL" in r.reason and "not measurable" in line
    else:
        assert source == "rapl" and r.joules >= 0 and r.idle_watts is not None
