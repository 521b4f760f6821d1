"""The core stays plain and small (issue: "the engine a learner reads in an afternoon"), and the
README's "Read the engine" table says what it holds."""

from __future__ import annotations

import re
from pathlib import Path

import minieng

CORE = Path(minieng.__file__).parent / "core"
README = (Path(minieng.__file__).parents[1] / "README.md").read_text()
FEATURE_WORDS = re.compile(r"draft|spec_|verif|worker|rank|graph|triton|compiled|quant", re.IGNORECASE)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_core_is_at_most_12_files_2400_lines_and_300_a_file():
    files = sorted(CORE.glob("*.py"))
    assert len(files) <= 12, [f.name for f in files]
    assert sum(lines(f) for f in files) <= 2400
    assert max(lines(f) for f in files) <= 300, {f.name: lines(f) for f in files if lines(f) > 300}


def test_no_core_file_carries_a_feature_on_more_than_five_lines():
    counts = {
        f.name: sum(bool(FEATURE_WORDS.search(line)) for line in f.read_text().splitlines()) for f in CORE.glob("*.py")
    }
    assert max(counts.values()) <= 5, counts


def test_the_readme_lists_the_core_files_in_reading_order_with_their_line_counts():
    section = README.split("## Read the engine", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `(\w+\.py)` \| (\d+) \|", section, re.MULTILINE)
    listed = {name: int(count) for _, name, count in rows}
    assert [int(i) for i, _, _ in rows] == list(range(1, len(rows) + 1))
    assert set(listed) == {f.name for f in CORE.glob("*.py")} - {"__init__.py"}
    assert listed == {name: lines(CORE / name) for name in listed}, "README's line counts are stale"
    order = (CORE / "__init__.py").read_text().split("Read in this order:", 1)[1].split("Every feature", 1)[0]
    modules = [name for name in re.findall(r"``(\w+)``", order) if (CORE / f"{name}.py").is_file()]
    assert [name.removesuffix(".py") for name in listed] == modules, "the package docstring's order"
