"""The notebooks' kit (smoke mode, result cache, widgets, the claims table and its verdicts), the
napkin-math calculator (``napkin()``) and the course runner (``python -m minieng course``).
"""

from minieng.course.claims import verdict
from minieng.course.kit import announce, cached, claims_index, claims_table, dropdown, int_slider, run_panel, show
from minieng.course.napkin_widget import napkin

__all__ = [
    "announce",
    "cached",
    "claims_index",
    "claims_table",
    "dropdown",
    "int_slider",
    "napkin",
    "run_panel",
    "show",
    "verdict",
]
