"""What every verdict module shares: the wording of a verdict that holds, fails, is explained by the
load, is computed rather than timed, or cannot be tested; the noise of a ratio of two timings; and judging
a verdict by its category while wording it in full.
"""

from __future__ import annotations

from minieng.course.claims import verdict

HOLDS = "holds"
FAILS = "does not hold here"
# The article's figure is fixed by the load's parameters (its token counts), not by a speed: neither
# for nor against the physics, which another verdict times (S1 as vLLM logs it).
EXPLAINED = "explained"
# The verdict rests on counts and datasheets: no timing of this run decides it (S18's ranking across
# devices, S13's split on paper when no phase was timed).
COMPUTED = "computed"


def _ratio_noise(noise):
    """The relative noise of a ratio of two timings, each within ``1 + noise``: (1 + noise)^2 - 1."""
    relative = getattr(noise, "relative", noise)
    return None if relative is None else (1 + relative) ** 2 - 1


def not_testable(why: str) -> str:
    """The wording of a claim this device cannot test, with the reason."""
    return f"not testable here: {why}"


def categorized(category, wording, noise, **figures) -> str:
    """``wording(**figures)``, judged by ``category(**figures)`` alone: two wordings of one category
    ("holds" and "holds (above the range)") say the same to the noise check (``claims.verdict``), so
    only a flip to another category reads "too noisy", and then with the full wording at face value."""
    face = category(**figures)
    said = verdict(category, noise, **figures)
    full = wording(**figures)
    return full if said == face else said.replace(f"(at face value: {face})", f"(at face value: {full})")
