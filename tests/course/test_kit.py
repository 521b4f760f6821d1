"""Notebook machinery: the smoke switch, the result cache, panels that run headless, the claims table."""

from __future__ import annotations

import json

import pytest

from minieng.course import kit


@pytest.mark.parametrize(
    "value,expected",
    [
        ("1", True),
        ("true", True),
        ("yes", True),
        ("0", False),
        ("false", False),
        ("False", False),
        ("no", False),
        ("", False),
    ],
)
def test_smoke_mode_reads_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("MINIENG_SMOKE", value)
    assert kit.smoke_mode() is expected


def test_smoke_mode_off_when_unset(monkeypatch):
    monkeypatch.delenv("MINIENG_SMOKE", raising=False)
    assert kit.smoke_mode() is False


def test_cached_computes_once_then_reads_from_disk(tmp_path, capsys):
    calls = []

    def compute():
        calls.append(1)
        return {"tok_s": 12.5, "rows": [1, 2, 3]}

    params = {"batch": 4, "model": "tiny"}
    first = kit.cached("bench", params, compute, directory=tmp_path)
    second = kit.cached("bench", dict(reversed(params.items())), compute, directory=tmp_path)  # key order
    assert first == second == {"tok_s": 12.5, "rows": [1, 2, 3]}
    assert len(calls) == 1
    assert "cached result" in capsys.readouterr().out
    files = list(tmp_path.glob("bench-*.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text())["params"] == params
    assert not list(tmp_path.glob("*.tmp"))  # written atomically

    kit.cached("bench", {"batch": 8, "model": "tiny"}, compute, directory=tmp_path)
    kit.cached("other", params, compute, directory=tmp_path)
    assert len(calls) == 3
    assert len(list(tmp_path.glob("*.json"))) == 3


def test_cached_default_directory_follows_the_environment_at_call_time(tmp_path, monkeypatch):
    """STYLE.md: no environment reads at import. A notebook that sets MINIENG_RESULTS_DIR after
    ``import minieng.course.kit`` should still have its results written there."""
    monkeypatch.chdir(tmp_path)  # where a default "results/" would land
    target = tmp_path / "elsewhere"
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(target))
    kit.cached("x", {"a": 1}, lambda: {"v": 1})
    assert list(target.glob("x-*.json")), "MINIENG_RESULTS_DIR set after import was ignored"


def _other_machine(real):
    return lambda device="cpu", dtype=None: real(device, dtype) | {"host": "someone-elses-laptop"}


def test_cached_never_shows_another_environments_result_as_this_runs(tmp_path, monkeypatch, capsys):
    """A result measured elsewhere (another host, torch, device), or in smoke mode, is measured
    afresh; a reused one says when and where it was measured."""
    from minieng.measure import harness

    calls = []

    def compute():
        calls.append(1)
        return {"ttft_ms": float(len(calls))}

    monkeypatch.delenv("MINIENG_SMOKE", raising=False)
    first = kit.cached("ttft", {"n": 16}, compute, directory=tmp_path)
    stored = json.loads(next(tmp_path.glob("ttft-*.json")).read_text())
    assert stored["environment"]["host"] and stored["environment"]["smoke"] is False
    assert stored["measured_at"].endswith("UTC")
    assert "sm_clock_mhz" not in stored["environment"]  # momentary fields never split the cache

    monkeypatch.setattr(harness, "environment", _other_machine(harness.environment))
    elsewhere = kit.cached("ttft", {"n": 16}, compute, directory=tmp_path)
    assert (first, elsewhere) == ({"ttft_ms": 1.0}, {"ttft_ms": 2.0})
    monkeypatch.undo()

    monkeypatch.setenv("MINIENG_SMOKE", "1")
    assert kit.cached("ttft", {"n": 16}, compute, directory=tmp_path) == {"ttft_ms": 3.0}
    monkeypatch.delenv("MINIENG_SMOKE")
    capsys.readouterr()
    assert kit.cached("ttft", {"n": 16}, compute, directory=tmp_path) == {"ttft_ms": 1.0}
    out = capsys.readouterr().out
    assert f"measured {stored['measured_at']} on {stored['environment']['device_name']}" in out
    assert len(calls) == 3 and len(list(tmp_path.glob("ttft-*.json"))) == 3


def test_int_slider_and_dropdown():
    s = kit.int_slider("batch", 4, 1, 32, step=1)
    assert s.continuous_update is False
    assert (s.value, s.min, s.max, s.description) == (4, 1, 32, "batch")
    d = kit.dropdown("mode", ["a", "b"], "b")
    assert d.value == "b" and list(d.options) == ["a", "b"]


def test_controls_keep_their_body_beside_a_long_description():
    """ipywidgets' 300 px default left a 30-character description's slider a zero-width track
    (notebook 07); each control is now its description's width plus a fixed body."""
    long = kit.int_slider("shared share of the prompt (%)", 50, 0, 99)
    assert long.style.description_width == "30ch"
    assert long.layout.width == f"calc(30ch + {kit.SLIDER_BODY_PX}px)"
    short = kit.int_slider("k", 1, 1, 8)
    assert short.layout.width == f"calc(1ch + {kit.SLIDER_BODY_PX}px)"
    menu = kit.dropdown("scheme", ["none", "int8"], "none")
    assert (menu.style.description_width, menu.layout.width) == ("6ch", f"calc(6ch + {kit.DROPDOWN_BODY_PX}px)")


def test_run_panel_gives_its_controls_one_description_column():
    import ipywidgets as w

    slider = kit.int_slider("n", 3, 1, 10)
    menu = kit.dropdown("a longer description", ["x", "y"], "x")
    other = w.Checkbox(description="other widgets are left as they are")
    kit.run_panel({"n": slider, "mode": menu, "flag": other}, lambda n, mode, flag: None)
    assert slider.style.description_width == menu.style.description_width == "20ch"
    assert slider.layout.width == f"calc(20ch + {kit.SLIDER_BODY_PX}px)"
    assert menu.layout.width == f"calc(20ch + {kit.DROPDOWN_BODY_PX}px)"
    assert other.layout.width is None


def _button(panel):
    import ipywidgets as w

    (button,) = [c for c in panel.children if isinstance(c, w.Button)]
    return button


def test_run_panel_runs_at_build_and_on_each_click():
    import ipywidgets as w

    seen = []
    slider = kit.int_slider("n", 3, 1, 10)
    drop = kit.dropdown("mode", ["fast", "slow"], "fast")

    def callback(n, mode):
        seen.append((n, mode))
        print(f"n={n} mode={mode}")

    panel = kit.run_panel({"n": slider, "mode": drop}, callback, button="Go")
    assert seen == [(3, "fast")]  # once at build, with the defaults
    assert isinstance(panel, w.VBox)
    assert isinstance(panel.children[-1], w.Output)
    assert panel.children[0] is slider and panel.children[1] is drop
    button = _button(panel)
    assert button.description == "Go"

    slider.value, drop.value = 7, "slow"
    button.click()
    button.click()
    assert seen == [(3, "fast"), (7, "slow"), (7, "slow")]


def test_run_panel_without_run_now():
    seen = []
    panel = kit.run_panel({"n": kit.int_slider("n", 2, 1, 5)}, lambda n: seen.append(n), run_now=False)
    assert seen == []
    _button(panel).click()
    assert seen == [2]


def test_show_displays_a_figure_headless():
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    kit.show(fig)


def test_claims_table_is_markdown_with_the_rows():
    from IPython.display import Markdown

    rows = [("prefill is compute-bound", "136x", "18x", "yes"), ("decode TPOT floor", "67 ms", "71 ms", "yes")]
    table = kit.claims_table(rows)
    assert isinstance(table, Markdown)
    lines = table.data.splitlines()
    assert lines[0] == "| claim | article | here | holds? |"
    assert lines[1].startswith("| ---")
    assert lines[2:] == [
        "| prefill is compute-bound | 136x | 18x | yes |",
        "| decode TPOT floor | 67 ms | 71 ms | yes |",
    ]


def test_announce(capsys):
    kit.announce("prefill sweep", 30)
    kit.announce("decode sweep", 600)
    out = capsys.readouterr().out
    assert "prefill sweep: about 30 s" in out and "decode sweep: about 10.0 min" in out


def test_a_cached_result_keeps_the_noise_it_was_measured_under(tmp_path, capsys):
    """Issue 29: verdicts on a result read back are judged with the noise of the run that measured
    it (load average included), not the noise read today."""
    from minieng.measure.ceilings import Noise

    busy = Noise(0.3, 0.1, 0.1, 0.1, 5, 3.5, 2, others_running=1.0, contention=0.2)
    quiet = Noise(0.01, 0.01, 0.01, 0.01, 5, 0.1, 2)
    first = kit.cached("ttft", {"n": 16}, lambda: {"ttft_ms": 3.0}, directory=tmp_path, noise=busy)
    assert first.noise is busy and not first.from_cache and first.measured_at
    again = kit.cached("ttft", {"n": 16}, lambda: {"ttft_ms": 9.0}, directory=tmp_path, noise=quiet)
    assert again == {"ttft_ms": 3.0} and again.from_cache
    assert again.noise.relative == busy.relative and again.noise.level == "busy" and again.noise.load_average == 3.5
    assert "under 30% timing noise" in capsys.readouterr().out
    stored = json.loads(next(tmp_path.glob("ttft-*.json")).read_text())
    assert stored["noise"]["load_average"] == 3.5 and stored["noise"]["relative"] == busy.relative
    # A result stored without a noise reads back with none (judged as measured, and the note says so).
    bare = kit.cached("bare", {}, lambda: {"v": 1}, directory=tmp_path)
    assert kit.cached("bare", {}, lambda: {"v": 2}, directory=tmp_path).noise is None and bare.noise is None


def test_claims_tables_record_their_verdicts_and_the_index_shows_all_21_claims(tmp_path, monkeypatch):
    """Issue 29, section 3: the claims index lists every claim with its article, figure and notebook,
    and the verdict of the reader's last run, read from what the closing tables recorded."""
    from minieng.course.claims import ARTICLE_CLAIMS, format_index, index_entries

    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("MINIENG_NOTEBOOK", "07_prefix_caching")
    empty = kit.claims_index().data
    assert "not measured yet" in empty and "No verdict recorded yet" in empty
    kit.claims_table(
        [("S5: the hit rate drives TTFT", "0.87 s", "x", "does not hold here: y"), ("extra", "-", "-", "holds")]
    )
    monkeypatch.setenv("MINIENG_NOTEBOOK", "01_two_phases")
    kit.claims_table([("S1: prefill tok/s >> decode", "136x", "12x", "holds: 12x")])
    stored = json.loads((tmp_path / kit.VERDICTS_FILE).read_text())
    assert set(stored) == {"S5: the hit rate drives TTFT", "S1: prefill tok/s >> decode"}  # not the extra row
    assert stored["S5: the hit rate drives TTFT"]["notebook"] == "07_prefix_caching"

    entries = {e["id"]: e for e in index_entries(stored)}
    assert list(entries) == list(ARTICLE_CLAIMS) and len(entries) == 21
    assert entries["S5"]["verdicts"][0]["holds"] == "does not hold here: y"
    assert (
        "O erro de resumir performance" in entries["S5"]["source"]
        and entries["S5"]["figure"] == ARTICLE_CLAIMS["S5"].figure
    )
    table = kit.claims_index().data
    assert "07_prefix_caching: does not hold here: y" in table and "01_two_phases: holds: 12x" in table
    assert table.count("not measured yet") == 19
    assert "last verdict" not in format_index(index_entries({}), with_verdicts=False)


def test_a_result_that_is_not_a_dict_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(TypeError, match="must return a JSON object"):
        kit.cached("rows", {}, lambda: [1, 2], directory=tmp_path)
    assert not list(tmp_path.glob("*"))


def test_claims_table_shows_the_notebooks_running_score_under_the_table(tmp_path, monkeypatch):
    from minieng.course.predictions import predict, record_prediction, reveal
    from minieng.course.scores import score_prediction

    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("MINIENG_NOTEBOOK", "01_two_phases")
    row = ("S1: prefill tok/s >> decode", "136x", "12x", "holds: 12x")
    assert "Score so far" not in kit.claims_table([row]).data  # nothing asked yet: no score line
    predict("ratio", "Prefill over decode tok/s?", napkin=30.0, unit="x")
    record_prediction("ratio", 60.0)
    score_prediction("ratio", 12.0)  # 0.2x the prediction
    reveal("bytes", "KV bytes a token?", "**46,080 B**")
    lines = kit.claims_table([row]).data.splitlines()
    assert lines[2] == "| S1: prefill tok/s >> decode | 136x | 12x | holds: 12x |" and lines[3] == ""
    assert lines[4].startswith("**Score so far in 01_two_phases:** 1 prediction asked, 1 scored: 0 close")
    assert "1 pencil problem shown" in lines[4] and "1 typed by you" in lines[4]
