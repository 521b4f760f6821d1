"""Notebooks are source: no outputs, no widget state, a tagged parameters cell, no engine code.

CI executes them top to bottom in smoke mode (``python -m minieng course --smoke``, the Makefile's
``test-notebooks``); this file checks what a reviewer would check in the JSON, and that every notebook
opens with the Colab setup cell (``colab.SETUP_CELL``; tests/course/test_colab.py runs it under a
simulated Colab).
"""

import json
import re
from pathlib import Path

import pytest

from minieng.course.colab import SETUP_CELL, setup_cell_of

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stripped_and_follows_the_machinery(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for cell in code:
        assert cell.get("outputs", []) == [], f"{path.name}: outputs committed; strip them"
        assert cell.get("execution_count") is None, f"{path.name}: execution counts committed"
    assert "widgets" not in nb.get("metadata", {}), f"{path.name}: widget state committed"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
    assert "smoke_mode()" in "".join(tagged[0]["source"]), (
        f"{path.name}: the parameters cell must read the smoke switch"
    )
    source = "\n".join("".join(c["source"]) for c in code)
    assert "sys.path" not in source, f"{path.name}: no sys.path edits; import the installed package"
    assert not re.search(r"^\s*class \w+", source, re.M), f"{path.name}: classes belong in the package"
    markdown = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    # The course's repository is the workshop host's to give: the Colab cell reads it, never
    # hard-codes one (an address this project never published would install someone else's code).
    assert "github.com/minieng" not in json.dumps(nb), f"{path.name}: points at a repository never published"
    assert "Predict" in markdown, f"{path.name}: the reader predicts before measuring"
    closing = ("claims_table(", "from minieng.course.closing import", "claims_index(")  # a lesson's, or 00's index
    assert any(call in source for call in closing), f"{path.name}: ends with the articles' claims table"
    assert "README.md#why-your-numbers-differ-from-mine" in markdown, (
        f"{path.name}: link the README's 'Why your numbers differ from mine' from the first cell"
    )


def test_every_notebook_opens_with_the_setup_cell():
    """One cell, in every notebook: it runs before minieng can be imported, so the notebooks carry copies of
    ``colab.SETUP_CELL``, written by ``colab.set_setup_cell`` (a host's URL and branch aside). Its behaviour
    under a simulated Colab is tests/course/test_colab.py's."""
    stale = [path.name for path in NOTEBOOKS if setup_cell_of(path) != SETUP_CELL]
    assert stale == [], (
        f"{stale}: their first code cell is not colab.SETUP_CELL; write it with "
        "minieng.course.colab.set_setup_cell(path) for each notebook"
    )
