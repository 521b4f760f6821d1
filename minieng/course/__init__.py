"""The notebooks' kit (smoke mode, result cache, widgets, the claims table and its verdicts), the
napkin-math calculator (``napkin()``), the scored predictions (``predict``, ``score``), the pencil
problems (``reveal``), the running score (``running_score``, ``course_score``), each lesson's header
(``lesson_header``: core path or elective, reading and running time) and the course runner
(``python -m minieng course``).
"""

from minieng.course.claims import verdict
from minieng.course.kit import (
    allow_hub_downloads,
    announce,
    cached,
    claims_index,
    claims_table,
    dropdown,
    int_slider,
    on_colab,
    quote,
    run_panel,
    show,
)
from minieng.course.napkin_widget import napkin
from minieng.course.course_path import lesson_header
from minieng.course.predictions import napkin_here, predict, reveal
from minieng.course.scores import course_score, running_score, score

__all__ = [
    "allow_hub_downloads",
    "announce",
    "cached",
    "claims_index",
    "claims_table",
    "course_score",
    "dropdown",
    "int_slider",
    "lesson_header",
    "napkin",
    "napkin_here",
    "on_colab",
    "predict",
    "quote",
    "reveal",
    "run_panel",
    "running_score",
    "score",
    "show",
    "verdict",
]
