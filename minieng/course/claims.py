"""The source articles' claims the course tests, and the rows the notebooks report about them.

Every notebook ends with ``kit.claims_table(rows)``: rows of (claim, article's figure, measured
here, holds?). A row about an article's claim starts with its id ("S7: chunked prefill ..."); other
rows (checks beyond the articles) carry none. ``python -m minieng course`` collects the rows of every
executed notebook and lays them out one claim after another (``article_claims_table``).

The ids follow the course's list of the source articles' claims (S1-S21); the titles here are short
paraphrases. Each claim's verdict is a function of ``minieng.course.verdicts``, tested to say
"does not hold" on figures where the claim fails. A verdict that no timing decides says so by its first
word: "explained" (the article's figure is fixed by its load's parameters, as S1's logged ratio) or
"computed" (counts and datasheets, as S18's ranking across devices); ``verdict_kind`` reads it.

A verdict that rests on timings goes through ``verdict``: on a busy machine the noise can be
larger than the effect a claim rests on, and then the row says "too noisy to judge here" instead
of a conclusion the measurement does not support (``ceilings.Noise`` reads that noise).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

# The extra mimetype of ``claims_table``'s display bundle: the rows as JSON, kept by any executor
# in the notebook's outputs beside the Markdown a reader sees.
CLAIMS_MIMETYPE = "application/vnd.minieng.course.claims+json"

ARTICLES: dict[str, str] = {
    "000": '"O erro de resumir performance a um número" (Igor Nascimento)',
    "003": '"Gerar Texto é o Pior Trabalho Que Já Deram Pra Uma GPU"',
}


@dataclass(frozen=True)
class Claim:
    """One claim of the source articles: a short paraphrase (``title``), the articles that make it
    (keys of ``ARTICLES``), the figure they state (quoted figures, never their sentences), and the
    notebooks that measure it, and how its verdict is reached (``judged``): "measured" (timed on this
    machine), or where part of it is not, "computed" (counts and datasheets decide it) or "explained"
    (the article's figure follows from the load's parameters), with what each part is."""

    title: str
    articles: tuple[str, ...]
    figure: str
    notebooks: tuple[str, ...]
    judged: str = "measured"


ARTICLE_CLAIMS: dict[str, Claim] = {
    "S1": Claim(
        "prefill and decode are two regimes: prefill moves far more tokens per second",
        ("000",),
        "vLLM panel: 12,968.6 vs 95 tok/s (136x)",
        ("01",),
        judged="measured (the physics, 01); explained (vLLM's logged ratio follows the load)",
    ),
    "S2": Claim(
        "prefill costs ~2 FLOPs per parameter per token, attention's n^2 term wins only at long context",
        ("000",),
        "2·P·n, plus attention's n²",
        ("01", "02"),
    ),
    "S3": Claim(
        "a decode step cannot beat bytes read / memory bandwidth",
        ("000",),
        "RTX 3060: 10.8 GB / 360 GB/s, ~33 tok/s",
        ("01", "03", "08"),
    ),
    "S4": Claim(
        "tensor parallelism over two devices adds their bandwidth, minus the link's cost",
        ("000",),
        "~66 tok/s on two RTX 3060, less in practice",
        ("11",),
        judged="measured on two devices; not testable on one (two ranks share one memory bus)",
    ),
    "S5": Claim(
        "the prefix-cache hit rate drives TTFT",
        ("000",),
        "97% hits: 0.87 s; 85.5%: 1.72 s",
        ("07",),
    ),
    "S6": Claim(
        "continuous batching multiplies decode throughput almost linearly, TPOT rising far less",
        ("000", "003"),
        "'almost linear'",
        ("05", "12"),
    ),
    "S7": Claim(
        "chunked prefill protects running decodes' inter-token gaps at a small TTFT price",
        ("000",),
        "a 40,000-token prompt stalls the decodes; chunked, TTFT a little higher",
        ("06",),
    ),
    "S8": Claim(
        "speculative decoding spreads one weight read over several accepted tokens",
        ("000", "003"),
        "several tokens per weight read",
        ("09",),
    ),
    "S9": Claim("separate prefill and decode engines pay off at scale", ("000",), "(qualitative)", ("10",)),
    "S10": Claim(
        "a bigger batch buys throughput with per-request latency: judge by goodput and P99",
        ("000",),
        "(qualitative)",
        ("10",),
    ),
    "S11": Claim("MFU: 40-60% in prefill, under 5% in batch-1 decode", ("003",), "40-60%; < 5% (often 2-3%)", ("02",)),
    "S12": Claim("GPU utilization reads 4-6% during decode", ("003",), "4-6%", ("04",)),
    "S13": Claim(
        "compute speeds prefill, bandwidth speeds decode: quantization helps decode far more",
        ("003",),
        "(qualitative)",
        ("00", "08"),
        judged="measured (08); computed in 00 (the ridge against the counted intensities)",
    ),
    "S14": Claim(
        "prefill cost follows the prompt's length, decode cost the answer's", ("003",), "(qualitative)", ("01",)
    ),
    "S15": Claim(
        "time TTFT and inter-token gaps from the stream, not the total latency",
        ("003",),
        "(qualitative)",
        ("01", "10"),
    ),
    "S16": Claim(
        "a bigger batch does not speed prefill once it is compute-bound",
        ("003",),
        "(qualitative)",
        ("03",),
    ),
    "S17": Claim(
        "more FLOP/s speeds prefill, more bandwidth speeds decode",
        ("003",),
        "(qualitative)",
        ("11",),
    ),
    "S18": Claim(
        "bigger GPUs sit idler in decode",
        ("003",),
        "more than 90% idle",
        ("11",),
        judged="computed (the ranking across the datasheet table); measured (the idle share on this device)",
    ),
    "S19": Claim("prefix caching is the cheapest lever", ("000",), "(qualitative)", ("07",)),
    "S20": Claim(
        "the same GPU is about 10x more efficient in one phase than the other",
        ("003",),
        "~10x (40-60% vs < 5% MFU)",
        ("02",),
    ),
    "S21": Claim("batching lifts decode MFU out of single digits", ("003",), "< 5% at batch 1", ("05",)),
}

_ID = r"S\d{1,2}"
_LEADING_IDS = re.compile(rf"^[\s(*_\[]*({_ID}(?:\s*(?:,|/|&|\+|and)\s*{_ID})*)(?![\w.])", re.IGNORECASE)
# A string literal opening a claims_table row in a notebook's source: ("S7: ...  or  (f"S7: ...
_ROW_LITERAL = re.compile(rf"\(\s*[rfRF]?[\"']({_ID}(?:\s*(?:,|/|&|\+|and)\s*{_ID})*)\s*:")


def claim_ids(claim: str) -> list[str]:
    """The claim ids a row's claim text starts with: "S7: ..." -> ["S7"], "S3, S13: ..." ->
    ["S3", "S13"], "(S5) ..." -> ["S5"]; [] for a row beyond the articles. Ids not in
    ``ARTICLE_CLAIMS`` are dropped."""
    match = _LEADING_IDS.match(claim)
    if not match:
        return []
    return [i for i in (m.upper() for m in re.findall(_ID, match.group(1), re.IGNORECASE)) if i in ARTICLE_CLAIMS]


def claims_in_source(source: str) -> set[str]:
    """The claim ids a notebook's claims_table rows name, read from its code (the source of
    the cells that call ``claims_table``): which claims the notebook is expected to measure."""
    return {i for group in _ROW_LITERAL.findall(source) for i in claim_ids(group) if i in ARTICLE_CLAIMS}


def article_claims_table(
    rows: dict[str, list[list[str]]], expected: dict[str, set[str]], status: dict[str, str]
) -> list[dict]:
    """One entry per (claim, notebook): the rows measured, and a line for each notebook that
    should have measured a claim and did not.

    ``rows``: notebook name -> its claims_table rows [claim, article's figure, here, holds]. ``expected``:
    notebook name -> the ids its source names (``claims_in_source``). ``status``: notebook name ->
    "ok", "failed", "timed out" or "not run". Returns dicts with keys id, title, notebook, claim,
    article, here, holds; a missing measurement has here = "not measured (notebook NN failed)" (or
    "not run", "gave no row") and holds = "-". A claim no notebook names gets one such line.
    """
    table = []
    for cid, claim in ARTICLE_CLAIMS.items():
        title = claim.title
        lines = []
        for name in sorted(set(rows) | set(expected)):
            got = [r for r in rows.get(name, []) if cid in claim_ids(r[0])]
            lines += [
                dict(id=cid, title=title, notebook=name, claim=r[0], article=r[1], here=r[2], holds=r[3]) for r in got
            ]
            if not got and cid in expected.get(name, set()):
                why = {"ok": "gave no row"}.get(status.get(name, "not run"), status.get(name, "not run"))
                lines.append(
                    dict(
                        id=cid,
                        title=title,
                        notebook=name,
                        claim="",
                        article="",
                        here=f"not measured (notebook {name.split('_')[0]} {why})",
                        holds="-",
                    )
                )
        table += lines or [
            dict(
                id=cid,
                title=title,
                notebook="",
                claim="",
                article="",
                here="not measured (no notebook names it)",
                holds="-",
            )
        ]
    return table


def format_markdown(table: list[dict]) -> str:
    """``article_claims_table``'s entries as one Markdown table: claim (the notebook's words, or the
    claim's title where nothing was measured), notebook, article's figure, measured here, holds?"""

    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| claim | notebook | article | measured here | holds? |", "| --- | --- | --- | --- | --- |"]
    lines += [
        f"| {cell(e['claim'] or e['id'] + ': ' + e['title'])} | {e['notebook'].split('_')[0] or '-'} | "
        f"{cell(e['article'] or '-')} | {cell(e['here'])} | {cell(e['holds'])} |"
        for e in table
    ]
    return "\n".join(lines)


# -- the claims index: every claim, where it is measured, and the verdict of the reader's last run --


def source_of(claim_id: str) -> str:
    """The titles of the articles a claim comes from, joined."""
    return "; ".join(ARTICLES[a] for a in ARTICLE_CLAIMS[claim_id].articles)


def index_entries(last: dict[str, dict]) -> list[dict]:
    """One entry per claim, S1-S21: id, title, source (the articles' titles), figure, notebooks, and
    ``verdicts``: the last verdicts recorded for it (``last``: a row's claim text -> {id, notebook,
    here, holds, measured_at}, as ``kit.claims_table`` records them), or [] when not measured yet."""
    entries = []
    for cid, claim in ARTICLE_CLAIMS.items():
        got = [dict(claim=text, **rec) for text, rec in last.items() if cid in claim_ids(text)]
        entries.append(
            dict(
                id=cid,
                title=claim.title,
                source=source_of(cid),
                figure=claim.figure,
                notebooks=", ".join(claim.notebooks),
                judged=claim.judged,
                verdicts=sorted(got, key=lambda r: r.get("notebook", "")),
            )
        )
    return entries


def format_index(entries: list[dict], with_verdicts: bool = True) -> str:
    """``index_entries`` as a Markdown table: claim, article, its figure, notebook(s), how it is judged, and (with
    ``with_verdicts``) the last run's verdict per notebook, or "not measured yet"."""

    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    head = "| id | claim | article | the article's figure | notebook | judged |"
    rule = "| --- | --- | --- | --- | --- | --- |"
    if with_verdicts:
        head, rule = head + " last verdict here |", rule + " --- |"
    lines = [head, rule]
    for e in entries:
        row = f"| {e['id']} | {cell(e['title'])} | {cell(e['source'])} | {cell(e['figure'])} | {e['notebooks']} | {cell(e['judged'])} |"
        if with_verdicts:
            said = "; ".join(f"{v['notebook']}: {v['holds']}" for v in e["verdicts"]) or "not measured yet"
            row += f" {cell(said)} |"
        lines.append(row)
    return "\n".join(lines)


# -- verdicts that the machine's noise could flip --------------------------------------------------

TOO_NOISY = "too noisy to judge here"
MAX_FIGURES = 12  # 2^12 corners


def _wording(text: str) -> str:
    """A verdict with its numbers blanked: "holds up to batch 8" and "... batch 16" say the same."""
    return re.sub(r"\d[\d,]*(?:\.\d+)?", "#", text)


def verdict(judge: Callable[..., str], noise, **figures) -> str:
    """``judge(**figures)``, unless the machine's timing noise could flip it.

    ``figures``: the measured figures the verdict rests on, by ``judge``'s parameter names, each a
    float or a list of floats (a sweep's rates), each taken to be known within a factor of
    ``1 + noise`` either way. Pass timings (or figures made of one timing, such as a tok/s or an
    MFU) rather than their ratios, so that a ratio of two timings gets both their noises. Counts
    (FLOPs, tokens, hit rates, preemptions) are not noisy: close over them in ``judge``.
    ``noise``: a ``ceilings.Noise`` or its ``relative`` (0.2: 20%); None (not read): ``judge``'s
    verdict as it is. A figure given as None (not measured here) is passed on as None, unmoved.

    ``judge`` runs again with every figure at either end of its band, all 2^k corners (exact for a
    verdict monotone in each figure, as a threshold is). If any corner's wording differs from the
    verdict's (numbers aside), the noise could flip it, and the verdict reads "too noisy to judge
    here: ..., at face value: <verdict>". Raises ``ValueError`` beyond ``MAX_FIGURES`` figures.
    """
    relative = getattr(noise, "relative", noise)
    said = judge(**figures)
    if not relative:
        return said
    flat = [
        (name, i)
        for name, v in figures.items()
        if v is not None  # a figure not measured here (a datasheet the device lacks) has no noise
        for i in (range(len(v)) if isinstance(v, (list, tuple)) else [None])
    ]
    if len(flat) > MAX_FIGURES:
        raise ValueError(f"verdict: {len(flat)} figures, at most {MAX_FIGURES} (2^{MAX_FIGURES} corners)")
    up, down = 1 + relative, 1 / (1 + relative)
    for corner in itertools.product((up, down), repeat=len(flat)):
        moved = {name: list(v) if isinstance(v, (list, tuple)) else v for name, v in figures.items()}
        for (name, i), factor in zip(flat, corner):
            if i is None:
                moved[name] = moved[name] * factor
            else:
                moved[name][i] = moved[name][i] * factor
        if _wording(judge(**moved)) != _wording(said):
            return f"{TOO_NOISY}: timings here may be off by {100 * relative:.0f}%, enough to flip it (at face value: {said})"
    return said


# The words a verdict starts with, most specific first: "holds", "does not hold here", "explained" (the
# article's figure is fixed by the load's parameters), "computed" (counts and datasheets decide it, no
# timing), "not testable here", "too noisy to judge here", "suspect" (faster than physics allows).
VERDICT_KINDS = ("too noisy to judge here", "not testable here", "does not hold here", "holds", "explained", "computed")


def verdict_kind(said: str) -> str:
    """The kind of a verdict's wording: one of ``VERDICT_KINDS`` it starts with, "suspect", or "other"
    (a row's own words, such as "a bound, computed" or "partly: ...")."""
    for kind in (*VERDICT_KINDS, "suspect"):
        if said.startswith(kind):
            return kind
    return "other"


def noise_note(noise) -> str:
    """One sentence under a claims table: the noise its verdicts were checked against."""
    relative = getattr(noise, "relative", noise)
    if relative is None:
        return "The machine's timing noise was not read: the verdicts stand as measured."
    level = getattr(noise, "level", None)
    return (
        f"Timing noise read at the start: about {100 * relative:.0f}%"
        + (f" ({level})" if level else "")
        + f'. A verdict that this noise could flip reads "{TOO_NOISY}"; rerun on a quieter machine to judge it.'
    )
