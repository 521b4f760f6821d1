"""What every verdict module shares: the wording of a verdict that holds, fails or cannot be tested,
the noise of a ratio of two timings, and whether a figure is a real number.
"""

from __future__ import annotations

import math

HOLDS = "holds"
FAILS = "does not hold here"


def _ratio_noise(noise):
    """The relative noise of a ratio of two timings, each within ``1 + noise``: (1 + noise)^2 - 1."""
    relative = getattr(noise, "relative", noise)
    return None if relative is None else (1 + relative) ** 2 - 1


def not_testable(why: str) -> str:
    """The wording of a claim this device cannot test, with the reason."""
    return f"not testable here: {why}"


def finite(x) -> bool:
    """Whether a figure is a real number (not None, NaN or infinite): a verdict needs one."""
    return x is not None and math.isfinite(x)
