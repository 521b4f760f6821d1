"""The whole course in one command: every notebook executed top to bottom, exported as HTML.

``python -m minieng course`` (``make course``) runs each notebook in a kernel of its own
(nbclient), with the notebooks folder as its working directory (where the notebooks find their
data) and its result cache under the output folder, never the source tree's ``results/``. It
writes per notebook the executed ``.ipynb`` (widgets live when opened in Jupyter) and a static HTML
page (nbconvert; each panel shown by its default result), then ``index.html`` and
``course.json``, and returns one table of the articles' claims with what each notebook measured.
Its kernels run with ``MINIENG_HEADLESS=1``: nobody types there, so each prediction a notebook asks
for (``course.predictions``) is the napkin model's value, and the index lists every prediction
beside its measurement. A notebook that fails or runs out of time is reported, with what it had
shown so far, and the rest still run. ``jobs`` > 1 runs that many notebooks side by side (the test
command's smoke run: two on two cores), with OpenMP's idle threads asleep
(``OMP_WAIT_POLICY=PASSIVE``) rather than spinning on a core another kernel needs; their timings
then share the machine, so a full run keeps the default, one.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import queue
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

import nbformat
import torch
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from nbconvert import HTMLExporter
from tqdm.auto import tqdm

from minieng.course.claims import CLAIMS_MIMETYPE, article_claims_table, claims_in_source
from minieng.course.course_path import core_path_times, record_run_times
from minieng.course.course_report import index_html, report  # noqa: F401 (the command line's report)
from minieng.course.predictions import HEADLESS_ENV, now_utc
from minieng.course.scores import CourseScore, load_predictions
from minieng.course.session import NOTEBOOK_ENV
from minieng.lab.model_for_device import MODEL_ENV
from minieng.measure.harness import SMOKE_ENV, environment
from minieng.model.loader import convert_gguf, default_gguf_path
from minieng.package_data import notebooks_path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout (minieng/course/runner.py)


def select_notebooks(notebooks_dir: Path, only: list[str] | None = None) -> list[Path]:
    """The notebooks of ``notebooks_dir`` in order, or those whose number is in ``only``
    (["01", "7"]: 01_*.ipynb and 07_*.ipynb). Raises ``ValueError`` for a folder without
    notebooks or a number that matches none."""
    paths = sorted(Path(notebooks_dir).glob("*.ipynb"))
    if not paths:
        raise ValueError(f"no notebooks in {notebooks_dir}: pass --notebooks DIR, the course's notebooks folder")
    if not only:
        return paths
    number = {p: int(m.group()) for p in paths if (m := re.match(r"\d+", p.name))}
    wanted = []
    for token in only:
        if not token.strip().isdigit():
            raise ValueError(f"--only {token!r}: give notebook numbers, e.g. --only 01,07")
        match = [p for p in paths if number.get(p) == int(token)]
        if not match:
            raise ValueError(f"--only {token}: no such notebook; there are {', '.join(p.stem for p in paths)}")
        wanted += match
    return [p for p in paths if p in wanted]


CACHED_NOTE = "(cached result, measured"  # what kit.cached prints when it reads a result back


def reused_results(nb) -> bool:
    """Whether an executed notebook read any result back from the cache (``kit.cached``'s note in its
    outputs) instead of measuring it: its wall time then is not the time a learner's first run takes."""
    return any(
        CACHED_NOTE in (out.get("text", "") if isinstance(out.get("text", ""), str) else "".join(out["text"]))
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )


def claims_rows(nb) -> list[list[str]]:
    """The claims_table rows an executed notebook displayed (empty if it never got there)."""
    return [
        row
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        for row in out.get("data", {}).get(CLAIMS_MIMETYPE, {}).get("rows", [])
    ]


CLOSING_IMPORT = re.compile(r"from\s+minieng\.course\.closing\s+import\s+([\w ,]+)|minieng\.course\.closing\.(\w+)")


def expected_claims(path: Path) -> set[str]:
    """The article claims a notebook's closing table names (``claims.claims_in_source``): read from
    its code cells that call ``claims_table`` or use ``minieng.course.closing``, and from the closing
    modules those cells import (where a one-call closing table writes its rows)."""
    cells = [
        c.source
        for c in nbformat.read(path, as_version=4).cells
        if c.cell_type == "code" and ("claims_table(" in c.source or "minieng.course.closing" in c.source)
    ]
    text = "\n".join(cells)
    names = {
        part.split()[0]
        for listed, dotted in CLOSING_IMPORT.findall(text)
        for part in (listed.split(",") if listed else [dotted])
        if part.strip()
    }
    for name in sorted(names):
        spec = importlib.util.find_spec(f"minieng.course.closing.{name}")
        if spec is not None and spec.origin:
            text += "\n" + Path(spec.origin).read_text(encoding="utf-8")
    return claims_in_source(text)


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PANEL_NOTE = (
    "<p><em>An interactive panel: its controls work when you run the notebook. Its result for the "
    "default values:</em></p>"
)


def _static(out, shown, note) -> list:
    """One output of a static page: a widget panel becomes the note and what it showed; a widget
    that showed nothing (a progress bar) keeps its text form; any other output stays."""
    if WIDGET_VIEW not in out.get("data", {}):
        return [out]
    panel = shown(out["data"][WIDGET_VIEW]["model_id"])
    if panel:
        return [note, *panel]
    text = {k: v for k, v in out["data"].items() if k == "text/plain"}
    return [nbformat.v4.new_output("display_data", data=text)] if text else []


def static_panels(nb):
    """A copy of an executed notebook for a static page: each widget panel replaced by what its
    ``Output`` widgets showed (the panel's run with the default values), so the HTML needs no widget
    JavaScript and no network. The widgets themselves are dropped."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})

    def shown(model_id: str) -> list:
        model = state.get(model_id.removeprefix("IPY_MODEL_"), {})
        if model.get("model_name") == "OutputModel":
            return [nbformat.from_dict(o) for o in model["state"].get("outputs", [])]
        children = model.get("state", {}).get("children", [])
        return [o for child in children if isinstance(child, str) for o in shown(child)]

    note = nbformat.v4.new_output("display_data", data={"text/html": PANEL_NOTE})
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for out in cell.outputs for o in _static(out, shown, note)]
    nb.metadata.pop("widgets", None)
    return nb


KERNEL_NAME = "minieng-course"


def write_kernelspec(kernels_dir: Path) -> None:
    """Write, into ``kernels_dir``, the kernelspec of a kernel of the interpreter running the
    course (``sys.executable``): a notebook's "python3" could name another Python's kernel (one
    registered with ``ipykernel install --user``, or conda's), with another torch and minieng."""
    write_kernel_spec(Path(kernels_dir) / KERNEL_NAME)  # argv: this sys.executable -m ipykernel_launcher


def _kernel_manager(kernels_dir: Path):
    """nbclient's kind of kernel manager, for ``write_kernelspec``'s kernel."""

    return AsyncKernelManager(
        kernel_name=KERNEL_NAME, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels_dir)])
    )


POLL_SLICE_S = 1.0


def sliced_get_msg(get_msg, slice_s: float = POLL_SLICE_S):
    """A channel's async ``get_msg`` that waits in slices of ``slice_s`` seconds up to its timeout
    (forever for None), raising ``queue.Empty`` as the original does when the time runs out.

    ZeroMQ signals a socket's readiness on an edge-triggered file descriptor: a wake-up that is
    missed (a message already queued when the wait began) leaves asyncio waiting for the whole
    timeout although the message is there. nbclient waits for a cell's reply that way, so after a
    cell with widgets a run could stop for up to the notebook's whole timeout (seen here once: an
    idle kernel whose reply was sent, the course waiting 15 minutes; jupyter/nbclient#312). Each
    new slice asks the socket again.
    """

    async def get(timeout: float | None = None, **kwargs):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = slice_s if deadline is None else max(0.0, min(slice_s, deadline - time.monotonic()))
            try:
                return await get_msg(timeout=left, **kwargs)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    return get


class CourseClient(NotebookClient):
    """nbclient's client whose shell and IOPub channels wait in slices (``sliced_get_msg``)."""

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        for channel in (kc.shell_channel, kc.iopub_channel):
            channel.get_msg = sliced_get_msg(channel.get_msg)
        return kc


def run_notebook(path: Path, output_dir: Path, env: dict, timeout_s: float, bar, kernels_dir: Path) -> dict:
    """Execute one notebook, write its executed copy and HTML into ``output_dir``.

    Returns {name, status ("ok" | "failed" | "timed out"), error (the error's last line or None),
    wall_s, html, rows}. ``timeout_s`` bounds the time of all its cells together. The kernel is
    ``write_kernelspec``'s, from ``kernels_dir``, whatever kernel the notebook's metadata names.
    """
    nb = nbformat.read(path, as_version=4)
    deadline = []  # set at the first cell: the kernel's start-up is not counted

    def time_left(cell) -> int:
        if not deadline:
            deadline.append(time.monotonic() + timeout_s)
        return max(1, int(deadline[0] - time.monotonic()))

    def on_cell_start(cell, cell_index):
        bar.set_postfix_str(f"{path.stem}: cell {cell_index + 1}/{len(nb.cells)}")

    client = CourseClient(
        nb,
        km=_kernel_manager(kernels_dir),
        timeout=int(timeout_s),
        timeout_func=time_left,
        on_cell_start=on_cell_start,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    status, error = "ok", None
    try:
        client.execute(env=env, cleanup_kc=True)  # shut the kernel down: nbclient keeps one it did not create
    except CellTimeoutError:
        status, error = "timed out", f"a cell was still running when the notebook's {timeout_s:.0f} s ran out"
    except CellExecutionError as e:
        line = f"{e.ename}: {e.evalue}" if e.ename else str(e).strip().splitlines()[-1]
        status, error = "failed", " ".join(line.split())[:300]
    except Exception as e:  # the kernel died or would not start: this notebook failed, the course goes on
        status, error = "failed", " ".join(f"{type(e).__name__}: {e}".split())[:300]
    wall_s = time.perf_counter() - start
    nbformat.write(nb, output_dir / path.name)
    page = output_dir / f"{path.stem}.html"
    page.write_text(HTMLExporter().from_notebook_node(static_panels(nb))[0], encoding="utf-8")
    return {
        "name": path.stem,
        "status": status,
        "error": error,
        "wall_s": round(wall_s, 1),
        "html": page.name,
        "rows": claims_rows(nb),
        "reused_results": reused_results(nb),
    }


def fill_model_cache() -> None:
    """Convert the embedded default model into its cache now, if it is installed and not yet
    converted: notebooks run side by side would otherwise each convert it into the same folder."""
    try:
        path = default_gguf_path()
    except ValueError:
        return  # not installed: the notebooks that need it say so
    convert_gguf(path)


def run_course(
    notebooks_dir: Path | None = None,
    output_dir: Path = Path("course-output"),
    only: list[str] | None = None,
    smoke: bool = False,
    timeout_s: float = 3600,
    progress: bool = True,
    jobs: int = 1,
    model: str | None = None,
    model_only: list[str] | None = None,
) -> dict:
    """Run the course's notebooks (those in ``notebooks_dir``, default the installed or checked-out
    course's, ``package_data.notebooks_path``; or ``only`` those numbers) into ``output_dir``.

    Kernels get ``MINIENG_RESULTS_DIR=output_dir/results`` and, with ``smoke``, ``MINIENG_SMOKE=1``
    (without it, full mode even if the caller's environment sets smoke). Writes one ``.ipynb`` and
    one ``.html`` per notebook, ``index.html`` and ``course.json``. Returns course.json's content:
    mode, wall_s, notebooks (see ``run_notebook``; rows included, in the notebooks' order), claims
    (``claims.article_claims_table``) and predictions ({notebook: the entries its predictions file
    holds, ``scores.load_predictions``}, those this run asked), score (the course's prediction score,
    ``scores.CourseScore``: total and per notebook) and core_path (``course_path.core_path_times``: each
    core notebook's reading and full-mode running time, their sums, whether they fit three hours). Each
    notebook's run time is recorded for its ``lesson_header`` (``course_path.record_run_times``). ``jobs`` notebooks run at once,
    each in a thread of this process driving its own kernel (with one, in this thread). ``model`` names the model the
    notebooks measure (``MINIENG_MODEL``, read by ``lab.course_model`` where a notebook's ``MODEL`` is
    None): for every notebook, or only those numbered in ``model_only``.
    """
    if jobs < 1:
        raise ValueError(f"--jobs={jobs}: how many notebooks run at once, >= 1")
    notebooks_dir = Path(notebooks_dir or notebooks_path()).resolve()
    output_dir = Path(output_dir).resolve()
    if output_dir == notebooks_dir:
        raise ValueError(
            f"--output {output_dir} is the notebooks' own folder: the executed copies would replace "
            "them; give another folder (default: course-output)"
        )
    every, chosen = select_notebooks(notebooks_dir), select_notebooks(notebooks_dir, only)
    output_dir.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        MINIENG_RESULTS_DIR=str(output_dir / "results"),
        # the kernels import the minieng that runs them
        PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])),
        **{HEADLESS_ENV: "1"},  # no reader types in these kernels: predictions take the napkin value
    )
    env.pop(SMOKE_ENV, None)
    if smoke:
        env[SMOKE_ENV] = "1"
    if jobs > 1:  # kernels side by side: OpenMP's idle threads sleep rather than spin on a core another
        # kernel needs (two kernels of 2 threads on 2 cores ran 3.7x slower spinning; docs/measurements.md)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with_model = set(select_notebooks(notebooks_dir, model_only)) if model else set()
    start = time.perf_counter()
    started_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    asked_since = now_utc()  # the predictions this run asked, not an earlier run's left in the folder
    with (
        tqdm(total=len(chosen), unit="notebook", disable=not progress) as bar,
        tempfile.TemporaryDirectory() as kernels_dir,
    ):
        write_kernelspec(Path(kernels_dir))

        def run(path: Path) -> dict:
            bar.set_postfix_str(path.stem)
            own = (env | {MODEL_ENV: model} if path in with_model else env) | {NOTEBOOK_ENV: path.stem}
            return run_notebook(path, output_dir, own, timeout_s, bar, Path(kernels_dir))

        def finished(r: dict) -> None:
            bar.update()
            bar.write(f"{r['name']}: {r['status']} in {r['wall_s']:.0f} s" + (f" ({r['error']})" if r["error"] else ""))

        if jobs == 1:  # in this thread, so Ctrl-C stops the running notebook at once
            runs = []
            for path in chosen:
                runs.append(run(path))
                finished(runs[-1])
        else:
            fill_model_cache()
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(run, path) for path in chosen]
                for future in as_completed(futures):
                    finished(future.result())
            runs = [f.result() for f in futures]
    status = {r["name"]: r["status"] for r in runs}
    expected = {p.stem: expected_claims(p) for p in every}
    mode, where = "smoke" if smoke else "full", machine()
    # What each notebook's lesson_header reads back: only a run alone on the machine (jobs 1) that measured
    # everything afresh is a learner's time; a run that read cached results keeps the earlier record.
    timed = [r for r in runs if jobs == 1 and not r.get("reused_results")]
    record_run_times(timed, mode, where, output_dir / "results")
    predictions = {
        name: rows for name, rows in load_predictions(output_dir / "results", asked_since).items() if name in status
    }
    score = CourseScore.of(predictions)
    summary = {
        "mode": mode,
        "notebooks_dir": str(notebooks_dir),
        "started_at": started_at,
        "machine": where,
        "wall_s": round(time.perf_counter() - start, 1),
        "notebooks": runs,
        "claims": article_claims_table({r["name"]: r["rows"] for r in runs}, expected, status),
        "predictions": predictions,
        "score": {"total": asdict(score.total), "notebooks": [asdict(s) for s in score.notebooks]},
        "core_path": core_path_times(notebooks_dir, output_dir / "results"),
    }
    (output_dir / "course.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False), encoding="utf-8")
    (output_dir / "index.html").write_text(index_html(summary), encoding="utf-8")
    return summary


def machine() -> str:
    """Where the course ran, in words: the device the notebooks pick (CUDA when available), the
    host, torch's version and threads (``harness.environment``)."""
    env = environment("cuda" if torch.cuda.is_available() else "cpu")
    return (
        f"{env['device_name']} ({env['device']}), host {env['host']}, torch {env['torch_version']}, "
        f"{env['torch_threads']} threads"
    )
