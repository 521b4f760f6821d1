"""Every word of the primer is defined before the course uses it.

The primer (notebooks/00_primer.ipynb) defines each term in a markdown cell carrying its anchor
(``<a id="kv-cache"></a>``). Walking the notebooks in their order, no markdown or code cell may use a
term before the cell that defines it; later notebooks link back (``00_primer.ipynb#kv-cache``), and
every such link must name an anchor the primer has.

A use is the term as a word in the cell's text: in code, a comment or a string ("prefill 512 tok"),
not an identifier (``prefill_work``: the underscore joins it to a longer name). The acronyms are
matched in capitals only; "decoder" (the layer) is not "decode".
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PRIMER = "00_primer.ipynb"
# anchor -> {term: pattern}; a pattern is a regex matched against a cell's source.
TERMS: dict[str, dict[str, str]] = {
    "forward-pass": {"forward pass": r"(?i)\bforward pass(es)?\b"},
    "kv-cache": {"KV cache": r"(?i)\bKV[- ]cache(s)?\b"},
    "prefill-and-decode": {"prefill": r"(?i)\bprefill(s|ed|ing)?\b", "decode": r"(?i)\bdecod(e|es|ed|ing)\b"},
    "ttft-tpot-itl": {"TTFT": r"\bTTFTs?\b", "TPOT": r"\bTPOTs?\b", "ITL": r"\bITLs?\b"},
    "mfu-mbu": {"MFU": r"\bMFUs?\b", "MBU": r"\bMBUs?\b"},
    "arithmetic-intensity": {"arithmetic intensity": r"(?i)\barithmetic intensit(y|ies)\b"},
    "ridge-point": {"ridge point": r"(?i)\bridge points?\b"},
    "roofline": {"roofline": r"(?i)\brooflines?\b"},
    "hardware-glossary": {"SM": r"\bSMs?\b", "tensor core": r"(?i)\btensor cores?\b", "HBM": r"\bHBM\b"},
}
ANCHOR = re.compile(r'<a id="([a-z0-9-]+)"></a>')
PRIMER_LINK = re.compile(r"00_primer\.ipynb#([A-Za-z0-9_-]+)")


def notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def cells(path: Path) -> list:
    return nbformat.read(path, as_version=4).cells


def anchors(cell) -> set[str]:
    return set(ANCHOR.findall(cell.source)) if cell.cell_type == "markdown" else set()


def first_uses_before_definition(paths: list[Path]) -> list[str]:
    """Each use of a term before its anchor's cell, walking ``paths`` in order: "notebook cell i: term"."""
    defined: set[str] = set()
    early = []
    for path in paths:
        for i, cell in enumerate(cells(path)):
            defined |= anchors(cell)  # a cell may use the terms it defines
            for anchor, terms in TERMS.items():
                if anchor in defined:
                    continue
                early += [f"{path.name} cell {i}: {term!r}" for term, rx in terms.items() if re.search(rx, cell.source)]
    return early


def test_the_primer_carries_every_anchor_once():
    found = [a for cell in cells(NOTEBOOKS / PRIMER) for a in anchors(cell)]
    assert sorted(found) == sorted(TERMS), f"the primer's anchors: {found}"


def test_the_primer_is_the_first_notebook():
    assert notebooks()[0].name == PRIMER


def test_no_term_is_used_before_the_primer_defines_it():
    early = first_uses_before_definition(notebooks())
    assert not early, "terms used before the primer's cell that defines them:\n" + "\n".join(early)


def test_every_link_to_the_primer_names_one_of_its_anchors():
    bad = [
        f"{path.name} cell {i}: #{anchor}"
        for path in notebooks()
        for i, cell in enumerate(cells(path))
        for anchor in PRIMER_LINK.findall(cell.source)
        if anchor not in TERMS
    ]
    assert not bad, "links to anchors the primer does not have:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "source, flagged",
    [
        ("Decode reads the KV cache.", ["'KV cache'", "'decode'"]),
        ("steps = [prefill_work(cfg, n) for n in PREFILL_TOKENS]  # decoder layers", []),
        ('print(f"prefill {n} tok: TTFT")', ["'prefill'", "'TTFT'"]),
        ("SMOKE = smoke_mode()  # the SMs", ["'SM'"]),
    ],
)
def test_the_check_flags_a_term_used_too_early(tmp_path, source, flagged):
    """A notebook that uses terms before any anchor is caught; identifiers and "decoder" are not uses."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source), nbformat.v4.new_markdown_cell('<a id="kv-cache"></a> KV cache')]
    path = tmp_path / "00_early.ipynb"
    nbformat.write(nb, path)
    early = first_uses_before_definition([path])
    assert sorted(e.split(": ", 1)[1] for e in early) == sorted(flagged)
