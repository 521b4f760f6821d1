"""The course command: notebooks executed into HTML with an index, failures reported, the articles'
claims tabled. Runs tiny notebooks written into a temporary folder (seconds), never the course's."""

import json

import pytest

pytest.importorskip("nbclient", reason="the course needs nbclient (the notebooks extra)")
pytest.importorskip("nbconvert", reason="the course needs nbconvert (the notebooks extra)")
nbformat = pytest.importorskip("nbformat", reason="the course needs nbformat (the notebooks extra)")

from minieng.cli import main as cli  # noqa: E402
from minieng.course import claims  # noqa: E402


def write_notebook(folder, name, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / name)


@pytest.fixture
def notebooks(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / "data.txt").write_text("found")
    write_notebook(
        folder,
        "00_measures.ipynb",
        "import os\nfrom minieng.course.kit import smoke_mode\n"
        "DATA = open('data.txt').read()  # the notebooks folder is the working directory\n"
        "SMOKE = smoke_mode()\nprint('cache:', os.environ['MINIENG_RESULTS_DIR'])\n"
        "import sys\nprint('python:', sys.executable)",
        "from minieng.course.kit import int_slider, run_panel\n"
        "run_panel({'n': int_slider('n', 3, 1, 9)}, lambda n: print(f'panel ran with n={n}'))",
        "from minieng.course.kit import claims_table\n"
        "claims_table([('S1: prefill tok/s >> decode tok/s', '136x', f'{DATA}, smoke {SMOKE}, 42x', 'holds'),\n"
        "              ('(beyond the articles) an extra check', '-', 'seen', 'holds')])",
        "import os\nprint(f'kernel pid {os.getpid()}')",
    )
    write_notebook(
        folder,
        "01_raises.ipynb",
        "print('before')",
        "raise RuntimeError('broken on purpose')",
        "from minieng.course.kit import claims_table\nclaims_table([('S5: the hit rate drives TTFT', 'a', 'b', 'c')])",
    )
    write_notebook(
        folder,
        "02_not_selected.ipynb",
        "from minieng.course.kit import claims_table\nclaims_table([('S8: speculation', 'a', 'b', 'c')])",
    )
    return folder


def test_course_reports_a_failure_and_runs_the_rest(notebooks, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main(["course", "--notebooks", str(notebooks), "--output", str(out), "--only", "0,01", "--smoke"])
    assert rc == 1  # one notebook failed
    summary = json.loads((out / "course.json").read_text())
    runs = {r["name"]: r for r in summary["notebooks"]}
    assert list(runs) == ["00_measures", "01_raises"]
    assert runs["00_measures"]["status"] == "ok"
    assert runs["01_raises"]["status"] == "failed"
    assert runs["01_raises"]["error"] == "RuntimeError: broken on purpose"

    index = (out / "index.html").read_text()
    for name in runs:
        assert f'href="{name}.html"' in index and (out / f"{name}.html").is_file()
    assert "broken on purpose" in index
    # where and when it ran, so the page is never read as another machine's numbers
    from minieng.device import cpu_name

    assert summary["started_at"].endswith("UTC") and summary["started_at"] in index
    assert summary["machine"] in index and (cpu_name() in summary["machine"] or "cuda" in summary["machine"])
    # the failed notebook's page keeps what it showed before the error, and the error
    failed_page = (out / "01_raises.html").read_text()
    assert "before" in failed_page and "broken on purpose" in failed_page
    assert not (out / "02_not_selected.html").exists()
    # a panel's page shows what its run with the default values printed, with no widget to render
    page = (out / "00_measures.html").read_text()
    assert "panel ran with n=3" in page and "An interactive panel" in page
    assert "application/vnd.jupyter.widget-view+json" not in page

    table = {(c["id"], c["notebook"]): c for c in summary["claims"]}
    s1 = table["S1", "00_measures"]
    assert s1["here"] == "found, smoke True, 42x" and s1["holds"] == "holds"  # run in the folder, smoke mode on
    assert table["S5", "01_raises"]["here"] == "not measured (notebook 01 failed)"
    assert table["S8", "02_not_selected"]["here"] == "not measured (notebook 02 not run)"
    assert table["S3", ""]["here"] == "not measured (no notebook names it)"
    assert [c["id"] for c in summary["claims"]].count("S1") == 1  # the extra row is not an article's claim
    assert {c["id"] for c in summary["claims"]} == set(claims.ARTICLE_CLAIMS)

    printed = capsys.readouterr().out
    assert "| S1: " in printed and "found, smoke True, 42x" in printed and "notebook 01 failed" in printed
    # the result cache went under the output folder, and nothing was written beside the notebooks
    executed = nbformat.read(out / "00_measures.ipynb", as_version=4)
    # and the kernel ran this interpreter, whatever a "python3" kernelspec elsewhere names
    import sys

    assert executed.cells[0].outputs[0]["text"] == f"cache: {out.resolve() / 'results'}\npython: {sys.executable}\n"
    # each notebook's kernel was shut down when it finished (a full course would hold 11 models)
    import os

    pid = int(executed.cells[3].outputs[0]["text"].split()[-1])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert sorted(p.name for p in notebooks.iterdir()) == [
        "00_measures.ipynb",
        "01_raises.ipynb",
        "02_not_selected.ipynb",
        "data.txt",
    ]


def test_course_stops_a_notebook_at_its_timeout(tmp_path):
    from minieng.course.runner import run_course

    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_notebook(folder, "05_slow.ipynb", "import time\ntime.sleep(60)")
    summary = run_course(folder, tmp_path / "out", timeout_s=2, progress=False)
    (run,) = summary["notebooks"]
    assert run["status"] == "timed out" and run["wall_s"] < 30
    assert (tmp_path / "out" / "05_slow.html").is_file()


def test_sliced_get_msg_asks_again_each_slice_and_keeps_the_timeout():
    """A wake-up the socket missed costs one slice, not the whole timeout; a message that never
    comes raises ``queue.Empty`` once the caller's timeout is spent, as the channel does."""
    import asyncio
    import queue
    import time

    from minieng.course.runner import sliced_get_msg

    waits = []

    async def missed_wakeup(timeout=None):  # the message is queued, but this wait never sees it
        waits.append(timeout)
        if len(waits) == 1:
            await asyncio.sleep(timeout)
            raise queue.Empty
        return {"msg_id": "reply"}

    start = time.monotonic()
    assert asyncio.run(sliced_get_msg(missed_wakeup, slice_s=0.05)(timeout=30)) == {"msg_id": "reply"}
    assert time.monotonic() - start < 5 and waits[0] == pytest.approx(0.05)

    async def silent(timeout=None):
        await asyncio.sleep(timeout)
        raise queue.Empty

    start = time.monotonic()
    with pytest.raises(queue.Empty):
        asyncio.run(sliced_get_msg(silent, slice_s=0.05)(timeout=0.2))
    assert 0.2 <= time.monotonic() - start < 5


def test_only_names_an_unknown_notebook(notebooks, tmp_path, capsys):
    assert cli.main(["course", "--notebooks", str(notebooks), "--output", str(tmp_path / "o"), "--only", "9"]) == 2
    assert "no such notebook" in capsys.readouterr().err


def test_course_never_writes_over_the_notebooks(notebooks, capsys):
    before = {p.name: p.read_bytes() for p in notebooks.glob("*.ipynb")}
    assert cli.main(["course", "--notebooks", str(notebooks), "--output", str(notebooks), "--smoke"]) == 2
    assert "notebooks' own folder" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in notebooks.glob("*.ipynb")} == before


@pytest.mark.parametrize(
    "text, ids",
    [
        ("S7: chunked prefill", ["S7"]),
        ("S10: bigger batch", ["S10"]),
        ("S3, S13: both", ["S3", "S13"]),
        ("(S5) hit rate", ["S5"]),
        ("**S2**: bold", ["S2"]),
        ("(beyond the articles) KV bytes", []),
        ("decode time follows the bytes (S3)", []),
        ("S99: not an article claim", []),
        ("S1x: no", []),
    ],
)
def test_claim_ids_are_read_from_the_start_of_a_row(text, ids):
    assert claims.claim_ids(text) == ids


def test_every_course_notebook_names_its_article_claims():
    """Each row about an article's claim starts with its id, and every claim has a notebook."""
    from pathlib import Path

    from minieng.course.runner import expected_claims

    named = set()
    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb")):
        named |= expected_claims(path)
    assert named == set(claims.ARTICLE_CLAIMS)


def test_make_test_notebooks_fails_when_a_notebook_fails(tmp_path):
    """The test command's notebook step (the Makefile's ``test-notebooks``, two at a time) exits
    non-zero when one notebook fails, after running the others, its report left in TEST_NOTEBOOKS_OUT."""
    import re
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_notebook(folder, "00_fine.ipynb", "print('fine')")
    write_notebook(folder, "01_raises.ipynb", "raise RuntimeError('broken on purpose')")
    write_notebook(folder, "02_fine.ipynb", "print('fine too')")
    report_dir = tmp_path / "report"
    (report_dir / "stale").mkdir(parents=True)  # from an earlier run: replaced
    # This interpreter's environment, whatever made it: -o keeps make from setting one up.
    prefix = Path(sys.prefix)
    run = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(Path(__file__).resolve().parents[2]),
            "-o",
            str(prefix / ".installed"),
            "test-notebooks",
            f"VENV={prefix}",
            f"BIN={Path(sys.executable).parent}",
            f"NOTEBOOKS={folder}",
            "NOTEBOOK_JOBS=2",
            "NOTEBOOK_TIMEOUT=120",
            f"TEST_NOTEBOOKS_OUT={report_dir}",
            "GPU_BRANCH_NOTEBOOKS=02",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = run.stdout
    assert run.returncode != 0, out + run.stderr
    assert "broken on purpose" in out and out.rstrip().endswith("notebooks: 2 passed, 1 failed"), out + run.stderr
    # the report lists the notebooks in their order, whichever finished first
    report = [m.group(1, 2) for m in re.finditer(r"^(\d\d_\w+)\s+(ok|failed)\s+\d+ s", out, re.M)]
    assert report == [("00_fine", "ok"), ("01_raises", "failed"), ("02_fine", "ok")], out
    assert (report_dir / "index.html").is_file() and not (report_dir / "stale").exists()
    assert f"open {report_dir}/index.html" in out  # the page it names is there to open


def test_course_refuses_zero_jobs(notebooks, tmp_path, capsys):
    assert cli.main(["course", "--notebooks", str(notebooks), "--output", str(tmp_path / "o"), "--jobs", "0"]) == 2
    assert "--jobs=0" in capsys.readouterr().err


def test_model_reaches_only_the_notebooks_it_names(tmp_path, monkeypatch):
    monkeypatch.delenv("MINIENG_MODEL", raising=False)
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for name in ("00_a.ipynb", "01_b.ipynb"):
        write_notebook(folder, name, "import os\nprint('model:', os.environ.get('MINIENG_MODEL'))")
    out = tmp_path / "out"
    argv = ["course", "--notebooks", str(folder), "--output", str(out), "--smoke"]
    assert cli.main(argv + ["--model", "SmolLM2-135M", "--model-only", "1"]) == 0
    printed = {
        name: nbformat.read(out / f"{name}.ipynb", as_version=4).cells[0].outputs[0]["text"]
        for name in ("00_a", "01_b")
    }
    assert printed == {"00_a": "model: None\n", "01_b": "model: SmolLM2-135M\n"}


def test_each_claim_lists_the_notebooks_whose_closing_tables_name_it():
    """The claims index (README, notebook 00) says where each claim is measured: the notebooks whose
    claims_table rows name it (in the notebook or its ``minieng.course.closing`` module), and no other."""
    from pathlib import Path

    from minieng.course.runner import expected_claims

    named = {cid: set() for cid in claims.ARTICLE_CLAIMS}
    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb")):
        for cid in expected_claims(path):  # the notebook's cells and the closing module they import
            named[cid].add(path.name[:2])
    assert {cid: set(c.notebooks) for cid, c in claims.ARTICLE_CLAIMS.items()} == named


def test_the_index_lists_the_predictions_beside_the_measurements(tmp_path):
    """The runner's kernels have no reader: each prediction is the napkin value, said so, scored against
    the measurement; the index and course.json list them, and not what an earlier run left behind."""
    from minieng.course.runner import report, run_course

    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_notebook(
        folder,
        "03_predicts.ipynb",
        "from minieng.course import predict, score\n"
        "predict('ratio', 'How many times faster is prefill per token?', unit='x', napkin=30)",
        "measured = 12.0  # what the measurement found",
        "score('ratio', measured, why='prefill runs below the matmul ceiling here')",
        "predict('bound', 'What bounds batch-1 decode?', napkin='memory', choices=['compute', 'memory'])\n"
        "score('bound', 'memory')",
        "from minieng.course import reveal, running_score\nreveal('kv', 'How many KV bytes a token?', '**46,080 B**')",
        "running_score()",
    )
    results = tmp_path / "out" / "results"
    results.mkdir(parents=True)
    (results / "predictions-03_predicts.json").write_text(
        json.dumps({"old": {"question": "an earlier run's question", "asked_at": "2001-01-01 00:00:00 UTC"}})
    )
    summary = run_course(folder, tmp_path / "out", progress=False)
    assert summary["notebooks"][0]["status"] == "ok", summary["notebooks"][0]["error"]
    rows = summary["predictions"]["03_predicts"]
    assert [r["key"] for r in rows] == ["ratio", "bound", "kv"] and rows[2]["kind"] == "pencil"
    assert rows[0]["source"] == "napkin" and rows[0]["prediction"] == 30 and rows[0]["measured"] == 12.0
    assert json.loads((tmp_path / "out" / "course.json").read_text())["predictions"] == summary["predictions"]

    index = (tmp_path / "out" / "index.html").read_text()
    assert "Predictions beside the measurements" in index
    assert "How many times faster is prefill per token?" in index and "30x (the napkin value: nobody typed)" in index
    assert "<td>12x</td>" in index and "measured / napkin 0.4x" in index
    assert "What bounds batch-1 decode?" in index and "napkin right" in index
    assert "an earlier run" not in index
    # the notebook's own page shows the note and the score
    page = (tmp_path / "out" / "03_predicts.html").read_text()
    assert "nobody types here" in page and "Prediction scored." in page
    assert "03 ratio: predicted 30x" in report(summary)
    # the pencil problem is counted, not listed as a prediction; the score is the page's and the report's
    assert "How many KV bytes a token?" not in index and "<details>" in page and "46,080 B" in page
    assert (
        "Score so far in 03_predicts:</strong>" in page and "2 scored: 1 close" in page
    )  # the old question counts too
    assert summary["score"]["total"] == {
        "notebook": "the course", "asked": 2, "scored": 2, "close": 1, "typed": 0,
        "napkin_scored": 2, "napkin_close": 1, "pencil": 1,
    }  # fmt: skip
    assert "The course's prediction score" in index and "1 pencil problem shown" in index
    assert "The course's score: 2 predictions asked" in report(summary)
    # this full-mode run's time is recorded for lesson_header, and the core path's sum waits for the rest
    (run,) = summary["notebooks"]
    core = {r["name"]: r for r in summary["core_path"]["notebooks"]}
    assert core["03_predicts"]["run_s"] == run["wall_s"] and core["03_predicts"]["reading_s"] > 0
    assert summary["core_path"]["fits"] is None and summary["core_path"]["missing"] == ["00", "01", "05", "07", "10"]
    assert "The core path's time" in index and "not judged until every core notebook has a full-mode run" in index
    times = json.loads((results / "run-times.json").read_text())
    assert times["03_predicts"]["wall_s"] == run["wall_s"] and times["03_predicts"]["mode"] == "full"
    assert "Core path (reading estimated at 200 words/min" in report(summary)


@pytest.mark.parametrize("jobs, policy", [("1", "None"), ("2", "PASSIVE")])
def test_kernels_side_by_side_let_openmp_sleep(tmp_path, monkeypatch, jobs, policy):
    """Two kernels on two cores: OpenMP's idle threads must not spin on a core the other needs."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_notebook(folder, "00_a.ipynb", "import os\nprint('policy:', os.environ.get('OMP_WAIT_POLICY'))")
    out = tmp_path / "out"
    assert cli.main(["course", "--notebooks", str(folder), "--output", str(out), "--smoke", "--jobs", jobs]) == 0
    printed = nbformat.read(out / "00_a.ipynb", as_version=4).cells[0].outputs[0]["text"]
    assert printed == f"policy: {policy}\n"


def write_lesson(folder, name, words: int, code_lines: int) -> None:
    """A notebook of ``words`` markdown words and ``code_lines`` code lines, after a setup cell."""
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("# setup\n" + "import os\n" * 40),  # the Colab cell: not read
            nbformat.v4.new_markdown_cell(" ".join(["word"] * words)),
            nbformat.v4.new_code_cell("# a comment\n\n" + "x = 1\n" * code_lines),
        ]
    )
    nbformat.write(nb, folder / name)


def test_lesson_header_prints_the_place_the_reading_rule_and_the_recorded_run_time(tmp_path, monkeypatch, capsys):
    from minieng.course import course_path
    from minieng.course.course_path import lesson_header, reading_time, record_run_times

    monkeypatch.chdir(tmp_path)  # a kernel's working directory: the notebook's folder
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("MINIENG_NOTEBOOK", "03_decode")
    write_lesson(tmp_path, "03_decode.ipynb", words=1000, code_lines=30)
    write_lesson(tmp_path, "04_gpu.ipynb", words=200, code_lines=3)
    assert reading_time(tmp_path / "03_decode.ipynb").seconds == 60 * 1000 / 200 + 10 * 30  # 5 min + 5 min
    lesson_header()
    out = capsys.readouterr().out
    assert "03_decode: core path, lesson 3 of 6." in out
    assert "Reading time: about 10 min (1,000 markdown words at 200 words/min + 30 code lines at 10 s each)" in out
    assert "Running time: not yet measured on this machine (run `make course`)." in out

    # a smoke run's time and another host's are not this machine's full-mode time
    record_run_times([{"name": "03_decode", "status": "ok", "wall_s": 5.0}], "smoke", "cpu", tmp_path / "results")
    lesson_header()
    assert "not yet measured" in capsys.readouterr().out
    record_run_times([{"name": "03_decode", "status": "ok", "wall_s": 754.0}], "full", "cpu", tmp_path / "results")
    lesson_header()
    assert "Running time: 13 min in full mode on this machine" in capsys.readouterr().out
    here = course_path.this_host
    monkeypatch.setattr(course_path, "this_host", lambda: "another-host")
    lesson_header()
    assert "not yet measured" in capsys.readouterr().out
    monkeypatch.setattr(course_path, "this_host", here)

    lesson_header("04", directory=tmp_path / "results")
    out = capsys.readouterr().out
    assert "04_gpu: elective." in out and "about 90 s" in out  # 60 s of words + 30 s of code


def test_lesson_header_reads_make_course_output_from_the_notebooks_folder(tmp_path, monkeypatch, capsys):
    """JupyterLab opened in notebooks/: its results/ holds no run time; `make course`'s output beside it does."""
    from minieng.course.course_path import lesson_header, record_run_times

    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    write_lesson(notebooks, "10_serving.ipynb", words=10, code_lines=1)
    record_run_times(
        [{"name": "10_serving", "status": "ok", "wall_s": 90.0}], "full", "cpu", tmp_path / "course-output" / "results"
    )
    record_run_times([{"name": "10_serving", "status": "failed", "wall_s": 3.0}], "full", "cpu", notebooks / "results")
    monkeypatch.chdir(notebooks)
    monkeypatch.delenv("MINIENG_RESULTS_DIR", raising=False)
    lesson_header("10_serving")
    out = capsys.readouterr().out
    assert "10_serving: core path, lesson 6 of 6." in out and "Running time: 90 s in full mode" in out


@pytest.mark.parametrize("run_s, fits", [(1000.0, True), (1300.0, False)])
def test_the_core_path_sums_reading_and_running_and_says_whether_it_fits_three_hours(tmp_path, run_s, fits):
    from minieng.course.course_path import CORE_PATH, core_path_lines, core_path_times, record_run_times

    for number in CORE_PATH:
        write_lesson(tmp_path, f"{number}_lesson.ipynb", words=1000, code_lines=30)  # 10 min to read each
    write_lesson(tmp_path, "02_elective.ipynb", words=5000, code_lines=100)
    runs = [{"name": f"{n}_lesson", "status": "ok", "wall_s": run_s} for n in CORE_PATH]
    record_run_times(runs[:-1], "full", "cpu", tmp_path / "results")
    partial = core_path_times(tmp_path, tmp_path / "results")
    assert partial["missing"] == ["10_lesson"] and partial["run_s"] is None and partial["fits"] is None
    assert partial["reading_s"] == 6 * 600

    record_run_times(runs, "full", "cpu", tmp_path / "results")
    times = core_path_times(tmp_path, tmp_path / "results")
    assert [r["name"] for r in times["notebooks"]] == [f"{n}_lesson" for n in CORE_PATH]  # no elective
    assert times["run_s"] == 6 * run_s and times["total_s"] == 6 * 600 + 6 * run_s
    assert times["fits"] is fits  # 3 h = 10,800 s: 3,600 s of reading + 6,000 s fits, + 7,800 s does not
    verdict = core_path_lines(times)[-1]
    assert ("which fits within 3 h 00 min" in verdict) is fits and ("does NOT fit" in verdict) is not fits


def test_a_run_that_read_cached_results_is_not_a_learners_time():
    """The runner records a notebook's wall time for lesson_header only when the notebook measured afresh:
    kit.cached's note in any output marks a result read back (and a rerun of make course reads them all)."""
    import nbformat

    from minieng.course.runner import reused_results

    fresh = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    fresh.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="TTFT 120 ms\n")]
    assert not reused_results(fresh)
    reread = nbformat.from_dict(json.loads(json.dumps(fresh)))
    reread.cells[0].outputs.append(
        nbformat.v4.new_output("stream", name="stdout", text="(cached result, measured 2026-12-07 22:00 UTC on cpu)\n")
    )
    assert reused_results(reread)
