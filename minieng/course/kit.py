"""Notebook machinery: smoke mode, a disk cache of results, runtime estimates, and widget panels.

Thin wrappers only: every number a panel shows is computed by the package's pure functions.
Panels use the ipywidgets API common to versions 7 (Colab) and 8, keep sliders from firing while
dragged (``continuous_update=False``), put slow work behind a Run button, render into an
``Output``, and run their callback once with the default values when built, so a headless run
(CI, or a viewer where widgets do not render) still executes and shows the default result.
"""

from __future__ import annotations

import datetime
import hashlib
import inspect
import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from minieng.course.claims import CLAIMS_MIMETYPE, claim_ids, format_index, index_entries, noise_note
from minieng.course.scores import notebook_score
from minieng.course.session import NOTEBOOK_ENV, in_kernel, results_dir, running_notebook  # noqa: F401 (kit's names too)
from minieng.measure import harness  # harness.environment, read at call time (tests patch it)
from minieng.measure.harness import smoke_mode


class CachedResult(dict):
    """A measured result (the JSON dict ``compute`` returned) that remembers how it was measured.

    ``noise``: the machine's timing noise when it was measured (a ``ceilings.Noise``, or None when
    none was given), which the verdicts on it must use: a result read from the cache was measured
    then, not under the noise of today's run. ``measured_at``: UTC time. ``from_cache``: read from
    disk rather than measured by this call.
    """

    def __init__(self, result: dict, noise=None, measured_at: str | None = None, from_cache: bool = False):
        super().__init__(result)
        self.noise, self.measured_at, self.from_cache = noise, measured_at, from_cache


def _stored_noise(stored: dict | None):
    """The ``ceilings.Noise`` a cache file kept (its constructor's fields), or None."""
    from minieng.measure.ceilings import Noise

    if not stored:
        return None
    names = set(Noise.__dataclass_fields__)
    return Noise(**{k: v for k, v in stored.items() if k in names})


def cached(
    name: str,
    params: dict,
    compute: Callable[[], dict],
    directory: Path | None = None,
    device: str | None = None,
    noise=None,
) -> CachedResult:
    """Return ``compute()``'s JSON result, stored on disk under ``name`` and a hash of ``params``
    and of the environment it is measured in, with the timing noise of the run that measured it.

    ``noise``: the machine's noise now (``machine_ceilings().noise``), stored beside a result this
    call measures, load average included. The returned ``CachedResult`` carries the noise of the
    run that made it (``.noise``): this call's for a fresh result, the stored one for a result read
    back (None for a file written without one). Judge verdicts on a result with its ``.noise``.

    The environment is ``harness.environment`` for ``device`` (default: CUDA when available, else
    CPU): device name, host, torch and minieng versions, threads, driver; plus the smoke switch.
    A re-run (or a reconnected Colab session) with the same parameters on the same machine reads
    the file instead of measuring again and says when and where it was measured; a result from
    another machine, another torch or a smoke run is never shown as this run's. The folder is
    ``directory``, else ``MINIENG_RESULTS_DIR``, else ``results/`` in the working directory (the
    notebook's folder); delete a file to measure again.
    """
    directory = results_dir(directory)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    where = harness.environment(device) | {"smoke": smoke_mode()}
    key = hashlib.sha256(
        json.dumps({"params": params, "environment": where}, sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    path = directory / f"{name}-{key}.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        kept = _stored_noise(stored.get("noise"))
        print(
            f"(cached result, measured {stored.get('measured_at', 'at an unrecorded time')} on "
            f"{where['device_name']} ({where['host']})"
            + ("" if kept is None or kept.relative is None else f" under {100 * kept.relative:.0f}% timing noise")
            + f", read from {path}; delete it to measure again)"
        )
        return CachedResult(stored["result"], _stored_noise(stored.get("noise")), stored.get("measured_at"), True)
    result = compute()
    if not isinstance(result, dict):  # checked before writing: a stored list would fail every later read
        raise TypeError(f"cached({name!r}): compute() must return a JSON object (a dict), got {type(result).__name__}")
    directory.mkdir(parents=True, exist_ok=True)
    measured_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "params": params,
                "environment": where,
                "measured_at": measured_at,
                "noise": noise.to_dict() if noise is not None else None,
                "result": result,
            },
            default=str,
        )
    )
    tmp.replace(path)
    return CachedResult(result, noise, measured_at)


def on_colab() -> bool:
    """Whether this kernel is a Colab one: Colab's runtime has imported ``google.colab`` before any cell runs
    (the test the notebooks' first cell makes)."""
    return "google.colab" in sys.modules


def allow_hub_downloads() -> bool:
    """On Colab only, allow downloads from the Hugging Face Hub for this kernel; elsewhere change nothing.

    Colab has the network (the workshop machines do not), so there a lesson measures the real checkpoint
    ``lab.course_model`` chose, and notebook 09 its real target/draft pair. It sets ``HF_HUB_OFFLINE=0``
    (what ``lab.downloads_allowed`` reads, and what the kernel's later imports of huggingface_hub read),
    and turns offline mode off in the modules already imported, which read the flag once at import:
    ``huggingface_hub.constants.HF_HUB_OFFLINE`` (read by every Hub call) and, in transformers 4,
    ``transformers.utils.hub._is_offline_mode``. Returns whether it allowed them (False off Colab, where
    ``HF_HUB_OFFLINE`` keeps whatever the reader set: ``make lab HF_HUB_OFFLINE=0`` allows them there).
    """
    if not on_colab():
        return False
    os.environ["HF_HUB_OFFLINE"] = "0"  # "0" outranks a TRANSFORMERS_OFFLINE=1 in huggingface_hub's reading
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = False
    transformers_hub = sys.modules.get("transformers.utils.hub")
    if transformers_hub is not None and hasattr(transformers_hub, "_is_offline_mode"):
        transformers_hub._is_offline_mode = False
    print(
        "Colab: downloads from the Hugging Face Hub allowed for this session (HF_HUB_OFFLINE=0): the lessons "
        "measure real checkpoints, downloaded once each (their size and time are printed)"
    )
    return True


def announce(what: str, estimate_s: float) -> None:
    """Print what a heavy cell is about to do and how long it should take on this device."""
    when = f"{estimate_s:.0f} s" if estimate_s < 120 else f"{estimate_s / 60:.1f} min"
    print(f"{what}: about {when} on this device")


# ipywidgets gives every control 300 px in all, description included: a long description
# ("description_width": "initial") leaves the slider beside it a track of a few pixels. So each
# control is as wide as its description plus a body of fixed width, and a panel gives all its
# controls the longest description's width, so their tracks line up. Widths are CSS (``ch``: the
# width of a digit, a little more than an average letter), which ipywidgets 7 and 8 both pass on.
SLIDER_BODY_PX = 320  # track and readout
DROPDOWN_BODY_PX = 220  # the option box


def _fit(control, description_ch: int, body_px: int) -> None:
    """Give ``control`` a description column ``description_ch`` characters wide and ``body_px``
    beside it (narrower only when its container is)."""
    control.style.description_width = f"{description_ch}ch"
    control.layout.width = f"calc({description_ch}ch + {body_px}px)"
    control.layout.max_width = "100%"


def int_slider(description: str, value: int, min: int, max: int, step: int = 1):
    """An ``IntSlider`` that fires on release, sized so its track stays usable beside any description."""
    import ipywidgets as w  # lazy: the notebooks extra's; the kit's other helpers run without it

    slider = w.IntSlider(value=value, min=min, max=max, step=step, description=description, continuous_update=False)
    _fit(slider, len(description), SLIDER_BODY_PX)
    return slider


def dropdown(description: str, options, value):
    """A ``Dropdown`` sized like ``int_slider``: its option box keeps its width beside any description."""
    import ipywidgets as w  # lazy: the notebooks extra's; the kit's other helpers run without it

    menu = w.Dropdown(options=options, value=value, description=description)
    _fit(menu, len(description), DROPDOWN_BODY_PX)
    return menu


def _body_px(control) -> int | None:
    """The body width ``int_slider``/``dropdown`` give ``control``; None for other widgets."""
    import ipywidgets as w  # lazy: the notebooks extra's; the kit's other helpers run without it

    if isinstance(control, w.Dropdown):
        return DROPDOWN_BODY_PX
    if isinstance(control, (w.IntSlider, w.FloatSlider)):
        return SLIDER_BODY_PX
    return None


def run_panel(controls: dict, callback: Callable[..., None], button: str = "Run", run_now: bool = True):
    """A panel: the controls, a Run button, and an Output the callback draws into.

    ``callback(**{name: control.value})`` is called on each click, and once at build time with the
    defaults when ``run_now``. Returns the ipywidgets box (display it, or let it be a cell's value).
    """
    import ipywidgets as w  # lazy: the notebooks extra's; the kit's other helpers run without it
    from IPython.display import clear_output  # lazy: IPython is there only in a kernel

    out = w.Output()
    run = w.Button(description=button, button_style="primary")

    def fire(_=None):
        with out:
            clear_output(wait=True)
            callback(**{name: c.value for name, c in controls.items()})

    run.on_click(fire)
    # One description column for the panel: the sliders' tracks start and end at the same x.
    sized = [(c, _body_px(c)) for c in controls.values() if _body_px(c) is not None]
    if sized:
        description_ch = max(len(c.description) for c, _ in sized)
        for c, body_px in sized:
            _fit(c, description_ch, body_px)
    panel = w.VBox([*controls.values(), run, out])
    if run_now:
        fire()
    return panel


def quote(function: Callable, keep: tuple[str, ...] | None = None) -> None:
    """Print ``function``'s source as the installed package has it, with its file's line numbers
    (only the lines holding a word of ``keep``, when given): a lesson reads the code that runs."""
    lines, first = inspect.getsourcelines(function)
    print(f"# {Path(inspect.getsourcefile(function)).name}")
    for number, line in enumerate(lines, first):
        if keep is None or any(word in line for word in keep):
            print(f"{number:4d} {line}", end="")
    print()


def show(fig, dpi: int = 100) -> None:
    """Display a matplotlib ``Figure`` as a PNG: works in JupyterLab, Colab, an ``Output`` and
    headless runs alike, with no pyplot backend involved."""
    from IPython.display import Image, display  # lazy: IPython is there only in a kernel

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    display(Image(data=buf.getvalue(), format="png"))


VERDICTS_FILE = "claims-verdicts.json"


def record_verdicts(rows: list[list[str]], directory: Path | None = None) -> Path | None:
    """Add a claims table's rows about the articles' claims to ``claims-verdicts.json`` in the results
    folder (``cached``'s), keyed by the row's claim text, with the notebook and the time: what the
    claims index (``claims_index``) reads as the reader's last run. Returns the file, or None when
    no row names a claim. A file another writer left unreadable is replaced, not fatal."""
    rows = [r for r in rows if claim_ids(r[0])]
    if not rows:
        return None
    path = results_dir(directory) / VERDICTS_FILE
    try:
        kept = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        kept = {}
    at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    for claim, _, here, holds in rows:
        kept[claim] = {"notebook": running_notebook(), "here": here, "holds": holds, "measured_at": at}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(kept, indent=1, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return path


def claims_index(directory: Path | None = None):
    """Every claim of the two articles (S1-S21): the article, the figure it states, the notebook(s)
    whose closing table measures it, and the verdicts of this reader's last run, read from the
    results folder (``record_verdicts``). Displays as Markdown."""
    from IPython.display import Markdown  # lazy: IPython is there only in a kernel

    path = results_dir(directory) / VERDICTS_FILE
    try:
        last = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        last = {}
    note = (
        f"Verdicts read from {path}: each notebook's closing table writes its rows there."
        if last
        else "No verdict recorded yet in this results folder: run the notebooks (or `python -m minieng course`)."
    )
    return Markdown(format_index(index_entries(last)) + "\n\n" + note)


def claims_table(rows: list[tuple[str, str, str, str]], noise=None):
    """The closing table of a notebook: (claim, article's figure, measured here, holds?) as Markdown.

    A row about an article's claim starts with its id ("S7: ..."; see ``minieng.course.claims``). With
    ``noise`` (a ``ceilings.Noise``, or its relative figure) a line under the table says what noise
    the verdicts were checked against (``claims.verdict``); under it, the notebook's score so far
    (``scores.running_score``) when it asked for a prediction or showed a pencil problem. The returned object displays as
    Markdown and carries the rows as JSON too (mimetype ``claims.CLAIMS_MIMETYPE``), which
    ``python -m minieng course`` reads from the executed notebook.
    """
    from IPython.display import Markdown  # lazy: IPython is there only in a kernel

    rows = [[str(x) for x in row] for row in rows]
    if any(len(row) != 4 for row in rows):
        raise ValueError("claims_table: each row is (claim, article's figure, measured here, holds?), four items")

    class ClaimsTable(Markdown):
        def _repr_mimebundle_(self, include=None, exclude=None):
            return {CLAIMS_MIMETYPE: {"rows": rows}}

    record_verdicts(rows)
    lines = ["| claim | article | here | holds? |", "| --- | --- | --- | --- |"]
    lines += [f"| {c} | {s} | {h} | {v} |" for c, s, h, v in rows]
    if noise is not None:
        lines += ["", noise_note(noise)]
    so_far = notebook_score()
    if so_far.asked or so_far.pencil:
        lines += ["", so_far.markdown()]
    return ClaimsTable("\n".join(lines))
