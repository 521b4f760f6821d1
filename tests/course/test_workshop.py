"""The course as a workshop learner meets it: short cells that show the physics, no branch on the
endpoint, every prediction answered, and each notebook saying whether it is on the core path.

These read the notebooks' JSON only; CI executes them in ``test-notebooks``.
"""

import json
import re
from pathlib import Path

import pytest

from minieng.course.course_path import CORE_PATH

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
MAX_CELL_LINES = 15  # code lines a cell may hold, comments and blank lines not counted


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def code_lines(text: str) -> int:
    """Lines that are neither blank nor only a comment."""
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def number(path: Path) -> str:
    return re.match(r"\d+", path.name).group()


def test_code_lines_counts_code_only():
    assert code_lines("# a comment\n\nx = 1\n    # indented comment\ny = f(x)  # trailing\n") == 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_code_cell_over_15_lines_outside_setup_and_parameters(path):
    code = [c for c in cells(path) if c["cell_type"] == "code"]
    long = [
        (i, code_lines(source(c)))
        for i, c in enumerate(code)
        if i > 0  # the first code cell is the Colab setup cell
        and "parameters" not in c.get("metadata", {}).get("tags", [])
        and code_lines(source(c)) > MAX_CELL_LINES
    ]
    assert long == [], f"{path.name}: code cells (index among code cells, lines) over {MAX_CELL_LINES}: {long}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_branches_on_the_endpoint(path):
    branching = [i for i, c in enumerate(cells(path)) if re.search(r"\bif\s+(not\s+)?ENDPOINT\b", source(c))]
    assert branching == [], f"{path.name}: cells {branching} branch on ENDPOINT; ask the backend object instead"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_first_cell_says_core_path_or_elective(path):
    first = source(cells(path)[0])
    if number(path) in CORE_PATH:
        lesson = CORE_PATH.index(number(path)) + 1
        assert f"**Core path, lesson {lesson} of {len(CORE_PATH)}.**" in first, path.name
    else:
        assert "**Elective.**" in first and "Core path" not in first, path.name


def test_the_core_path_names_notebooks_that_exist():
    assert set(CORE_PATH) <= {number(p) for p in NOTEBOOKS}


PREDICT = re.compile(r"\*\*Predict\b")
ANSWERED = re.compile(r"\b(predict|reveal)\(")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_predict_prompt_is_scored_or_revealed(path):
    """Each markdown prompt to predict is followed, before the next prompt, by a code cell that stores the
    reader's guess (``predict``, scored later by ``score``) or shows a worked answer on demand (``reveal``)."""
    nb = cells(path)
    prompts = [i for i, c in enumerate(nb) if c["cell_type"] == "markdown" and PREDICT.search(source(c))]
    assert prompts, f"{path.name}: the reader predicts before measuring"
    unanswered = []
    for n, i in enumerate(prompts):
        end = prompts[n + 1] if n + 1 < len(prompts) else len(nb)
        window = [source(c) for c in nb[i + 1 : end] if c["cell_type"] == "code"]
        if not any(ANSWERED.search(text) for text in window):
            unanswered.append(i)
    assert unanswered == [], f"{path.name}: Predict prompts in cells {unanswered} are neither scored nor revealed"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_stored_prediction_is_scored(path):
    text = "\n".join(source(c) for c in cells(path) if c["cell_type"] == "code")
    asked = set(re.findall(r"\bpredict\(\s*\"(\w+)\"", text))
    scored = set(re.findall(r"\bscore\(\s*\"(\w+)\"", text))
    assert asked <= scored, f"{path.name}: predictions never scored: {sorted(asked - scored)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_closing_claims_table_is_one_call(path):
    code = [source(c) for c in cells(path) if c["cell_type"] == "code"]
    closing = [text for text in code if "minieng.course.closing" in text or "closing." in text]
    assert closing, f"{path.name}: the closing claims table comes from minieng.course.closing"
    assert code_lines(closing[-1]) <= 6, f"{path.name}: the closing cell is one call, not a table built in the cell"
