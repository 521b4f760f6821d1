"""Predictions the course scores: the reader's guess, stored before a measurement, set beside it after.

Where a notebook asks the reader to predict, two calls frame the measurement:

- ``predict(key, question, unit="ms", napkin=value)`` (or ``choices=[...]`` for a choice) shows a
  small input under the question, before the measuring cell runs. What the reader types is stored at
  once (Enter, or the Store button) in the results folder: ``predictions-<notebook>.json``, one file
  per notebook keyed by ``key``, beside ``kit.cached``'s results. A typed value is kept when the cell
  runs again (the input shows it), and a value typed after the measurement is marked so.
- ``score(key, measured, why=...)`` (``course.scores``) after the measurement shows the prediction
  against it (the ratio for a number, right or wrong for a choice) and the napkin model's value with
  one line on why the napkin and the measurement differ.

A prompt the reader answers on paper instead is a pencil problem: ``reveal(key, question, answer)``
shows the question and a worked answer folded until the reader opens it, and records the problem in
the same file (kind "pencil"), so the notebook's running score counts it (``scores.running_score``).

``napkin`` is what the napkin model (``measure.napkin.napkin_estimate``, the roofline's floors from
``measure.flops_bytes``' counts; ``napkin_here`` gives it for this machine's measured ceilings)
predicts. Where nobody can type (smoke mode, ``MINIENG_SMOKE=1``; a run without a reader,
``MINIENG_HEADLESS=1``, which the course runner sets; or no notebook kernel) the prediction is the
napkin value, and the notebook says so: CI runs unattended and still scores every prediction.

The course runner (``python -m minieng course``) reads the files back (``scores.load_predictions``) and
lists each prediction beside its measurement on its index page, with the course's score.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import os
import re
from pathlib import Path

from minieng.course.session import in_kernel, results_dir, running_notebook
from minieng.measure.harness import smoke_mode
from minieng.measure.napkin import (
    TORCH_DTYPE_NAMES,
    NapkinEstimate,
    measured_device,
    napkin_estimate,
    this_machine_device,
)

HEADLESS_ENV = "MINIENG_HEADLESS"  # set by the course runner: its kernels run with no reader to type
FILE_PREFIX = "predictions-"
READER, NAPKIN = "reader", "napkin"  # who made a stored prediction
CLOSE_RATIO = 1.25  # a measurement within this factor of the prediction counts as close
PENCIL = "pencil"  # the ``kind`` of a stored pencil problem (``reveal``); a ``predict`` entry has no kind
# A memory for "this machine" when the OS does not say how much it has: it only sizes the KV capacity,
# which no prediction here reads; the floors do not depend on it.
UNKNOWN_MEMORY_BYTES = 2**40


def now_utc() -> str:
    """UTC time to the second, as text that sorts in time order."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def predictions_path(notebook: str | None = None, directory: Path | None = None) -> Path:
    """The predictions file of ``notebook`` (default: the running one, ``kit.running_notebook``) in
    the results folder (``kit.cached``'s: ``directory``, else ``MINIENG_RESULTS_DIR``, else ``results/``)."""
    name = running_notebook() if notebook is None else notebook
    return results_dir(directory) / f"{FILE_PREFIX}{name or 'notebook'}.json"


def read_entries(path: Path) -> dict:
    """A JSON object file's entries by key (a predictions file; ``course_path``'s run times); {} for a
    missing or unreadable file, or one that holds no object (never fatal)."""
    try:
        kept = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def write_entries(path: Path, entries: dict) -> None:
    """Write ``entries`` to ``path`` as JSON at once (a temporary file renamed over it), so a reader
    never sees half a file; its folder is made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=1, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)


def format_value(value, unit: str = "") -> str:
    """A prediction or a measurement as text: three significant digits (thousands grouped), its unit
    after it ("x" and "%" without a space), a choice as itself; "none" for None."""
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    number = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if not unit:
        return number
    return f"{number}{unit}" if unit in ("x", "%") else f"{number} {unit}"


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def as_number(value, what: str) -> float:
    """``value`` as a float (numpy scalars included), or ``ValueError`` naming ``what``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}={value!r}: give a number") from None
    if isinstance(value, (bool, str)) or not math.isfinite(number):
        raise ValueError(f"{what}={value!r}: give a finite number (not text, a bool, inf or nan)")
    return number


def parse_number(text: str, unit: str = "") -> float:
    """A typed prediction as a number: "13.7", "13.7 ms" (the question's unit may follow), "1,200",
    "13,7" (a decimal comma), "2e3", "12x".

    Raises:
        ValueError: empty text, a word, another unit than ``unit``, or a number that is not finite;
            the message says what to type.
    """
    wanted = f" in {unit}" if unit else ""
    s = text.strip().replace("×", "x").replace(" ", "")
    if not s:
        raise ValueError(f"nothing typed: type a number{wanted} and press Enter")
    if unit and s.lower().endswith(unit.replace(" ", "").lower()):
        s = s[: -len(unit.replace(" ", ""))]
    if "," in s:
        if "." not in s and re.fullmatch(r"[+-]?\d+,\d+", s) and not re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+", s):
            s = s.replace(",", ".")  # "13,7": a decimal comma
        else:
            s = s.replace(",", "")  # "1,200": thousands
    try:
        value = float(s)
    except ValueError:
        if unit and re.fullmatch(r"[+-]?\.?\d[\d.eE+-]*[^\d\s]+", s):
            raise ValueError(
                f"{text!r}: type the number in {unit}, the unit this question asks for (e.g. 12.5)"
            ) from None
        raise ValueError(f"{text!r} is not a number: type a number{wanted} (e.g. 12.5)") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number: type a number{wanted}")
    return value


def check_choice(value, choices: list[str], what: str) -> str:
    if value not in choices:
        raise ValueError(f"{what}={value!r} is not one of the choices {choices}")
    return value


def _ask(key: str, question: str, unit: str, napkin, choices, directory: Path | None) -> tuple[Path, dict]:
    """Validate a question and store it (its text, unit, choices, napkin value); a reader's earlier
    prediction that still fits the question is kept, anything else (a napkin fill, a choice no longer
    offered) is cleared, and the last score is cleared: a new round of predict, measure, score."""
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"key={key!r}: name the prediction (a short text, unique in its notebook)")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"predict({key!r}): give the question the reader answers")
    if choices is not None:
        choices = [str(c) for c in choices]
        if len(choices) < 2 or len(set(choices)) != len(choices):
            raise ValueError(f"predict({key!r}): choices={choices}: give two or more distinct choices")
        napkin = check_choice(napkin, choices, f"predict({key!r}): napkin")
    else:
        napkin = as_number(napkin, f"predict({key!r}): napkin")
    path = predictions_path(directory=directory)
    entries = read_entries(path)
    old = entries.get(key, {})
    prediction, source, at = old.get("prediction"), old.get("source"), old.get("predicted_at")
    fits = choices is not None and prediction in choices or choices is None and is_number(prediction)
    if source != READER or not fits:
        prediction, source, at = None, None, None
    entries[key] = {
        "notebook": running_notebook(),
        "question": question.strip(),
        "unit": unit,
        "choices": choices,
        "napkin": napkin,
        "prediction": prediction,
        "source": source,
        "predicted_at": at,
        "asked_at": now_utc(),
    }
    write_entries(path, entries)
    return path, entries[key]


def record_prediction(key: str, value, directory: Path | None = None) -> dict:
    """Store the reader's prediction for ``key`` (the input's callback; a notebook may call it too):
    a number or its text ("13.7 ms") for a number question, one of the choices for a choice.
    Returns the stored entry.

    Raises:
        KeyError: no ``predict(key, ...)`` has run in this notebook's results folder.
        ValueError: ``value`` is not a number of the question's unit, or not one of its choices; the
            message says what to type.
    """
    path = predictions_path(directory=directory)
    entries = read_entries(path)
    if key not in entries:
        raise KeyError(f"no question {key!r} in {path}: run its predict(...) cell first")
    entry = entries[key]
    if entry.get("choices") is not None:
        value = check_choice(value, entry["choices"], "your prediction")
    elif isinstance(value, str):
        value = parse_number(value, entry.get("unit", ""))
    else:
        value = as_number(value, "your prediction")
    entry |= {"prediction": value, "source": READER, "predicted_at": now_utc()}
    entry["after_measurement"] = entry.get("measured") is not None
    write_entries(path, entries)
    return entry


def can_type() -> bool:
    """Whether a reader can type a prediction here: a notebook kernel with ipywidgets, not in smoke
    mode, not a run without a reader (``MINIENG_HEADLESS``, which the course runner sets)."""
    if smoke_mode() or os.environ.get(HEADLESS_ENV, "").lower() not in ("", "0", "false", "no"):
        return False
    return in_kernel()


def _why_no_reader() -> str:
    if smoke_mode():
        return "smoke mode (MINIENG_SMOKE=1)"
    if os.environ.get(HEADLESS_ENV, "").lower() not in ("", "0", "false", "no"):
        return f"a run without a reader ({HEADLESS_ENV}=1: the course runner)"
    return "no notebook kernel to type in"


def _input_widget(key: str, entry: dict, directory: Path | None):
    """The input of ``prediction_input``: the question, a text box with its unit (or the choices) and
    a Store button, and a status line that says what was stored or why a value was refused."""
    import ipywidgets as w  # lazy: the notebooks extra's

    unit = entry["unit"]
    question = w.HTML(f"<b>Your prediction.</b> {html.escape(entry['question'])}")
    status = w.HTML()

    def stored(e: dict) -> str:
        late = " (typed after the measurement)" if e.get("after_measurement") else ""
        return (
            f"<i>stored: <b>{html.escape(format_value(e['prediction'], unit))}</b> at {e['predicted_at']}{late}; "
            "run the next cells to measure it</i>"
        )

    def refused(message: str) -> str:
        return f"<span style='color:#b00'>not stored: {html.escape(message)}</span>"

    if entry["choices"] is not None:
        control = w.RadioButtons(options=entry["choices"], value=entry["prediction"], description="")

        def on_choice(change):
            if change["new"] is not None:
                status.value = stored(record_prediction(key, change["new"], directory))

        control.observe(on_choice, names="value")
        row = control
    else:
        typed = "" if entry["prediction"] is None else f"{entry['prediction']:.10g}"
        control = w.Text(value=typed, placeholder="a number", continuous_update=False, description="")
        store = w.Button(description="Store")

        def on_text(_=None):
            try:
                status.value = stored(record_prediction(key, control.value, directory))
            except ValueError as e:
                status.value = refused(str(e))

        control.observe(on_text, names="value")
        store.on_click(on_text)
        row = w.HBox([control, w.Label(unit), store])
    if entry["prediction"] is not None:
        status.value = stored(entry)
    else:
        how = "pick one" if entry["choices"] is not None else "type a number and press Enter"
        status.value = f"<i>{how} before you run the measurement below</i>"
    box = w.VBox([question, row, status])
    box.control, box.status = control, status
    return box


def prediction_input(key: str, question: str, *, napkin, unit: str = "", choices=None, directory: Path | None = None):
    """The input ``predict`` shows in a notebook (an ipywidgets ``VBox``), for a test or a panel:
    ``box.control`` is the text box (or the ``RadioButtons`` of the choices), ``box.status`` the
    status line. The question is stored as ``predict`` stores it; a reader's earlier value fills the box."""
    _, entry = _ask(key, question, unit, napkin, choices, directory)
    return _input_widget(key, entry, directory)


def predict(key: str, question: str, *, napkin, unit: str = "", choices=None, directory: Path | None = None) -> None:
    """Ask the reader for a prediction before a measurement, and store it (module docstring).

    Args:
        key: the prediction's name, unique in its notebook ("ttft_vs_tpot"); ``score`` uses it.
        question: what the reader predicts, in one sentence.
        napkin: the napkin model's value (a number in ``unit``, or one of ``choices``): what
            ``score`` shows beside the measurement, and the prediction where nobody can type.
        unit: the number's unit ("ms", "x", "%", "tokens"); a typed value may end with it.
        choices: the answers of a choice question (two or more); None for a number.
        directory: the results folder (default ``kit.cached``'s).
    In a notebook kernel it shows the input (``prediction_input``); elsewhere, and in smoke mode or
    under the course runner, it prints the question and stores the napkin value as the prediction
    (a value the reader typed earlier is kept).

    Raises:
        ValueError: an empty key or question, a napkin value that is not a finite number (or not one
            of ``choices``), fewer than two distinct choices.
    """
    path, entry = _ask(key, question, unit, napkin, choices, directory)
    if can_type():
        from IPython.display import display  # lazy: IPython is there only in a kernel

        display(_input_widget(key, entry, directory))
        return
    print(f"Predict: {entry['question']}")
    if entry["source"] == READER:
        print(
            f"  (your prediction typed at {entry['predicted_at']} is kept: {format_value(entry['prediction'], unit)})"
        )
        return
    entries = read_entries(path)
    entries[key] |= {"prediction": entry["napkin"], "source": NAPKIN, "predicted_at": now_utc()}
    write_entries(path, entries)
    print(
        f"  ({_why_no_reader()}: nobody types here, so the prediction is the napkin model's value, "
        f"{format_value(entry['napkin'], unit)}; in Jupyter you type your own)"
    )


def pencil_markdown(question: str, answer: str) -> str:
    """A pencil problem as Markdown: the question, then the worked answer folded in an HTML
    ``<details>`` the reader opens on demand (JupyterLab, Colab and a static HTML page all fold it)."""
    return (
        f"**Pencil problem.** {question}\n\n<details>\n<summary><b>Worked answer</b> "
        f"(work it out first, then click to open)</summary>\n\n{answer}\n\n</details>"
    )


def reveal(key: str, question: str, answer: str, directory: Path | None = None) -> None:
    """A pencil problem: show ``question`` and, folded until the reader opens it, the worked
    ``answer`` (Markdown text; its numbers computed by the cell, e.g. from ``napkin_here``), and
    record in the notebook's predictions file that the problem was shown (kind "pencil"), so the
    course counts it (``scores.running_score``). Displays Markdown in a kernel, prints elsewhere.

    Args:
        key: the problem's name, unique in its notebook.
        question: what the reader works out, in a sentence or two.
        answer: the worked answer, as Markdown.
        directory: the results folder (default ``kit.cached``'s).

    Raises:
        ValueError: an empty key, question or answer.
    """
    for what, text in (("key", key), ("question", question), ("answer", answer)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"reveal({key!r}): {what}={text!r}: give a non-empty text")
    path = predictions_path(directory=directory)
    entries = read_entries(path)
    entries[key] = {
        "kind": PENCIL,
        "notebook": running_notebook(),
        "question": question.strip(),
        "answer": answer.strip(),
        "asked_at": now_utc(),
    }
    write_entries(path, entries)
    if in_kernel():
        from IPython.display import Markdown, display  # lazy: IPython is there only in a kernel

        display(Markdown(pencil_markdown(question.strip(), answer.strip())))
        return
    indented = "\n".join("    " + line for line in answer.strip().splitlines())
    print(f"Pencil problem: {question.strip()}\n  Worked answer (work it out first):\n{indented}")


def napkin_here(
    model_config,
    ceilings,
    dtype,
    batch_size: int = 1,
    prompt_tokens: int = 1,
    context_tokens: int = 0,
    price_per_device_hour: float | None = None,
) -> NapkinEstimate:
    """``measure.napkin.napkin_estimate`` of a model on this machine: its measured ceilings
    (``ceilings``, a ``ceilings.Ceilings``, e.g. a notebook's ``machine_ceilings()``) and memory.

    Args:
        model_config: the model's ``ModelConfig`` (``engine.model_config``).
        dtype: the engine's dtype (``torch.float32``, "float32") or a ``NAPKIN_DTYPES`` name ("fp32").
        batch_size, prompt_tokens, context_tokens, price_per_device_hour: ``napkin_estimate``'s.
    Returns:
        the ``NapkinEstimate``: ``ttft_floor_s``, ``tpot_floor_s``, ``prefill_tok_s_at_floor``, ...
    """
    name = str(dtype).removeprefix("torch.")
    spec = this_machine_device(ceilings) or measured_device(ceilings.peak, UNKNOWN_MEMORY_BYTES, ceilings.dtype)
    return napkin_estimate(
        model_config,
        spec,
        TORCH_DTYPE_NAMES.get(name, name),
        batch_size,
        prompt_tokens,
        context_tokens,
        price_per_device_hour,
        model_config.model_type,
    )
