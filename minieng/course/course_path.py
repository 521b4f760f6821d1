"""The workshop's core path, and each notebook's time: reading (estimated) and running (measured).

``CORE_PATH`` is the lessons a learner finishes in a three-hour workshop; every other notebook is an
elective. ``lesson_header()`` (each notebook's parameters cell calls it) prints which the running
notebook is, its reading time, estimated from its own text by a stated rule (``READING_RULE``), and
its running time in full mode on this machine, as the course runner (``python -m minieng course``,
``make course``) measured it and recorded it in ``RUN_TIMES_FILE`` in its results folder
(``record_run_times``). A notebook never measured here says so: no figure is printed that was not
measured or computed.
"""

from __future__ import annotations

import datetime
import json
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from minieng.course.predictions import read_entries, write_entries
from minieng.course.session import results_dir, running_notebook
from minieng.package_data import notebooks_path

CORE_PATH = ("00", "01", "03", "05", "07", "10")  # the notebooks' numbers, in the order a workshop takes them
WORKSHOP_S = 3 * 3600  # the workshop the core path must fit: three hours, reading and running
WORDS_PER_MINUTE = 200  # prose read with care: a technical text's reading speed
SECONDS_PER_CODE_LINE = 10  # a code line read (not typed) and understood
READING_RULE = (
    f"{WORDS_PER_MINUTE} words/min of markdown and {SECONDS_PER_CODE_LINE} s per code line "
    "(comments, blank lines and the first, Colab setup, cell not counted)"
)
RUN_TIMES_FILE = "run-times.json"  # in the course runner's results folder: {notebook: its last run}
COURSE_OUTPUT = "course-output"  # the course runner's default output folder (``make course``)


def lesson_number(notebook: str) -> str:
    """A notebook's number as the course writes it ("01" for "01_two_phases" or "1"); "" for none."""
    match = re.match(r"\d+", Path(str(notebook)).name)
    return f"{int(match.group()):02d}" if match else ""


def lesson_place(notebook: str) -> str:
    """ "core path, lesson N of 6" or "elective"."""
    number = lesson_number(notebook)
    if number in CORE_PATH:
        return f"core path, lesson {CORE_PATH.index(number) + 1} of {len(CORE_PATH)}"
    return "elective"


@dataclass(frozen=True)
class ReadingTime:
    """A notebook's reading time by ``READING_RULE``: its markdown words and its code lines."""

    words: int
    code_lines: int

    @property
    def seconds(self) -> float:
        return 60 * self.words / WORDS_PER_MINUTE + SECONDS_PER_CODE_LINE * self.code_lines


def _source(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def reading_time(path: Path) -> ReadingTime:
    """``READING_RULE`` applied to the notebook at ``path``: its markdown cells' words, and its code
    cells' lines that are neither blank nor only a comment, the first code cell (Colab setup) left out."""
    cells = json.loads(Path(path).read_text(encoding="utf-8")).get("cells", [])
    words = sum(len(_source(c).split()) for c in cells if c.get("cell_type") == "markdown")
    code = [_source(c) for c in cells if c.get("cell_type") == "code"][1:]
    lines = sum(1 for text in code for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))
    return ReadingTime(words, lines)


def notebook_file(notebook: str) -> Path | None:
    """The ``.ipynb`` of ``notebook`` (a path, a name such as "01_two_phases", or a number): the path
    itself, else in the working directory (a kernel's: the notebook's folder), else in the course's
    notebooks folder; None when none exists."""
    given = Path(notebook)
    if given.suffix == ".ipynb" and given.is_file():
        return given
    folders = [Path.cwd()]
    try:
        folders.append(notebooks_path())
    except ValueError:
        pass
    stem, number = given.stem, lesson_number(notebook)
    for folder in folders:
        if (folder / f"{stem}.ipynb").is_file():
            return folder / f"{stem}.ipynb"
        found = sorted(p for p in folder.glob("*.ipynb") if number and lesson_number(p.stem) == number)
        if found and stem.isdigit():
            return found[0]
    return None


def this_host() -> str:
    """This machine's name, as the course runner records it beside a run time."""
    return platform.node()


def record_run_times(runs: list[dict], mode: str, machine: str, directory: Path) -> Path:
    """Merge the course runner's notebook runs ({name, status, wall_s}) into ``RUN_TIMES_FILE`` in
    ``directory`` (the runner's results folder), each with the mode, this host, the machine in words
    and the time: what ``lesson_header`` reads back. Returns the file."""
    path = Path(directory) / RUN_TIMES_FILE
    kept = read_entries(path)
    at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    for r in runs:
        kept[r["name"]] = {
            "wall_s": r["wall_s"],
            "status": r["status"],
            "mode": mode,
            "host": this_host(),
            "machine": machine,
            "measured_at": at,
        }
    write_entries(path, kept)
    return path


def run_time_folders(directory: Path | None = None) -> list[Path]:
    """Where ``lesson_header`` looks for ``RUN_TIMES_FILE``: the results folder (``directory``, else
    ``kit.cached``'s: under the course runner, its own), then ``make course``'s output as seen from
    the working directory or its parent (a kernel opened in notebooks/)."""
    return [results_dir(directory), *(base / COURSE_OUTPUT / "results" for base in (Path.cwd(), Path.cwd().parent))]


def measured_run(notebook: str, directory: Path | None = None) -> dict | None:
    """The last full-mode run of ``notebook`` that finished ok on this host, as ``record_run_times``
    stored it ({wall_s, mode, host, machine, measured_at}); None when no run was recorded."""
    name = Path(notebook).stem
    for folder in run_time_folders(directory):
        run = read_entries(folder / RUN_TIMES_FILE).get(name)
        if isinstance(run, dict) and run.get("mode") == "full" and run.get("status") == "ok":
            if run.get("host") == this_host() and isinstance(run.get("wall_s"), (int, float)):
                return run
    return None


def minutes(seconds: float) -> str:
    """A duration as the header writes it: "45 s" below two minutes, else "12 min" or "1 h 05 min"."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    whole = round(seconds / 60)
    return f"{whole} min" if whole < 60 else f"{whole // 60} h {whole % 60:02d} min"


def header_lines(notebook: str, directory: Path | None = None) -> list[str]:
    """``lesson_header``'s lines for ``notebook``: its place, reading time, running time."""
    path = notebook_file(notebook)
    name = path.stem if path is not None else Path(notebook).stem
    lines = [f"{name}: {lesson_place(name)}."]
    if path is None:
        lines.append(f"Reading time: not computed ({name}.ipynb not found here nor in the course's notebooks).")
    else:
        r = reading_time(path)
        lines.append(
            f"Reading time: about {minutes(r.seconds)} ({r.words:,} markdown words at {WORDS_PER_MINUTE} words/min "
            f"+ {r.code_lines} code lines at {SECONDS_PER_CODE_LINE} s each)."
        )
    run = measured_run(name, directory)
    if run is None:
        lines.append("Running time: not yet measured on this machine (run `make course`).")
    else:
        lines.append(
            f"Running time: {minutes(run['wall_s'])} in full mode on this machine, measured by the course runner "
            f"on {run.get('measured_at', 'an unrecorded date')}."
        )
    return lines


def lesson_header(notebook: str | None = None, directory: Path | None = None) -> None:
    """Print the running notebook's header: whether it is on the core path ("core path,
    lesson N of 6") or an elective, its reading time estimated by ``READING_RULE`` from its own
    markdown words and code lines, and its running time in full mode on this machine when the course
    runner recorded one (``RUN_TIMES_FILE``), else that it is not yet measured.

    Args:
        notebook: a notebook's name, number or path (default: the running one, ``kit.running_notebook``).
        directory: the results folder to look in first (default ``kit.cached``'s).
    """
    name = notebook or running_notebook()
    if not name:
        text = "Lesson header: no notebook named here (run it in Jupyter, or pass lesson_header('01'))."
    else:
        text = "\n".join(header_lines(str(name), directory))
    print(text)


def core_path_times(notebooks_dir: Path, directory: Path | None = None) -> dict:
    """The core path's time, for the course runner's report: per core notebook in ``notebooks_dir``,
    its reading time (``READING_RULE``) and its running time in full mode on this machine as recorded
    (``measured_run``, looking in ``directory`` first), and their sums. ``fits``: whether reading and
    running together fit ``WORKSHOP_S``; None while a core notebook has no full-mode run time (its
    ``run_s`` None), since no figure is made up for it.

    Returns:
        {rule, budget_s, notebooks: [{name, words, code_lines, reading_s, run_s, measured_at}],
        reading_s, run_s (None while one is missing), total_s (likewise), fits, missing: [names]}.
    """
    rows = []
    for number in CORE_PATH:
        path = next((p for p in sorted(Path(notebooks_dir).glob("*.ipynb")) if lesson_number(p.stem) == number), None)
        if path is None:
            rows.append({"name": number, "words": None, "code_lines": None, "reading_s": None, "run_s": None})
            continue
        r, run = reading_time(path), measured_run(path.stem, directory)
        rows.append(
            {
                "name": path.stem,
                "words": r.words,
                "code_lines": r.code_lines,
                "reading_s": round(r.seconds, 1),
                "run_s": None if run is None else run["wall_s"],
                "measured_at": None if run is None else run.get("measured_at"),
            }
        )
    missing = [row["name"] for row in rows if row["run_s"] is None or row["reading_s"] is None]
    reading = None if any(row["reading_s"] is None for row in rows) else sum(row["reading_s"] for row in rows)
    run = None if missing else sum(row["run_s"] for row in rows)
    total = None if reading is None or run is None else reading + run
    return {
        "rule": READING_RULE,
        "budget_s": WORKSHOP_S,
        "notebooks": rows,
        "reading_s": reading,
        "run_s": run,
        "total_s": total,
        "fits": None if total is None else total <= WORKSHOP_S,
        "missing": missing,
    }


def core_path_lines(times: dict) -> list[str]:
    """``core_path_times`` as text lines: one per core notebook, then the sums and the verdict."""
    lines = [f"Core path (reading estimated at {times['rule']}; running time measured in full mode on this machine):"]
    for row in times["notebooks"]:
        reading = "not found" if row["reading_s"] is None else minutes(row["reading_s"])
        run = "not yet measured" if row["run_s"] is None else minutes(row["run_s"])
        lines.append(f"  {row['name']:<28} reading {reading:>10}   running {run}")
    reading = "?" if times["reading_s"] is None else minutes(times["reading_s"])
    run = "not yet measured for " + ", ".join(times["missing"]) if times["run_s"] is None else minutes(times["run_s"])
    lines.append(f"  {'total':<28} reading {reading:>10}   running {run}")
    budget = minutes(times["budget_s"])
    if times["fits"] is None:
        lines.append(
            f"Whether it fits {budget}: not judged until every core notebook has a full-mode run (`make course`)."
        )
    else:
        verdict = "fits within" if times["fits"] else "does NOT fit within"
        lines.append(f"Reading and running together: {minutes(times['total_s'])}, which {verdict} {budget}.")
    return lines
