"""The reader's words: "seed" means a random-number seed, never the source articles.

The course measures the claims of two articles (``course.claims.ARTICLES``); a reader meets them as
"the article" or by title. Every "seed" (the word, "seeds", "seeded", or an identifier with
``seed_``/``_seed`` in it) in the package, the notebooks' cells, the README and docs/ must sit inside
one of ``RNG``'s patterns, each about a random-number generator's seed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TOKEN = re.compile(r"\w*seed\w*", re.IGNORECASE)

# Each pattern covers the "seed" it contains, and only where it speaks of a random-number seed.
RNG = [
    r"\bmanual_seed\((seed\b)?",  # torch.Generator().manual_seed(...)
    r"\bdefault_rng\(seed\)",  # numpy's generator
    r"\bseed: int\b",  # a parameter or field annotated as the integer seed
    r"^\s*seed: (seeds (requests|this request's random draws)|the request's seed)\b",  # its Args entry
    r"\bseed=(seed\b)?",  # a keyword argument: SamplingParams(seed=0), workload_prompts(..., seed=seed)
    r"\bseed = |= seed\b",  # an assignment in code: seed = params.seed ..., self.seed = seed
    r", seed\)",  # passed on positionally: nudged_logits(model, token_ids, epsilon, seed)
    r"--seed\b",  # the command line's flag
    r"\b\w+\.seed\b",  # the attribute: params.seed, config.seed, args.seed, SamplingParams.seed
    r"\b_stable_seed\b|\bengine_seed\b",  # the engine's per-request seed derivation
    r"\bKeyedRandom\(seed\b",  # the keyed sampling noise
    r'name != "seed"|"max_tokens", "seed"',  # SamplingParams' field names
    r"``seed``|`seed`",  # the parameter named in prose
    r"\b(sampling|random|request's|engine's|engine|per-request|its|their own|same|fixed|different) seeds?\b",
    r"\bseeds? promises\b|\bwhat a seed\b",  # "what a seed promises": the sampling contract
    r"\bseeded (request|by)\b|\bseeds (requests|this request's random)\b",
    r"\(seed, ",  # "(seed, output position, ...)": what a draw is keyed by
]
RNG_RE = re.compile("|".join(f"(?:{p})" for p in RNG), re.IGNORECASE)


def is_seed(token: str) -> bool:
    t = token.lower()
    return t in ("seed", "seeds", "seeded", "seeding") or "seed_" in t or "_seed" in t


def unexplained(line: str) -> list[str]:
    """The seed words of ``line`` that no RNG pattern covers."""
    covered = [m.span() for m in RNG_RE.finditer(line)]
    return [
        m.group(0)
        for m in TOKEN.finditer(line)
        if is_seed(m.group(0)) and not any(a <= m.start() and m.end() <= b for a, b in covered)
    ]


def sources() -> dict[str, list[str]]:
    found = {}
    for path in sorted((ROOT / "minieng").rglob("*.py")):
        found[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8").splitlines()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        found[str(path.relative_to(ROOT))] = "\n".join("".join(c["source"]) for c in cells).splitlines()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8").splitlines()
    return found


@pytest.mark.parametrize(
    "line",
    [
        "seed: 10.8 GB / 360 GB/s",
        "| prefix caching is the cheapest lever (beyond the seeds) |",
        'return {"seed_points": [{"hit_rate": h, "ttft_s": t} for h, t in SEED_POINTS]}',
        "rows.append(f'<th>seed</th><th>figure</th>')",
        "from minieng.course.claims import SEED_CLAIMS, seed_claims_table",
        "panel = SEED_PANEL  # seed=the article",
    ],
)
def test_a_seed_meaning_the_articles_is_caught(line):
    assert unexplained(line)


@pytest.mark.parametrize(
    "line",
    [
        "gen = torch.Generator().manual_seed(seed)",
        "seed: int | None = None",
        'g.add_argument("--seed", type=int, help="the request\'s sampling seed")',
        "so a seeded request gives the same tokens whatever the batch",
    ],
)
def test_a_random_number_seed_passes(line):
    assert not unexplained(line)


def test_seed_means_a_random_number_seed_everywhere_a_reader_looks():
    bad = [
        f"{where}:{i}: {', '.join(words)}: {line.strip()}"
        for where, lines in sources().items()
        for i, line in enumerate(lines, 1)
        if (words := unexplained(line))
    ]
    assert not bad, (
        "'seed' here is not a random-number seed: say 'article' (or the article's title, "
        "course.claims.ARTICLES), or add an RNG pattern to tests/test_words.py if it is one:\n" + "\n".join(bad)
    )
