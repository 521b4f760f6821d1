"""Predictions the course scores: stored before the measurement, scored after it, filled with the napkin
value where nobody types, a typed value kept across re-runs, choices, and bad input refused; pencil
problems revealed on demand; a notebook's running score and the course's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from minieng.config import published_config
from minieng.course import predictions
from minieng.course.predictions import (
    parse_number,
    predict,
    prediction_input,
    predictions_path,
    record_prediction,
    reveal,
)
from minieng.course.scores import (
    RunningScore,
    course_score,
    entry_cells,
    load_predictions,
    running_score,
    score,
    score_prediction,
)
from minieng.measure.napkin import measured_device, napkin_estimate
from minieng.measure.peaks import Peak

pytest.importorskip("ipywidgets")


@pytest.fixture(autouse=True)
def unattended(monkeypatch, tmp_path):
    """A notebook of its own, its results in tmp_path, neither smoke nor the runner's flag set."""
    monkeypatch.setenv("MINIENG_NOTEBOOK", "03_decode")
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path))
    monkeypatch.delenv("MINIENG_SMOKE", raising=False)
    monkeypatch.delenv(predictions.HEADLESS_ENV, raising=False)


def stored(tmp_path) -> dict:
    return json.loads((tmp_path / "predictions-03_decode.json").read_text())


def ask(**kwargs):
    args = dict(question="TPOT at batch 1?", napkin=13.7, unit="ms") | kwargs
    return prediction_input("tpot", **args)


def test_the_prediction_is_stored_before_the_measurement_and_scored_after(tmp_path, capsys):
    box = ask()
    assert predictions_path() == tmp_path / "predictions-03_decode.json"
    box.control.value = "20 ms"  # what the reader types, then Enter
    entry = stored(tmp_path)["tpot"]
    assert entry["prediction"] == 20.0 and entry["source"] == "reader" and entry.get("measured") is None
    assert "stored: <b>20 ms</b>" in box.status.value

    score("tpot", 35.0, why="launches and small kernels the floor leaves out")
    out = capsys.readouterr().out
    assert "your prediction" in out and "20 ms" in out and "35 ms" in out and "13.7 ms" in out
    assert "measured is 1.75x your prediction (within 2x)" in out
    assert f"measured is {35 / 13.7:.3g}x the napkin value" in out and "launches and small kernels" in out
    entry = stored(tmp_path)["tpot"]
    assert entry["measured"] == 35.0 and entry["ratio"] == pytest.approx(1.75)
    assert entry["napkin_ratio"] == pytest.approx(35 / 13.7) and entry["scored_at"] >= entry["predicted_at"]


def test_smoke_mode_fills_the_prediction_with_the_napkin_value_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINIENG_SMOKE", "1")
    predict("tpot", "TPOT at batch 1?", napkin=13.7, unit="ms")
    out = capsys.readouterr().out
    assert "smoke mode" in out and "napkin model's value, 13.7 ms" in out
    entry = stored(tmp_path)["tpot"]
    assert entry["prediction"] == 13.7 and entry["source"] == "napkin"
    result = score_prediction("tpot", 41.1)
    assert result.ratio == result.napkin_ratio == pytest.approx(3.0)
    assert "filled in: nobody typed" in result.text() and "3x the prediction (3x off)" in result.text()


def test_the_course_runner_flag_fills_the_napkin_value_too(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(predictions.HEADLESS_ENV, "1")
    monkeypatch.setattr(predictions, "in_kernel", lambda: True)  # a kernel, but nobody at it
    assert predictions.can_type() is False
    predict("tpot", "TPOT at batch 1?", napkin=13.7, unit="ms")
    assert "without a reader" in capsys.readouterr().out
    assert stored(tmp_path)["tpot"]["source"] == "napkin"


def test_a_typed_value_is_kept_when_the_cell_runs_again(tmp_path, monkeypatch, capsys):
    ask().control.value = "20"
    score_prediction("tpot", 35.0)
    again = ask()  # the predict cell run again: the box shows the reader's value
    assert again.control.value == "20" and "stored: <b>20 ms</b>" in again.status.value
    entry = stored(tmp_path)["tpot"]
    assert entry["prediction"] == 20.0 and entry["source"] == "reader"
    assert entry.get("measured") is None  # a new round: the old score is cleared until scored again
    # a run where nobody types (smoke) keeps it as well, rather than the napkin value
    monkeypatch.setenv("MINIENG_SMOKE", "1")
    predict("tpot", "TPOT at batch 1?", napkin=13.7, unit="ms")
    assert "your prediction typed at" in capsys.readouterr().out
    assert stored(tmp_path)["tpot"]["prediction"] == 20.0


def test_a_napkin_fill_is_cleared_where_the_reader_can_type(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIENG_SMOKE", "1")
    predict("tpot", "TPOT at batch 1?", napkin=13.7, unit="ms")
    monkeypatch.delenv("MINIENG_SMOKE")
    box = ask()
    assert box.control.value == "" and stored(tmp_path)["tpot"]["prediction"] is None
    result = score_prediction("tpot", 30.0)  # the cells ran on before anything was typed
    assert result.prediction is None and "none was stored before the measurement ran" in result.text()
    assert result.napkin_ratio == pytest.approx(30 / 13.7)


def test_a_value_typed_after_the_measurement_is_marked(tmp_path):
    box = ask()
    score_prediction("tpot", 35.0)
    box.control.value = "34"
    assert stored(tmp_path)["tpot"]["after_measurement"] is True
    assert "typed after the measurement" in box.status.value
    assert "typed after an earlier measurement" in score_prediction("tpot", 35.0).text()


def test_a_choice_question(tmp_path):
    box = prediction_input("bound", "What bounds batch-1 decode here?", napkin="memory", choices=["compute", "memory"])
    assert box.control.value is None  # nothing picked for the reader
    box.control.value = "compute"
    assert stored(tmp_path)["bound"]["prediction"] == "compute"
    result = score_prediction("bound", "memory", why="a decode step reads every weight for one token")
    assert result.right is False and result.napkin_right is True
    assert "wrong: you predicted compute" in result.text() and "right. Why: a decode step" in result.text()
    assert prediction_input("bound", "What bounds batch-1 decode here?", napkin="memory",
                            choices=["compute", "memory"]).control.value == "compute"  # fmt: skip
    with pytest.raises(ValueError, match="not one of the choices"):
        score_prediction("bound", "overhead")
    with pytest.raises(ValueError, match="not one of the choices"):
        predict("bound", "What bounds it?", napkin="bandwidth", choices=["compute", "memory"])
    with pytest.raises(ValueError, match="two or more distinct choices"):
        predict("bound", "What bounds it?", napkin="memory", choices=["memory"])


def test_bad_input_is_refused_with_a_clear_message(tmp_path):
    box = ask()
    box.control.value = "fast"
    assert "not stored" in box.status.value and "is not a number: type a number in ms" in box.status.value
    box.control.value = "12 s"
    assert "type the number in ms, the unit this question asks for" in box.status.value
    assert stored(tmp_path)["tpot"]["prediction"] is None
    with pytest.raises(ValueError, match="nothing typed"):
        record_prediction("tpot", "  ")
    with pytest.raises(ValueError, match="finite"):
        record_prediction("tpot", float("nan"))
    with pytest.raises(KeyError, match="run its predict"):
        record_prediction("never_asked", 3)
    with pytest.raises(KeyError, match="before the measurement"):
        score("never_asked", 3)
    with pytest.raises(ValueError, match="measured='35 ms': give a"):
        score("tpot", "35 ms")  # a measurement is a number, not text
    with pytest.raises(ValueError, match="napkin"):
        predict("tpot", "TPOT?", napkin=None, unit="ms")


@pytest.mark.parametrize(
    "text,unit,value",
    [("13.7", "ms", 13.7), ("13.7 ms", "ms", 13.7), ("13,7", "ms", 13.7), ("1,200", "tokens", 1200),
     ("2e3 tokens", "tokens", 2000), ("12x", "x", 12), ("12 ×", "x", 12), ("40%", "%", 40)],
)  # fmt: skip
def test_parse_number_reads_what_a_reader_types(text, unit, value):
    assert parse_number(text, unit) == pytest.approx(value)


def test_load_predictions_reads_every_notebook_and_leaves_out_older_questions(tmp_path, monkeypatch):
    ask().control.value = "20"
    monkeypatch.setenv("MINIENG_NOTEBOOK", "05_batching")
    predict("speedup", "tok/s at batch 8 over batch 1?", napkin=7.5, unit="x")
    found = load_predictions(tmp_path)
    assert list(found) == ["03_decode", "05_batching"]
    assert found["03_decode"][0]["key"] == "tpot" and found["05_batching"][0]["prediction"] == 7.5
    assert load_predictions(tmp_path, since="2999-01-01 00:00:00 UTC") == {}


def test_napkin_here_is_the_calculator_on_this_machines_ceilings():
    peak = Peak("measured cpu float32", 0.18, 40.0, "measured")
    ceilings = SimpleNamespace(device="cpu", dtype="float32", peak=peak)
    smol = published_config("SmolLM2-135M")
    here = predictions.napkin_here(smol, ceilings, torch.float32, 1, 512, 72)
    sheet = napkin_estimate(smol, measured_device(peak, 2**34, "float32"), "fp32", 1, 512, 72)
    assert here.tpot_floor_s == pytest.approx(sheet.tpot_floor_s)
    assert here.ttft_floor_s == pytest.approx(sheet.ttft_floor_s) and here.dtype == "fp32"


def test_a_measurement_far_below_the_prediction_is_5x_off_not_close(tmp_path):
    predict("tpot", "TPOT at batch 1?", napkin=10.0, unit="ms")
    record_prediction("tpot", 10.0)
    result = score_prediction("tpot", 2.0)  # 0.2x the prediction: as far off as 5x above it
    assert result.ratio == pytest.approx(0.2)
    assert "measured is 0.2x your prediction (5x off)" in result.text() and "close" not in result.text()
    assert "measured / prediction 0.2x (5x off)" in entry_cells(stored(tmp_path)["tpot"])[3]
    assert "(5x off)" in score_prediction("tpot", 50.0).text()  # 5x above reads the same


@pytest.mark.parametrize("measured,close", [(8.0, True), (12.5, True), (7.9, False), (12.6, False)])
def test_close_means_within_1_25x_either_way(tmp_path, measured, close):
    predict("tpot", "TPOT at batch 1?", napkin=10.0, unit="ms")
    record_prediction("tpot", 10.0)
    text = score_prediction("tpot", measured).text()
    assert ("close (within 25%)" in text) is close
    assert running_score().close == int(close)


def test_reveal_shows_the_question_and_a_folded_worked_answer_and_records_a_pencil_problem(tmp_path, capsys):
    reveal("kv_bytes", "How many bytes of KV does one token add?", "2 x 30 x 3 x 64 x 4 B = **46,080 B**")
    out = capsys.readouterr().out
    assert "Pencil problem: How many bytes of KV does one token add?" in out and "46,080 B" in out
    entry = stored(tmp_path)["kv_bytes"]
    assert entry["kind"] == "pencil" and entry["notebook"] == "03_decode" and "46,080" in entry["answer"]
    folded = predictions.pencil_markdown("Q?", "the answer")
    assert (
        folded.index("<details>") < folded.index("<summary>") < folded.index("the answer") < folded.index("</details>")
    )
    assert "Q?" in folded[: folded.index("<details>")]  # the question shows; the answer waits for a click
    with pytest.raises(KeyError, match="before the measurement"):
        score("kv_bytes", 46080)  # a pencil problem has nothing to score
    with pytest.raises(ValueError, match="answer"):
        reveal("empty", "Q?", "  ")


def test_reveal_in_a_kernel_displays_markdown_with_the_answer_folded(tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(predictions, "in_kernel", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    reveal("ridge", "Where is the ridge point?", "peak / bandwidth = **12 FLOP/B**")
    assert len(shown) == 1 and "<details>" in shown[0].data and "**12 FLOP/B**" in shown[0].data


def test_running_score_counts_asked_scored_close_and_pencil_problems(tmp_path, capsys):
    assert running_score().sentence().startswith("no prediction asked")
    predict("a", "A?", napkin=10.0, unit="ms")
    record_prediction("a", 10.0)
    score_prediction("a", 11.0)  # 1.1x: close
    predict("b", "B?", napkin=10.0, unit="ms")
    record_prediction("b", 10.0)
    score_prediction("b", 2.0)  # 0.2x: 5x off
    predict("c", "C?", napkin="memory", choices=["compute", "memory"])
    score_prediction("c", "memory")  # the napkin's choice, filled in: right
    predict("d", "D?", napkin=1.0, unit="ms")  # asked, not yet measured
    reveal("e", "E?", "42")
    capsys.readouterr()
    got = running_score()
    assert got == RunningScore(
        "03_decode", asked=4, scored=3, close=2, typed=2, napkin_scored=3, napkin_close=2, pencil=1
    )
    assert "4 predictions asked, 3 scored: 2 close (within 1.25x, or the right choice), 1 further off" in got.text()
    assert "1 pencil problem shown" in got.text() and got.text() in capsys.readouterr().out
    assert got._repr_markdown_().startswith("**Score so far in 03_decode:**")


def test_course_score_sums_every_notebooks_file(tmp_path, monkeypatch, capsys):
    predict("a", "A?", napkin=10.0, unit="ms")
    score_prediction("a", 10.0)  # the napkin value, filled in: close
    monkeypatch.setenv("MINIENG_NOTEBOOK", "05_batching")
    predict("b", "B?", napkin=10.0, unit="x")
    score_prediction("b", 30.0)  # 3x off
    reveal("c", "C?", "42")
    reveal("d", "D?", "43")
    total = course_score(tmp_path).total
    assert (total.asked, total.scored, total.close, total.pencil, total.typed) == (2, 2, 1, 2, 0)
    assert [s.notebook for s in course_score(tmp_path).notebooks] == ["03_decode", "05_batching"]
    assert "every one the napkin model's value" in total.sentence()
    assert "| 05_batching | 1 | 1 | 0 | 2 |" in course_score(tmp_path).markdown()
    assert course_score(tmp_path, since="2999-01-01 00:00:00 UTC").notebooks == ()
