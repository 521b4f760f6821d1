"""The course runner's pages: ``index.html`` (each notebook's page, the core path's time, the course's
prediction score, every prediction beside its measurement, the articles' claims) and the terminal's
report, both from the summary ``runner.run_course`` writes as ``course.json``.
"""

from __future__ import annotations

import html

from minieng.course.claims import ARTICLE_CLAIMS, format_markdown
from minieng.course.course_path import core_path_lines, minutes
from minieng.course.predictions import PENCIL
from minieng.course.scores import CourseScore, entry_cells


def predicted(summary: dict) -> list[tuple[str, dict]]:
    """(notebook, entry) for each prediction in the summary, pencil problems left out (they have no
    measurement; the score counts them)."""
    return [(name, p) for name, rows in summary.get("predictions", {}).items() for p in rows if p.get("kind") != PENCIL]


def core_path_html(times: dict | None) -> str:
    """The core path's section of the index: per core notebook its reading and running time, the
    sums, and whether they fit the workshop's three hours."""
    if not times:
        return ""
    e = html.escape

    def cell(seconds, missing: str = "not yet measured") -> str:
        return missing if seconds is None else minutes(seconds)

    rows = "".join(
        f"<tr><td>{e(r['name'])}</td><td>{cell(r['reading_s'], 'no such notebook')}</td><td>{cell(r['run_s'])}</td></tr>"
        for r in times["notebooks"]
    )
    rows += f"<tr><th>total</th><th>{cell(times['reading_s'], 'not computed')}</th><th>{cell(times['run_s'])}</th></tr>"
    return (
        f"<h2>The core path's time</h2>\n<p>Reading time estimated at {e(times['rule'])}; running time measured "
        "by this runner in full mode on this machine.</p>\n<table><tr><th>core notebook</th><th>reading</th>"
        f"<th>running</th></tr>{rows}</table>\n<p>{e(core_path_lines(times)[-1])}</p>\n"
    )


def score_html(summary: dict) -> str:
    """The course's prediction score: the total, and a row per notebook."""
    score = CourseScore.of(summary.get("predictions", {}))
    if not score.notebooks:
        return ""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(s.notebook)}</td><td>{s.asked}</td><td>{s.scored}</td><td>{s.close}</td><td>{s.pencil}</td></tr>"
        for s in score.notebooks
    )
    return (
        f"<h2>The course's prediction score</h2>\n<p>{e(score.total.sentence())}</p>\n<table><tr><th>notebook</th>"
        f"<th>asked</th><th>scored</th><th>close</th><th>pencil problems</th></tr>{rows}</table>\n"
    )


def index_html(summary: dict) -> str:
    """The output folder's front page: each notebook's page with its status and time, the core path's
    time (reading and running, and whether it fits three hours), the course's prediction score, the
    predictions its notebooks asked for beside their measurements, then the articles' claims table."""
    e = html.escape
    nb_rows = "".join(
        f'<tr><td><a href="{e(r["html"])}">{e(r["name"])}</a></td><td class="{"ok" if r["status"] == "ok" else "bad"}">'
        f"{e(r['status'])}</td><td>{r['wall_s']:.0f} s</td><td>{e(r['error'] or '')}</td></tr>"
        for r in summary["notebooks"]
    )
    pages = {r["name"]: r["html"] for r in summary["notebooks"]}

    def notebook(name: str) -> str:
        number = e(name.split("_")[0])
        return f'<a href="{e(pages[name])}">{number}</a>' if name in pages else number

    prediction_rows = "".join(
        f"<tr><td>{notebook(name)}</td><td>{e(str(p.get('question', '')))}</td>"
        + "".join(f"<td>{e(cell)}</td>" for cell in entry_cells(p))
        + "</tr>"
        for name, p in predicted(summary)
    )
    predictions = (
        "<h2>Predictions beside the measurements</h2>\n<p>Each prediction a notebook asked for, stored before "
        "its measurement ran, and the napkin model's value. Nobody types in this run: a prediction is the napkin "
        "value unless you typed one in Jupyter into this results folder before.</p>\n<table><tr><th>notebook</th><th>question</th>"
        "<th>prediction</th><th>measured</th><th>napkin model</th><th>score</th></tr>"
        f"{prediction_rows}</table>\n"
        if prediction_rows
        else ""
    )
    claim_rows = "".join(
        f"<tr><td>{e(c['claim'] or c['id'] + ': ' + c['title'])}</td><td>{notebook(c['notebook'])}</td>"
        f"<td>{e(c['article'])}</td><td>{e(c['here'])}</td><td>{e(c['holds'])}</td></tr>"
        for c in summary["claims"]
    )
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>minieng course</title>
<style>body{{font-family:sans-serif;max-width:75em;margin:2em auto}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.3em .6em;vertical-align:top;text-align:left}} .ok{{color:#060}} .bad{{color:#b00}}</style>
</head><body>
<h1>minieng course, executed</h1>
<p>{e(summary["mode"])} mode, {len(summary["notebooks"])} notebook(s) in {summary["wall_s"] / 60:.1f} min,
started {e(summary["started_at"])} on {e(summary["machine"])}.</p>
<table><tr><th>notebook</th><th>status</th><th>wall time</th><th>error</th></tr>{nb_rows}</table>
{core_path_html(summary.get("core_path"))}{score_html(summary)}{predictions}<h2>The source articles' claims, measured here</h2>
<p>All {len(ARTICLE_CLAIMS)} of the articles' claims, one line per notebook that measures each (its closing table's rows).</p>
<table><tr><th>claim</th><th>notebook</th><th>article</th><th>measured here</th><th>holds?</th></tr>{claim_rows}</table>
</body></html>
"""


def report(summary: dict) -> str:
    """The terminal's summary: one line per notebook, the core path's time, the predictions scored and
    the course's score, then the articles' claims as Markdown."""
    lines = [
        f"{r['name']:<28} {r['status']:<9} {r['wall_s']:>7.0f} s  {r['error'] or ''}" for r in summary["notebooks"]
    ]
    head = [f"{summary['mode']} mode, started {summary['started_at']} on {summary['machine']}", ""]
    scored = [
        f"{name.split('_')[0]} {p['key']}: predicted {cells[0]}, measured {cells[1]}, napkin {cells[2]}"
        + (f" ({cells[3]})" if cells[3] else "")
        for name, p in predicted(summary)
        for cells in [entry_cells(p)]
    ]
    scored = ["", "Predictions:"] + scored if scored else []
    score = CourseScore.of(summary.get("predictions", {}))
    scored += ["", score.text()] if score.notebooks else []
    core = ["", *core_path_lines(summary["core_path"])] if summary.get("core_path") else []
    return "\n".join(head + lines + core + scored + ["", format_markdown(summary["claims"])])
