"""Where the course's files are: its data (the text corpus, the trace's quantiles) and its notebooks.

The repository's top-level ``data/`` and ``notebooks/`` folders are the source of truth. The wheel
carries them inside the package, as ``minieng/data/`` and ``minieng/notebooks/`` (setuptools'
``package-dir`` in pyproject.toml maps the two folders there). So a file is looked up inside the
package first (an installed wheel), then beside it (a source checkout or an editable install).
"""

from __future__ import annotations

import shutil
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _folder(name: str) -> Path:
    """The installed ``minieng/<name>/`` when there is one, else the checkout's ``<name>/``."""
    inside = _PACKAGE / name
    return inside if inside.is_dir() else _PACKAGE.parent / name


def data_path(*parts: str) -> Path:
    """The path of a file or folder of the course's data, e.g.
    ``data_path("text", "pride_and_prejudice.txt")``; ``data_path()`` is the data folder itself.

    Nothing is checked here: the caller that opens the file says what is missing.
    """
    return _folder("data").joinpath(*parts)


def notebooks_path() -> Path:
    """The folder of the course's notebooks (``*.ipynb``), installed or in the checkout.

    Raises ``ValueError`` when neither holds them (an install from something other than the
    wheel or the sdist)."""
    folder = _folder("notebooks")
    if not any(folder.glob("*.ipynb")):
        raise ValueError(
            f"no notebooks in {folder}: install minieng from its wheel or sdist, or run from a clone of the repository"
        )
    return folder


def copy_notebooks(dest: str | Path) -> tuple[list[Path], list[Path]]:
    """Copy the course's notebooks into ``dest`` (created if needed), for a learner to open.

    A notebook already in ``dest`` is left as it is: a learner's edits are never overwritten.
    Returns ``(copied, kept)``: the paths written and the paths that already existed.
    Raises ``ValueError`` as ``notebooks_path`` does, and if ``dest`` is a file."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest} is a file: give a folder to copy the notebooks into")
    dest.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for source in sorted(notebooks_path().glob("*.ipynb")):
        target = dest / source.name
        if target.exists():
            kept.append(target)
        else:
            shutil.copyfile(source, target)
            copied.append(target)
    return copied, kept
