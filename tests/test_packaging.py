"""The course as a wheel and an sdist, and the notebooks copied out of an install.

The wheel test builds from a copy of the source (a build writes into the tree it builds), installs
the wheel into a fresh venv, and runs Python there from a folder outside the repository: minieng
comes only from the wheel. torch, transformers and the rest come from the running environment,
which the venv sees through a ``.pth`` file (a venv made from inside another venv would see only
the base interpreter's packages). It is skipped when ``build`` or setuptools is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from minieng.measure.workloads import DEFAULT_TEXT, TRACE_QUANTILES
from minieng.package_data import copy_notebooks, data_path, notebooks_path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))

# Run inside the fresh venv: where minieng and its files were found, and that they work.
CHECK = r"""
import json, sys, sysconfig
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement
import minieng
from minieng.package_data import data_path, notebooks_path
from minieng.measure.workloads import DEFAULT_TEXT, sampled_trace_workload, text_prompts

class CharTokenizer:
    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

def unmet(req):
    try:
        return not req.specifier.contains(version(req.name), prereleases=True)
    except PackageNotFoundError:
        return True

print(json.dumps({
    "unmet_requirements": [str(r) for r in map(Requirement, requires("minieng")) if not r.marker and unmet(r)],
    "minieng": minieng.__file__, "purelib": sysconfig.get_path("purelib"), "data": str(data_path()),
    "text": str(DEFAULT_TEXT), "prompt_lens": [len(p) for p in text_prompts(CharTokenizer(), 50, count=3)],
    "trace_requests": len(sampled_trace_workload(5, "conv", seed=0)),
    "notebooks": sorted(p.name for p in notebooks_path().glob("*.ipynb"))}))
"""


def test_paths_in_the_checkout():
    assert data_path() == REPO / "data"
    assert DEFAULT_TEXT == REPO / "data" / "text" / "pride_and_prejudice.txt" and DEFAULT_TEXT.is_file()
    assert TRACE_QUANTILES.is_file() and TRACE_QUANTILES.parent.parent == data_path()
    assert notebooks_path() == REPO / "notebooks"


def test_copy_notebooks_keeps_a_learners_edits(tmp_path):
    dest = tmp_path / "course"
    copied, kept = copy_notebooks(dest)
    assert sorted(p.name for p in copied) == NOTEBOOKS and kept == []
    assert all((dest / n).read_bytes() == (REPO / "notebooks" / n).read_bytes() for n in NOTEBOOKS)
    edited = dest / NOTEBOOKS[0]
    edited.write_text("my notes")
    (dest / NOTEBOOKS[1]).unlink()
    copied, kept = copy_notebooks(dest)
    assert [p.name for p in copied] == [NOTEBOOKS[1]] and len(kept) == len(NOTEBOOKS) - 1
    assert edited.read_text() == "my notes"
    with pytest.raises(ValueError, match="is a file"):
        copy_notebooks(edited)


def _why_no_build() -> str | None:
    try:
        import build  # noqa: F401
        import setuptools
        from packaging.version import Version
    except ImportError as e:
        return f"{e.name} is not installed (pip install build 'setuptools>=77', or the dev extra)"
    if Version(setuptools.__version__) < Version("77"):
        return f"setuptools {setuptools.__version__} is older than the 77 pyproject.toml needs"
    return None


def _copy_source(dest: Path) -> None:
    """The files a clone has (git's tracked and unignored ones), or the tree without build output."""
    try:
        names = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):  # no git, or not a clone (an unpacked sdist)
        shutil.copytree(
            REPO,
            dest,
            ignore=shutil.ignore_patterns(
                ".git",
                ".venv",
                "build",
                "dist",
                "*.egg-info",
                "__pycache__",
                ".pytest_cache",
                ".hypothesis",
                "results",
                ".ipynb_checkpoints",
            ),
        )
        return
    for name in filter(None, names):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)


def _run(argv, **kw) -> str:
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert run.returncode == 0, f"{argv}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout


@pytest.mark.slow
@pytest.mark.skipif(_why_no_build() is not None, reason=str(_why_no_build()))
def test_wheel_installs_in_a_fresh_venv_and_finds_its_data(tmp_path):
    src, dist, venv, elsewhere = (tmp_path / d for d in ("src", "dist", "venv", "elsewhere"))
    _copy_source(src)
    # A file someone drops into data/ (a copy of the trace's CSV) is never published.
    (src / "data" / "azure-llm-trace-2023" / "conv.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    # sdist first, then the wheel built from the sdist: the sdist must hold what a rebuild needs.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)])
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")

    with tarfile.open(sdist) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {
        "README.md",
        "pyproject.toml",
        "MANIFEST.in",
        "data/text/pride_and_prejudice.txt",
        "data/azure-llm-trace-2023/quantiles.json",
        "tests/measure/test_workloads.py",
        "benchmarks/trace_quantiles.py",
    } <= in_sdist
    assert {f"notebooks/{n}" for n in NOTEBOOKS} <= in_sdist
    assert not any(n.startswith("notebooks/results") for n in in_sdist)
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "minieng/data/text/pride_and_prejudice.txt",
        "minieng/data/text/README.md",
        "minieng/data/azure-llm-trace-2023/quantiles.json",
        "minieng/data/azure-llm-trace-2023/README.md",
        *(f"minieng/notebooks/{n}" for n in NOTEBOOKS),
    } <= in_wheel
    assert not any(n.startswith(("tests/", "data/", "notebooks/")) for n in in_wheel)
    # every package of the source tree (pyproject lists them one by one: a new subpackage must be added)
    packages = {p.relative_to(REPO).as_posix() for p in (REPO / "minieng").rglob("__init__.py")}
    assert packages <= in_wheel, f"packages missing from the wheel: {sorted(packages - in_wheel)}"
    assert not any(n.endswith(".csv") for n in in_sdist | in_wheel)

    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip())
    import site

    (purelib / "_running_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # The wheel alone, into the venv: pip neither resolves nor touches what the running environment
    # holds (its own minieng included); the check below asks that environment for the dependencies.
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--ignore-installed",
            str(wheel),
        ]
    )

    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    found = json.loads(_run([str(python), "-c", CHECK], cwd=elsewhere, env=env).strip().splitlines()[-1])
    installed = purelib.resolve() / "minieng"
    assert Path(found["minieng"]).resolve().parent == installed, found["minieng"]
    assert Path(found["data"]).resolve() == installed / "data"
    assert Path(found["text"]).resolve() == installed / "data" / "text" / "pride_and_prejudice.txt"
    assert found["unmet_requirements"] == []
    assert found["prompt_lens"] == [50, 50, 50] and found["trace_requests"] == 5
    assert found["notebooks"] == NOTEBOOKS

    out = _run([str(python), "-m", "minieng", "notebooks", "course"], cwd=elsewhere, env=env)
    assert f"copied {len(NOTEBOOKS)} notebooks" in out
    assert all((elsewhere / "course" / n).read_bytes() == (REPO / "notebooks" / n).read_bytes() for n in NOTEBOOKS)
