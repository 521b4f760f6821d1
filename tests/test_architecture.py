"""docs/architecture.md is the house's plan of record: every module of the package is on it, in its layer."""

import re
from pathlib import Path

import minieng

PACKAGE = Path(minieng.__file__).parent
PLAN = (PACKAGE.parent / "docs" / "architecture.md").read_text()


def plan_by_folder(plan: str) -> dict[str, str]:
    """The layers' block of the plan, as {folder: its text}: "" for the top's leaves."""
    block = plan.split("```\nminieng/\n", 1)[1].split("```", 1)[0]
    parts, folder = {"": ""}, ""
    for line in block.splitlines():
        start = re.match(r"  (\w+)/ ", line)
        if start:
            folder = start.group(1)
        parts[folder] = parts.get(folder, "") + line + "\n"
    return parts


def missing_modules(plan: str) -> list[str]:
    """Each module the plan's layer block does not name where it lives: ``name.py`` in its folder's
    text, ``name/`` for a package inside a folder (its modules are its own)."""
    layers = plan_by_folder(plan)
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if path.name in ("__init__.py", "__main__.py"):
            continue
        folder = parts[0] if len(parts) > 1 else ""
        name = path.name if len(parts) <= 2 else f"{parts[1]}/"
        if not re.search(rf"(?<![\w/]){re.escape(name)}", layers.get(folder, "")):
            missing.append("/".join(parts[:2]))
    return sorted(set(missing))


def test_every_module_is_on_the_plan_in_its_layer():
    missing = missing_modules(PLAN)
    assert not missing, f"docs/architecture.md does not name {missing} in its layer: add each to its folder's line"


def test_a_module_named_in_another_layer_is_missing():
    """model/ and lab/ both have a kv_cache.py: naming one does not count for the other."""
    lab = plan_by_folder(PLAN)["lab"]
    assert "kv_cache.py" in lab
    plan = PLAN.replace(lab, lab.replace("kv_cache.py", "kv_pool_demo.py"))
    assert missing_modules(plan) == ["lab/kv_cache.py"]
