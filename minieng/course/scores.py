"""Scores: each prediction set beside its measurement (``score``), a notebook's score so far
(``running_score``) and the whole course's (``course_score``).

``score(key, measured, why=...)`` runs after the measurement that ``predictions.predict(key, ...)``
asked the reader to predict: it shows the prediction against the measurement (the ratio for a number,
right or wrong for a choice) and the napkin model's value with one line on why the two differ, and
stores the score in the notebook's predictions file. A prediction is close when the measurement is
within ``CLOSE_RATIO`` (1.25x) of it either way (0.8x to 1.25x), or, for a choice, right; further off,
it says by how much ("5x off" for a measurement at 0.2x the prediction, as for one at 5x).

``running_score()`` counts a notebook's file: the predictions asked, scored and close, and the pencil
problems shown (``predictions.reveal``); ``course_score()`` every notebook's in the results folder
(00's claims index and the course runner's index page show it). Both display as Markdown.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from minieng.course.predictions import (
    CLOSE_RATIO,
    FILE_PREFIX,
    NAPKIN,
    PENCIL,
    READER,
    as_number,
    check_choice,
    format_value,
    is_number,
    now_utc,
    predictions_path,
    read_entries,
    write_entries,
)
from minieng.course.session import in_kernel, results_dir, running_notebook


def closeness(ratio: float) -> str:
    """How far a measurement at ``ratio`` x a prediction is from it, either way: "close (within 25%)"
    within ``CLOSE_RATIO``, "within 2x", else "5x off" (ratio 5 or 0.2)."""
    off = max(ratio, 1 / ratio)
    if off <= CLOSE_RATIO:
        return f"close (within {100 * (CLOSE_RATIO - 1):.0f}%)"
    if off <= 2:
        return "within 2x"
    return f"{format_value(off, 'x')} off"


def is_close(ratio: float | None) -> bool:
    """Whether a measurement at ``ratio`` x the prediction is within ``CLOSE_RATIO`` of it, either way."""
    return ratio is not None and ratio > 0 and max(ratio, 1 / ratio) <= CLOSE_RATIO


@dataclass(frozen=True)
class Score:
    """A prediction set beside its measurement (``score_prediction``).

    Attributes:
        key, question, unit, choices: the question's (``predict``'s).
        prediction: the reader's value (or the napkin's, ``source`` "napkin"); None when none was
            stored before the measurement.
        source: "reader", "napkin" or None.
        measured: the measurement (a number in ``unit``, or one of ``choices``).
        napkin: the napkin model's value.
        ratio: measured / prediction (numbers, both > 0; else None).
        napkin_ratio: measured / napkin (numbers, both > 0; else None).
        right: the choice was right (choices; else None). ``napkin_right`` likewise for the napkin.
        why: one line on why the napkin value and the measurement differ.
        after_measurement: the prediction was typed after an earlier measurement was shown.
    """

    key: str
    question: str
    unit: str
    choices: list[str] | None
    prediction: float | str | None
    source: str | None
    measured: float | str
    napkin: float | str
    ratio: float | None
    napkin_ratio: float | None
    right: bool | None
    napkin_right: bool | None
    why: str
    after_measurement: bool = False

    def rows(self) -> list[tuple[str, str, str]]:
        """(what, value, reading) rows: the prediction, the measurement against it, the napkin value."""
        unit = self.unit
        if self.prediction is None:
            yours = ("your prediction", "none", "none was stored before the measurement ran")
        elif self.source == NAPKIN:
            yours = (
                "prediction",
                format_value(self.prediction, unit),
                "the napkin model's value, filled in: nobody typed",
            )
        else:
            late = " (typed after an earlier measurement was shown)" if self.after_measurement else ""
            yours = ("your prediction", format_value(self.prediction, unit), "typed before the measurement" + late)
        if self.prediction is None:
            against = "nothing to score"
        elif self.choices is not None:
            against = "right" if self.right else f"wrong: you predicted {self.prediction}"
        else:
            mine = "the prediction" if self.source == NAPKIN else "your prediction"
            against = _against(self.measured, self.prediction, self.ratio, unit, mine)
        if self.choices is not None:
            napkin = "right" if self.napkin_right else "wrong"
        else:
            napkin = _against(self.measured, self.napkin, self.napkin_ratio, unit, "the napkin value")
        return [
            yours,
            ("measured", format_value(self.measured, unit), against),
            ("napkin model", format_value(self.napkin, unit), f"{napkin}. Why: {self.why}"),
        ]

    def markdown(self) -> str:
        lines = [f"**Prediction scored.** {self.question}", "", "| | value | |", "| --- | --- | --- |"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in self.rows()]
        return "\n".join(lines)

    def text(self) -> str:
        rows = self.rows()
        width = max(len(a) for a, _, _ in rows)
        vwidth = max(len(b) for _, b, _ in rows)
        return "\n".join(
            [f"Prediction scored: {self.question}"] + [f"  {a:<{width}}  {b:>{vwidth}}  {c}" for a, b, c in rows]
        )

    def _repr_markdown_(self) -> str:
        return self.markdown()


def _against(measured, predicted, ratio: float | None, unit: str, what: str) -> str:
    """The measurement against a predicted number, in words: the ratio and how close, or the
    difference where a ratio means nothing (a value <= 0)."""
    if ratio is None:
        return f"measured is {format_value(measured - predicted, unit)} from {what}"
    return f"measured is {ratio:.3g}x {what} ({closeness(ratio)})"


def _ratio(measured, predicted) -> float | None:
    if not (is_number(measured) and is_number(predicted)) or measured <= 0 or predicted <= 0:
        return None
    return measured / predicted


DEFAULT_WHY = {
    "number": "the napkin model is the roofline's floor from FLOPs and bytes at the peaks; kernel launches, "
    "kernels below the peaks and the host between them are what it leaves out",
    "choice": "the napkin model reasons from FLOPs and bytes alone",
}


def score_prediction(key: str, measured, why: str = "", directory: Path | None = None) -> Score:
    """Score ``key``'s stored prediction against ``measured`` and store the score beside it; returns
    the ``Score`` (``score`` shows it). ``why``: one line on why the napkin value and the measurement
    differ (a generic line when empty).

    Raises:
        KeyError: no ``predict(key, ...)`` has run in this notebook's results folder.
        ValueError: ``measured`` is not a finite number (a number question) or not one of the choices.
    """
    path = predictions_path(directory=directory)
    entries = read_entries(path)
    if key not in entries or entries[key].get("kind") == PENCIL:
        raise KeyError(f"no prediction {key!r} in {path}: run its predict(...) cell before the measurement")
    e = entries[key]
    choices = e.get("choices")
    if choices is not None:
        measured = check_choice(str(measured), choices, f"score({key!r}): measured")
    else:
        measured = as_number(measured, f"score({key!r}): measured")
    why = (why or DEFAULT_WHY["choice" if choices is not None else "number"]).strip()
    prediction, napkin = e.get("prediction"), e["napkin"]
    result = Score(
        key=key,
        question=e["question"],
        unit=e.get("unit", ""),
        choices=choices,
        prediction=prediction,
        source=e.get("source") if prediction is not None else None,
        measured=measured,
        napkin=napkin,
        ratio=None if choices is not None else _ratio(measured, prediction),
        napkin_ratio=None if choices is not None else _ratio(measured, napkin),
        right=None if choices is None or prediction is None else prediction == measured,
        napkin_right=None if choices is None else napkin == measured,
        why=why,
        after_measurement=bool(e.get("after_measurement")),
    )
    e |= {
        "measured": measured,
        "ratio": result.ratio,
        "napkin_ratio": result.napkin_ratio,
        "right": result.right,
        "napkin_right": result.napkin_right,
        "why": why,
        "scored_at": now_utc(),
        "after_measurement": False,
    }
    write_entries(path, entries)
    return result


def score(key: str, measured, why: str = "", directory: Path | None = None) -> None:
    """After a measurement, show ``key``'s prediction against it and the napkin value with ``why``
    (one line on why the napkin and the measurement differ), and store the score
    (``score_prediction``, whose errors it raises). Displays Markdown in a kernel, prints elsewhere."""
    result = score_prediction(key, measured, why, directory)
    if in_kernel():
        from IPython.display import Markdown, display  # lazy: IPython is there only in a kernel

        display(Markdown(result.markdown()))
    else:
        print(result.text())


def load_predictions(directory: Path | None = None, since: str | None = None) -> dict[str, list[dict]]:
    """Every notebook's predictions in the results folder: {notebook: [entry, ...]} in the order they
    were asked, each entry with its ``key``; pencil problems (kind "pencil", ``reveal``) included. ``since``: only questions asked at or after this time
    (``now_utc``'s format), so a run's index leaves out what an earlier run left in the folder."""
    found = {}
    for path in sorted(results_dir(directory).glob(f"{FILE_PREFIX}*.json")):
        rows = [
            {"key": key, **entry}
            for key, entry in read_entries(path).items()
            if isinstance(entry, dict) and (since is None or str(entry.get("asked_at", "")) >= since)
        ]
        if rows:
            found[path.stem.removeprefix(FILE_PREFIX)] = rows
    return found


def entry_cells(entry: dict) -> tuple[str, str, str, str]:
    """A stored entry as text: (prediction with who made it, measured, napkin value, score)."""
    unit = entry.get("unit", "")
    prediction = format_value(entry.get("prediction"), unit)
    if entry.get("source") == NAPKIN:
        prediction += " (the napkin value: nobody typed)"
    elif entry.get("after_measurement"):
        prediction += " (typed after the measurement)"
    measured = entry.get("measured")
    if measured is None:
        return prediction, "not measured", format_value(entry.get("napkin"), unit), ""
    if entry.get("choices") is not None:
        verdict = "" if entry.get("right") is None else ("right" if entry["right"] else "wrong")
        napkin_verdict = "napkin right" if entry.get("napkin_right") else "napkin wrong"
        verdict = f"{verdict}; {napkin_verdict}" if verdict else napkin_verdict
    else:
        ratio, napkin_ratio = entry.get("ratio"), entry.get("napkin_ratio")
        parts = []  # a ratio is None where a value is zero or not a number: no ratio to print
        if ratio is not None:
            parts.append(f"measured / prediction {ratio:.3g}x ({closeness(ratio)})")
        if napkin_ratio is not None:
            parts.append(f"measured / napkin {napkin_ratio:.3g}x ({closeness(napkin_ratio)})")
        verdict = "; ".join(parts)
    return prediction, format_value(measured, unit), format_value(entry.get("napkin"), unit), verdict


@dataclass(frozen=True)
class RunningScore:
    """A notebook's score so far, counted from its predictions file (or the course's, summed).

    Attributes:
        notebook: the notebook's name ("course" for ``course_score``'s total).
        asked: predictions asked (``predict``).
        scored: predictions set beside a measurement (``score``) that held a prediction.
        close: of those, within ``CLOSE_RATIO`` of the measurement, or the right choice.
        typed: of ``scored``, predictions a reader typed (the rest are the napkin value, filled in
            where nobody types: smoke mode, the course runner).
        napkin_scored, napkin_close: the napkin model's values scored, and those close (or right).
        pencil: pencil problems shown (``reveal``).
    """

    notebook: str
    asked: int = 0
    scored: int = 0
    close: int = 0
    typed: int = 0
    napkin_scored: int = 0
    napkin_close: int = 0
    pencil: int = 0

    @classmethod
    def of(cls, notebook: str, entries: list[dict]) -> RunningScore:
        """The score of a predictions file's entries (``load_predictions``' rows, or its values)."""
        asked = [e for e in entries if isinstance(e, dict) and e.get("kind") != PENCIL]
        measured = [e for e in asked if e.get("measured") is not None]
        scored = [e for e in measured if e.get("prediction") is not None]

        def hit(e: dict, right: str, ratio: str) -> bool:
            return bool(e.get(right)) if e.get("choices") is not None else is_close(e.get(ratio))

        return cls(
            notebook=notebook,
            asked=len(asked),
            scored=len(scored),
            close=sum(hit(e, "right", "ratio") for e in scored),
            typed=sum(e.get("source") == READER for e in scored),
            napkin_scored=len(measured),
            napkin_close=sum(hit(e, "napkin_right", "napkin_ratio") for e in measured),
            pencil=sum(isinstance(e, dict) and e.get("kind") == PENCIL for e in entries),
        )

    def __add__(self, other: RunningScore) -> RunningScore:
        counts = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.name != "notebook"}
        return RunningScore(self.notebook, **counts)

    def sentence(self) -> str:
        """The score in one sentence, e.g. "3 predictions asked, 2 scored: 1 close (within 1.25x, or
        the right choice), 1 further off; 2 pencil problems shown."."""
        if not self.asked and not self.pencil:
            return "no prediction asked and no pencil problem shown yet"
        parts = [
            f"{self.asked} prediction{'s' * (self.asked != 1)} asked, {self.scored} scored: {self.close} close "
            f"(within {CLOSE_RATIO:g}x, or the right choice), {self.scored - self.close} further off; "
            f"{self.pencil} pencil problem{'s' * (self.pencil != 1)} shown"
        ]
        if self.scored and not self.typed:
            parts.append("every one the napkin model's value (nobody typed)")
        elif self.napkin_scored:
            parts.append(
                f"{self.typed} typed by you; the napkin model: {self.napkin_close} of {self.napkin_scored} close"
            )
        return "; ".join(parts) + "."

    def text(self) -> str:
        return f"Score so far in {self.notebook}: {self.sentence()}"

    def markdown(self) -> str:
        return f"**Score so far in {self.notebook}:** {self.sentence()}"

    def _repr_markdown_(self) -> str:
        return self.markdown()


@dataclass(frozen=True)
class CourseScore:
    """Every notebook's ``RunningScore`` (in name order) and their sum (``total``)."""

    notebooks: tuple[RunningScore, ...]

    @classmethod
    def of(cls, predictions: dict[str, list[dict]]) -> CourseScore:
        """The course's score from ``load_predictions``' {notebook: entries}."""
        return cls(tuple(RunningScore.of(name, rows) for name, rows in sorted(predictions.items())))

    @property
    def total(self) -> RunningScore:
        return sum(self.notebooks, RunningScore("the course"))

    def markdown(self) -> str:
        head = ["| notebook | asked | scored | close | pencil problems |", "| --- | --- | --- | --- | --- |"]
        rows = [f"| {s.notebook} | {s.asked} | {s.scored} | {s.close} | {s.pencil} |" for s in self.notebooks]
        return "\n".join([f"**The course's score:** {self.total.sentence()}", "", *head, *rows])

    def text(self) -> str:
        rows = [f"  {s.notebook:<28} {s.sentence()}" for s in self.notebooks]
        return "\n".join([f"The course's score: {self.total.sentence()}", *rows])

    def _repr_markdown_(self) -> str:
        return self.markdown()


def notebook_score(notebook: str | None = None, directory: Path | None = None) -> RunningScore:
    """``running_score``'s count, shown nowhere: ``notebook``'s predictions file (default the running
    notebook's) in the results folder (``directory``, default ``kit.cached``'s)."""
    name = notebook or running_notebook() or "notebook"
    return RunningScore.of(name, list(read_entries(predictions_path(name, directory)).values()))


def running_score(notebook: str | None = None, directory: Path | None = None) -> RunningScore:
    """This notebook's score so far (``notebook``, default the running one), counted from its
    predictions file in the results folder (``directory``, default ``kit.cached``'s): predictions
    asked, scored, close (within ``CLOSE_RATIO`` or the right choice), pencil problems shown.
    Returns a ``RunningScore``, which displays as Markdown (a cell's last line shows it; else pass it
    to ``display``); outside a notebook kernel it is printed too."""
    result = notebook_score(notebook, directory)
    if not in_kernel():
        print(result.text())
    return result


def course_score(directory: Path | None = None, since: str | None = None) -> CourseScore:
    """The whole course's score: every notebook's predictions file in the results folder (``directory``,
    default ``kit.cached``'s; ``since``: only what was asked at or after that time, ``now_utc``'s
    format). Returns a ``CourseScore``, which displays as Markdown (a table per notebook under the
    total); outside a notebook kernel it is printed too."""
    result = CourseScore.of(load_predictions(directory, since))
    if not in_kernel():
        print(result.text())
    return result
