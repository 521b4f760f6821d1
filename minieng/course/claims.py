"""The source articles' claims the course tests, and the rows the notebooks report about them.

Every notebook ends with ``kit.claims_table(rows)``: rows of (claim, article's figure, measured
here, holds?). A row about a seed claim starts with its id ("S7: chunked prefill ..."); other
rows (checks beyond the seeds) carry none. ``python -m minieng course`` collects the rows of every
executed notebook and lays them out one seed claim after another (``seed_claims_table``).

The ids follow the course's list of the source articles' claims (S1-S15); the titles here are short paraphrases.

A verdict that rests on timings goes through ``verdict``: on a busy machine the noise can be
larger than the effect a claim rests on, and then the row says "too noisy to judge here" instead
of a conclusion the measurement does not support (``ceilings.Noise`` reads that noise).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

# The extra mimetype of ``claims_table``'s display bundle: the rows as JSON, kept by any executor
# in the notebook's outputs beside the Markdown a reader sees.
CLAIMS_MIMETYPE = "application/vnd.minieng.course.claims+json"

SEED_CLAIMS: dict[str, str] = {
    "S1": "prefill and decode are two regimes: prefill moves far more tokens per second",
    "S2": "prefill costs ~2 FLOPs per parameter per token, attention's n^2 term wins only at long context",
    "S3": "a decode step cannot beat bytes read / memory bandwidth",
    "S4": "tensor parallelism over two devices adds their bandwidth, minus the link's cost",
    "S5": "the prefix-cache hit rate drives TTFT",
    "S6": "continuous batching multiplies decode throughput almost linearly, TPOT rising far less",
    "S7": "chunked prefill protects running decodes' inter-token gaps at a small TTFT price",
    "S8": "speculative decoding spreads one weight read over several accepted tokens",
    "S9": "separate prefill and decode engines pay off at scale",
    "S10": "a bigger batch buys throughput with per-request latency: judge by goodput and P99",
    "S11": "MFU: 40-60% in prefill, under 5% in batch-1 decode",
    "S12": "GPU utilization reads 4-6% during decode",
    "S13": "compute speeds prefill, bandwidth speeds decode: quantization helps decode far more",
    "S14": "prefill cost follows the prompt's length, decode cost the answer's",
    "S15": "time TTFT and inter-token gaps from the stream, not the total latency",
}

_ID = r"S\d{1,2}"
_LEADING_IDS = re.compile(rf"^[\s(*_\[]*({_ID}(?:\s*(?:,|/|&|\+|and)\s*{_ID})*)(?![\w.])", re.IGNORECASE)
# A string literal opening a claims_table row in a notebook's source: ("S7: ...  or  (f"S7: ...
_ROW_LITERAL = re.compile(rf"\(\s*[rfRF]?[\"']({_ID}(?:\s*(?:,|/|&|\+|and)\s*{_ID})*)\s*:")


def claim_ids(claim: str) -> list[str]:
    """The claim ids a row's claim text starts with: "S7: ..." -> ["S7"], "S3, S13: ..." ->
    ["S3", "S13"], "(S5) ..." -> ["S5"]; [] for a row beyond the seeds. Ids not in
    ``SEED_CLAIMS`` are dropped."""
    match = _LEADING_IDS.match(claim)
    if not match:
        return []
    return [i for i in (m.upper() for m in re.findall(_ID, match.group(1), re.IGNORECASE)) if i in SEED_CLAIMS]


def claims_in_source(source: str) -> set[str]:
    """The claim ids a notebook's claims_table rows name, read from its code (the source of
    the cells that call ``claims_table``): which claims the notebook is expected to measure."""
    return {i for group in _ROW_LITERAL.findall(source) for i in claim_ids(group) if i in SEED_CLAIMS}


def seed_claims_table(
    rows: dict[str, list[list[str]]], expected: dict[str, set[str]], status: dict[str, str]
) -> list[dict]:
    """One entry per (claim, notebook): the rows measured, and a line for each notebook that
    should have measured a claim and did not.

    ``rows``: notebook name -> its claims_table rows [claim, seed, here, holds]. ``expected``:
    notebook name -> the ids its source names (``claims_in_source``). ``status``: notebook name ->
    "ok", "failed", "timed out" or "not run". Returns dicts with keys id, title, notebook, claim,
    seed, here, holds; a missing measurement has here = "not measured (notebook NN failed)" (or
    "not run", "gave no row") and holds = "-". A claim no notebook names gets one such line.
    """
    table = []
    for cid, title in SEED_CLAIMS.items():
        lines = []
        for name in sorted(set(rows) | set(expected)):
            got = [r for r in rows.get(name, []) if cid in claim_ids(r[0])]
            lines += [
                dict(id=cid, title=title, notebook=name, claim=r[0], seed=r[1], here=r[2], holds=r[3]) for r in got
            ]
            if not got and cid in expected.get(name, set()):
                why = {"ok": "gave no row"}.get(status.get(name, "not run"), status.get(name, "not run"))
                lines.append(
                    dict(
                        id=cid,
                        title=title,
                        notebook=name,
                        claim="",
                        seed="",
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
                seed="",
                here="not measured (no notebook names it)",
                holds="-",
            )
        ]
    return table


def format_markdown(table: list[dict]) -> str:
    """``seed_claims_table``'s entries as one Markdown table: claim (the notebook's words, or the
    claim's title where nothing was measured), notebook, article's figure, measured here, holds?"""

    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| claim | notebook | article | measured here | holds? |", "| --- | --- | --- | --- | --- |"]
    lines += [
        f"| {cell(e['claim'] or e['id'] + ': ' + e['title'])} | {e['notebook'].split('_')[0] or '-'} | "
        f"{cell(e['seed'] or '-')} | {cell(e['here'])} | {cell(e['holds'])} |"
        for e in table
    ]
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
    verdict as it is.

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
        (name, i) for name, v in figures.items() for i in (range(len(v)) if isinstance(v, (list, tuple)) else [None])
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
