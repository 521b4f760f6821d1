"""A real browser: JupyterLab in headless Chromium runs notebooks 00, 01, 03 and 07, and their panels work.

What a participant sees, checked the way they would see it: JupyterLab started on 127.0.0.1 (a
free port, a token), each notebook opened in Chromium, every cell run in smoke mode, then: the
sliders are rendered as widgets (not their ``IntSlider(...)`` text fallback) with a usable track,
at least one figure is an image, no output holds a traceback, and moving a slider then pressing
Run changes the panel's output; notebook 11's napkin-math calculator shows the measured point
beside its floors and redraws when a slider moves; the primer's two diagrams (notebook 00) render as
images of the size drawn. Screenshots land in ``test-results/browser/`` (CI artifacts).

The notebooks run from copies in a temporary folder (JupyterLab saves what it opens) and write
their results to another (``MINIENG_RESULTS_DIR``), so the checkout is never modified.

Needs ``playwright`` (the Python package, from the dev extra) and a system Chromium (Debian's
``chromium``; ``.ci/run`` installs it). Playwright's own browser download is never used: the
browser is the one at ``MINIENG_CHROMIUM`` or the first ``chromium``-like program on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.real_model]

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-results" / "browser"
MIN_TRACK_PX = 150  # a slider track narrower than this cannot be set to a chosen value by hand
SERVER_START_S = 90
RUN_ALL_S = 240  # every cell of one notebook in smoke mode, kernel start included
PANEL_RUN_S = 60

# For each notebook: the text its panel prints once its first slider is moved to its minimum and
# Run is pressed (01: a 16-token prompt; 07: a 0% shared prefix), and the number of sliders.
NOTEBOOKS = {
    "01_two_phases.ipynb": ("prefill of 16 tokens", 2),
    "07_prefix_caching.ipynb": ("0 shared tokens: hit rate 0.0%", 1),
}
# The napkin-math calculator's notebook: its panel redraws on every change, with no Run button.
NAPKIN_NOTEBOOK = "11_napkin_and_scaling_out.ipynb"
# The primer and the calls that draw its two diagrams (minieng.viz.primer: 12 x 5.2 and 12 x 5.6 inches,
# shown at 100 dpi). Cells are found by their source: nbstripout renumbers cell ids as notebooks are staged.
PRIMER_NOTEBOOK = "00_primer.ipynb"
PRIMER_FIGURES = ("forward_pass_diagram(", "two_phases_diagram(")
MIN_DIAGRAM_PX = (1000, 400)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Settings for this test's JupyterLab only: every cell in the DOM (no windowing, so every output
# can be inspected and measured), and no news or update checks (nothing is fetched).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": '{"windowingMode": "none"}',
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": '{"fetchNews": "false", "checkForUpdates": false}',
}


def find_chromium() -> str | None:
    """The Chromium to drive: ``MINIENG_CHROMIUM``, or the first Chromium-like program on PATH."""
    given = os.environ.get("MINIENG_CHROMIUM")
    if given:
        return given if os.access(given, os.X_OK) else None
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def chromium_path():
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install -e '.[notebooks]')")
    path = find_chromium()
    if path is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set MINIENG_CHROMIUM to its path)")
    return path


@pytest.fixture(scope="module")
def lab(chromium_path, tmp_path_factory):
    """A JupyterLab server over copies of the notebooks: (base URL, token)."""
    root = tmp_path_factory.mktemp("lab")
    notebooks = root / "notebooks"
    notebooks.mkdir()
    for name in [*NOTEBOOKS, NAPKIN_NOTEBOOK, PRIMER_NOTEBOOK]:
        shutil.copy(REPO / "notebooks" / name, notebooks / name)
    settings = root / "settings"
    for rel, text in LAB_SETTINGS.items():
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(text)
    env = dict(
        os.environ,
        MINIENG_SMOKE="1",
        MINIENG_RESULTS_DIR=str(root / "results"),
        HF_HUB_OFFLINE="1",
        # The kernels import this checkout's package, as the rest of the suite does.
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"),
        JUPYTER_RUNTIME_DIR=str(root / "runtime"),
    )
    port, token = free_port(), uuid.uuid4().hex
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={notebooks}",
        # window.jupyterapp: run cells and read kernel state through JupyterLab's own commands.
        "--LabApp.expose_app_in_browser=True",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI runners often run as root
    log = root / "jupyterlab.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        server = subprocess.Popen(cmd, cwd=notebooks, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()  # the server shuts its kernels down as it exits
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, ARTIFACTS / "jupyterlab.log")


@pytest.fixture(scope="module")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # Containers give /dev/shm 64 MB, too little for Chromium's shared memory.
        b = p.chromium.launch(executable_path=chromium_path, headless=True, args=["--disable-dev-shm-usage"])
        yield b
        b.close()


# JavaScript run in the page, through the JupyterLab application object (window.jupyterapp).
CURRENT = "window.jupyterapp && window.jupyterapp.shell.currentWidget"
KERNEL_IDLE = f"""() => {{
    const nb = {CURRENT};
    const kernel = nb && nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;
    return !!kernel && kernel.status === "idle";
}}"""
RUN_ALL = """() => {
    window.__runAll = undefined;
    window.jupyterapp.commands.execute("notebook:run-all-cells").then(
        ok => { window.__runAll = ok === false ? "a cell failed" : "done"; },
        err => { window.__runAll = "error: " + err; });
}"""
UNRUN_CELLS = f"""() => Array.from({CURRENT}.content.widgets)
    .map((cell, i) => [i, cell.model.type, cell.model.executionCount])
    .filter(([i, type, count]) => type === "code" && !count).map(([i]) => i)"""
OUTPUT_TEXTS = """() => Array.from(document.querySelectorAll(".jp-OutputArea-output")).map(e => e.innerText)"""
FIGURES = """() => Array.from(document.querySelectorAll(".jp-OutputArea-output img"))
    .filter(img => img.complete && img.naturalWidth > 0).length"""
SLIDERS = """() => Array.from(document.querySelectorAll(".widget-slider")).map(s => {
    const track = s.querySelector(".slider-container") || s.querySelector(".noUi-target");
    const label = s.querySelector(".widget-label");
    return {description: label ? label.innerText : "",
            track_px: track ? track.getBoundingClientRect().width : 0,
            label_clipped: !!label && label.scrollWidth > label.clientWidth + 1};
})"""
CELL_IMAGE = f"""call => {{
    const cells = Array.from({CURRENT}.content.widgets);
    const index = cells.findIndex(cell => cell.model.type === "code" && cell.model.sharedModel.getSource().includes(call));
    const img = index < 0 ? null : cells[index].node.querySelector(".jp-OutputArea-output img");
    const drawn = !!img && img.complete;
    return {{index: index, width: drawn ? img.naturalWidth : 0, height: drawn ? img.naturalHeight : 0}};
}}"""
PANEL_OUTPUT = """panel => {
    const out = panel.querySelector(".widget-output");
    return out ? out.innerText + Array.from(out.querySelectorAll("img")).map(i => i.src.length).join(",") : "";
}"""


def shoot(page, name: str, element=None) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (element or page).screenshot(path=str(ARTIFACTS / f"{name}.png"))


def run_all(page, base: str, token: str, name: str) -> list[str]:
    """Open notebook ``name`` in a workspace of its own and run every cell; fail on a traceback, a
    failed cell or a cell left unrun. Returns the outputs' texts."""
    # A workspace of its own: JupyterLab would otherwise reopen (and start a kernel for) the
    # notebook the previous test left open.
    page.goto(f"{base}/lab/workspaces/{Path(name).stem}/tree/{name}?token={token}")
    page.wait_for_function(KERNEL_IDLE, timeout=SERVER_START_S * 1000)
    started = time.monotonic()
    page.evaluate(RUN_ALL)
    page.wait_for_function("() => window.__runAll !== undefined", timeout=RUN_ALL_S * 1000, polling=500)
    page.wait_for_function(KERNEL_IDLE, timeout=PANEL_RUN_S * 1000)
    print(f"{name}: all cells ran in {time.monotonic() - started:.0f} s in the browser")
    outcome = page.evaluate("() => window.__runAll")
    texts = page.evaluate(OUTPUT_TEXTS)
    tracebacks = [t for t in texts if "Traceback" in t]
    assert not tracebacks, f"{name}: an output holds a traceback:\n{tracebacks[0][-3000:]}"
    assert outcome == "done", f"{name}: Run All ended with {outcome!r}"
    assert page.evaluate(UNRUN_CELLS) == [], f"{name}: code cells left unrun"
    return texts


def close(page, stem: str) -> None:
    """The last screenshot, then the kernel (and its model) freed before the next notebook starts one."""
    try:
        shoot(page, f"{stem}-final")
        page.evaluate(f"() => {CURRENT} && {CURRENT}.sessionContext.shutdown()")
    finally:
        page.close()


@pytest.mark.parametrize("name", list(NOTEBOOKS), ids=lambda n: n.split("_")[0])
def test_notebook_runs_in_jupyterlab_with_live_widgets(lab, browser, name):
    base, token = lab
    moved_text, n_sliders = NOTEBOOKS[name]
    stem = Path(name).stem
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        texts = run_all(page, base, token, name)

        # Widgets rendered as widgets, not as the text a viewer without ipywidgets shows.
        fallbacks = [t for t in texts if re.search(r"\b(IntSlider|VBox)\(", t)]
        assert not fallbacks, f"{name}: a panel rendered as text, not widgets: {fallbacks[0][:200]}"
        page.wait_for_selector(".widget-slider", timeout=30_000)
        sliders = page.evaluate(SLIDERS)
        print(f"{name}: sliders " + ", ".join(f"{s['description']!r} track {s['track_px']:.0f} px" for s in sliders))
        assert len(sliders) == n_sliders, f"{name}: expected {n_sliders} slider widgets, found {sliders}"
        for s in sliders:
            assert s["track_px"] >= MIN_TRACK_PX, (
                f"{name}: slider {s['description']!r} has a {s['track_px']:.0f} px track (needs >= {MIN_TRACK_PX})"
            )
            assert not s["label_clipped"], f"{name}: slider description {s['description']!r} is cut off"
        assert page.evaluate(FIGURES) >= 1, f"{name}: no figure rendered as an image"

        # The panel: move its first slider to its minimum with the keyboard, press Run, and its
        # output must change to the result for that value.
        panel = page.locator(".widget-vbox", has=page.locator(".widget-slider")).last
        panel.scroll_into_view_if_needed()
        shoot(page, f"{stem}-notebook")
        shoot(page, f"{stem}-panel-before", panel)
        before = panel.evaluate(PANEL_OUTPUT)
        assert moved_text not in before, f"{name}: the panel already shows {moved_text!r} before the slider moved"
        readout = panel.locator(".widget-slider .widget-readout").first
        old_value = readout.inner_text()
        panel.locator(".widget-slider .noUi-handle").first.focus()
        page.keyboard.press("Home")
        page.wait_for_function(
            "([el, old]) => el.innerText !== old", arg=[readout.element_handle(), old_value], timeout=10_000
        )
        panel.locator(".widget-button", has_text="Run").click()
        page.wait_for_function(
            f"([panel, text]) => ({PANEL_OUTPUT})(panel).includes(text)",
            arg=[panel.element_handle(), moved_text],
            timeout=PANEL_RUN_S * 1000,
            polling=250,
        )
        page.wait_for_function(KERNEL_IDLE, timeout=PANEL_RUN_S * 1000)
        after = panel.evaluate(PANEL_OUTPUT)
        assert after != before
        assert "Traceback" not in after, f"{name}: the panel's run failed:\n{after[-3000:]}"
        shoot(page, f"{stem}-panel-after", panel)
        assert not errors, f"{name}: JavaScript errors in the page: {errors[:3]}"
    finally:
        close(page, stem)


def test_napkin_calculator_shows_the_readers_measured_point_and_redraws_live(lab, browser):
    """Notebook 11's calculator: its table holds the floors and, from the notebook's own run, the
    measured TPOT beside them (its own, or 01's at the same context); moving the batch slider redraws
    it at once (no Run button)."""
    base, token = lab
    stem = Path(NAPKIN_NOTEBOOK).stem
    page = browser.new_page(viewport={"width": 1400, "height": 2000})  # the whole panel in one screenshot
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        run_all(page, base, token, NAPKIN_NOTEBOOK)
        panel = page.locator(".widget-vbox", has=page.locator(".widget-html", has_text="Napkin math")).last
        panel.scroll_into_view_if_needed()
        before = panel.inner_text()
        print(f"{NAPKIN_NOTEBOOK}: the calculator reads\n{before}")
        for row in ("TPOT floor", "measured TPOT (notebook 0", "its floor (the floor explains"):
            assert row in before, f"the calculator has no {row!r} row:\n{before}"
        shoot(page, f"{stem}-napkin", panel)
        batch = panel.locator(".widget-slider", has_text="batch")
        old_value = batch.locator(".widget-readout").inner_text()
        batch.locator(".noUi-handle").focus()
        page.keyboard.press("End")
        page.wait_for_function(
            "([panel, old]) => panel.innerText !== old", arg=[panel.element_handle(), before], timeout=10_000
        )
        after = panel.inner_text()
        assert batch.locator(".widget-readout").inner_text() != old_value
        assert "Traceback" not in after and after != before
        shoot(page, f"{stem}-napkin-batch-moved", panel)
        assert not errors, f"JavaScript errors in the page: {errors[:3]}"
    finally:
        close(page, stem)


def test_primer_diagrams_render(lab, browser):
    """Notebook 00's two diagrams (the forward pass, the two phases) are drawn by their cells and
    displayed as images of the size drawn; each is screenshotted (``00_primer-<the drawing function>.png``)."""
    base, token = lab
    stem = Path(PRIMER_NOTEBOOK).stem
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        run_all(page, base, token, PRIMER_NOTEBOOK)
        for call in PRIMER_FIGURES:
            found = page.evaluate(CELL_IMAGE, call)
            cell_id = call.rstrip("(")
            print(f"{PRIMER_NOTEBOOK}: {cell_id} {found}")
            assert found["index"] >= 0, f"no code cell calls {call!r} in {PRIMER_NOTEBOOK}"
            assert found["width"] >= MIN_DIAGRAM_PX[0] and found["height"] >= MIN_DIAGRAM_PX[1], (
                f"{cell_id}: the diagram is not displayed as an image of its size: {found}"
            )
            image = page.locator(".jp-Notebook .jp-Cell").nth(found["index"]).locator(".jp-OutputArea-output img")
            image.scroll_into_view_if_needed()
            shoot(page, f"{stem}-{cell_id}", image)
            assert (ARTIFACTS / f"{stem}-{cell_id}.png").stat().st_size > 10_000
        assert not errors, f"JavaScript errors in the page: {errors[:3]}"
    finally:
        close(page, stem)
