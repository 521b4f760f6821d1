"""The notebooks' kit (smoke mode, result cache, widgets, the claims table and its verdicts), the
napkin-math calculator (``napkin()``), the scored predictions (``predict``, ``score``) and the course
runner (``python -m minieng course``).
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
    run_panel,
    show,
)
from minieng.course.napkin_widget import napkin
from minieng.course.predictions import napkin_here, predict, score

__all__ = [
    "allow_hub_downloads",
    "announce",
    "cached",
    "claims_index",
    "claims_table",
    "dropdown",
    "int_slider",
    "napkin",
    "napkin_here",
    "on_colab",
    "predict",
    "run_panel",
    "score",
    "show",
    "verdict",
]
