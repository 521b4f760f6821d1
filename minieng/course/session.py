"""Where a notebook's kernel stands: the notebook it runs, its results folder, and whether a reader's
kernel (with widgets) is there. The course's other modules (``kit``, ``predictions``, ``scores``,
``course_path``) read these; it imports none of them, so none imports another in a circle.
"""

from __future__ import annotations

import os
from pathlib import Path

NOTEBOOK_ENV = "MINIENG_NOTEBOOK"  # the running notebook's name, set by the course runner


def results_dir(directory: Path | None = None) -> Path:
    """The results folder: ``directory``, else ``MINIENG_RESULTS_DIR``, else ``results/`` in the
    working directory (the notebook's folder)."""
    return Path(directory or os.environ.get("MINIENG_RESULTS_DIR", "results"))


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel with ipywidgets: where a panel or an input can show."""
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def running_notebook() -> str:
    """The notebook this kernel runs: the course runner's ``MINIENG_NOTEBOOK``, else JupyterLab's
    ``JPY_SESSION_NAME`` (its path), else "" (a plain Python)."""
    return os.environ.get(NOTEBOOK_ENV) or Path(os.environ.get("JPY_SESSION_NAME", "")).stem
