"""Notebook machinery: smoke mode, a disk cache of results, runtime estimates, and widget panels.

Thin wrappers only: every number a panel shows is computed by the package's pure functions.
Panels use the ipywidgets API common to versions 7 (Colab) and 8, keep sliders from firing while
dragged (``continuous_update=False``), put slow work behind a Run button, render into an
``Output``, and run their callback once with the default values when built, so a headless run
(CI, or a viewer where widgets do not render) still executes and shows the default result.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

SMOKE_ENV = "MINIENG_SMOKE"


def smoke_mode() -> bool:
    """True when ``MINIENG_SMOKE`` is set (CI): every experiment shrinks to seconds."""
    return os.environ.get(SMOKE_ENV, "").lower() not in ("", "0", "false", "no")


def in_colab() -> bool:
    return "google.colab" in sys.modules


def cached(name: str, params: dict, compute: Callable[[], dict], directory: Path | None = None) -> dict:
    """Return ``compute()``'s JSON result, stored on disk under ``name`` and a hash of ``params``.

    A re-run (or a reconnected Colab session) with the same parameters reads the file instead of
    measuring again. Delete the ``results/`` folder to measure afresh.
    """
    directory = Path(directory or os.environ.get("MINIENG_RESULTS_DIR", "results"))
    key = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = directory / f"{name}-{key}.json"
    if path.is_file():
        print(f"(cached result from {path}; delete it to measure again)")
        return json.loads(path.read_text())["result"]
    result = compute()
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"params": params, "result": result}, default=str))
    tmp.replace(path)
    return result


def announce(what: str, estimate_s: float) -> None:
    """Print what a heavy cell is about to do and how long it should take on this device."""
    when = f"{estimate_s:.0f} s" if estimate_s < 120 else f"{estimate_s / 60:.1f} min"
    print(f"{what}: about {when} on this device")


def int_slider(description: str, value: int, min: int, max: int, step: int = 1):
    import ipywidgets as w

    return w.IntSlider(value=value, min=min, max=max, step=step, description=description,
                       continuous_update=False, style={"description_width": "initial"})


def dropdown(description: str, options, value):
    import ipywidgets as w

    return w.Dropdown(options=options, value=value, description=description, style={"description_width": "initial"})


def run_panel(controls: dict, callback: Callable[..., None], button: str = "Run", run_now: bool = True):
    """A panel: the controls, a Run button, and an Output the callback draws into.

    ``callback(**{name: control.value})`` is called on each click, and once at build time with the
    defaults when ``run_now``. Returns the ipywidgets box (display it, or let it be a cell's value).
    """
    import ipywidgets as w
    from IPython.display import clear_output

    out = w.Output()
    run = w.Button(description=button, button_style="primary")

    def fire(_=None):
        with out:
            clear_output(wait=True)
            callback(**{name: c.value for name, c in controls.items()})

    run.on_click(fire)
    panel = w.VBox([*controls.values(), run, out])
    if run_now:
        fire()
    return panel


def show(fig, dpi: int = 100) -> None:
    """Display a matplotlib ``Figure`` as a PNG: works in JupyterLab, Colab, an ``Output`` and
    headless runs alike, with no pyplot backend involved."""
    import io

    from IPython.display import Image, display

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    display(Image(data=buf.getvalue(), format="png"))


def claims_table(rows: list[tuple[str, str, str, str]]):
    """The closing table of a notebook: (claim, seed's figure, measured here, holds?) as Markdown.

    A row about a seed claim starts with its id ("S7: ..."; see ``minieng.claims``). The returned
    object displays as Markdown and carries the rows as JSON too (mimetype
    ``claims.CLAIMS_MIMETYPE``), which ``python -m minieng course`` reads from the executed notebook.
    """
    from IPython.display import Markdown

    from .claims import CLAIMS_MIMETYPE

    rows = [[str(x) for x in row] for row in rows]
    if any(len(row) != 4 for row in rows):
        raise ValueError("claims_table: each row is (claim, seed's figure, measured here, holds?), four items")

    class ClaimsTable(Markdown):
        def _repr_mimebundle_(self, include=None, exclude=None):
            return {CLAIMS_MIMETYPE: {"rows": rows}}

    lines = ["| claim | seed | here | holds? |", "| --- | --- | --- | --- |"]
    lines += [f"| {c} | {s} | {h} | {v} |" for c, s, h, v in rows]
    return ClaimsTable("\n".join(lines))
