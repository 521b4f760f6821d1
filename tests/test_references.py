"""Every ``minieng.X`` a reader is pointed at, in the notebooks, the README and docs/, exists.

The course once named five things that had moved away (``minieng.flops``, ``minieng.ceilings``,
...). A name resolves when its longest importable module prefix imports and the rest are attributes.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"(?<![\w/.-])minieng(?:\.[A-Za-z_]\w*)+")


def texts() -> dict[str, str]:
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        found[path.name] = "\n".join("".join(c["source"]) for c in cells)
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found[path.name] = path.read_text(encoding="utf-8")
    return found


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def references() -> list[tuple[str, str]]:
    refs = set()
    for where, text in texts().items():
        for match in NAME.finditer(text):
            refs.add((where, match.group(0).rstrip(".")))
    return sorted(refs)


def test_the_reference_check_catches_a_name_that_moved_away():
    assert resolves("minieng.measure.roofline.tpot_floor_s") and resolves("minieng.lab")
    assert not resolves("minieng.flops") and not resolves("minieng.measure.no_such_name")


@pytest.mark.parametrize("where,dotted", references())
def test_every_minieng_name_a_reader_meets_exists(where, dotted):
    assert resolves(dotted), f"{where} names {dotted}, which does not exist: point it at the module that holds it now"


def test_the_readme_claims_index_is_the_package_s():
    """The README's claims index is ``format_index`` of ``ARTICLE_CLAIMS`` (without verdicts), so
    the README and the course never disagree on which notebook measures what. Regenerate it with
    ``python -c "from minieng.course.claims import *; print(format_index(index_entries({}), False))"``."""
    from minieng.course.claims import format_index, index_entries

    assert format_index(index_entries({}), with_verdicts=False) in (ROOT / "README.md").read_text(encoding="utf-8")
