"""Sizing a prefill sweep to the device: where prefill turns compute-bound, and which lengths to time.

A whole prompt of n tokens prefilled in one step costs about t(n) = overhead + n / rate, plus
attention's n^2 term at long context. While the per-step overhead dominates (kernel launches on a
GPU, Python, the LM head), TTFT stays flat and prefill tok/s = n / t(n) grows with n; once the
arithmetic dominates, tok/s stops growing. That length is the **knee**. On a 2-core CPU it comes
within a few hundred tokens; on an H200 a 135M model's TTFT stays flat (~13 ms) past 1,024 tokens.
A sweep that stops before the knee times the overhead, not the prefill: a linear + quadratic fit
of it finds no n^2 term, or a negative one.

So the notebooks take their lengths from the device: ``bench.probe_speed`` times prefill at
doubling lengths (``scan_prefill`` decides how far, within a time budget), ``prefill_knee`` reads
the knee off the timings, ``prefill_sweep_lengths`` spans from below it to well above it (capped by
the longest prompt the engine takes and a time budget), and ``fit_ttft`` fits TTFT = a + b n + c n^2
over the compute-bound part and says whether c is significantly positive.

Pure functions of (prompt tokens, seconds) pairs and the probe's dict: no engine, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

KNEE_TOLERANCE = 0.15  # tok/s within 15% of every longer length's: it has stopped growing


def _check_points(points: Sequence[tuple[int, float]]) -> None:
    if not points:
        raise ValueError("need at least one (prompt_tokens, ttft_s) point")
    lengths = [n for n, _ in points]
    if any(n < 1 for n in lengths) or any(t <= 0 for _, t in points):
        raise ValueError(f"prompt lengths must be >= 1 and TTFTs > 0 s; got {list(points)}")
    if lengths != sorted(set(lengths)):
        raise ValueError(f"prompt lengths must be distinct and ascending; got {lengths}")


def prefill_knee(points: Sequence[tuple[int, float]], tolerance: float = KNEE_TOLERANCE) -> dict:
    """Where prefill tok/s stops growing, and the per-step overhead under it.

    Args:
        points: ``(prompt_tokens, ttft_s)`` pairs, lengths ascending, each a whole prompt
            prefilled in one step (median TTFT).
        tolerance: tok/s within this fraction of the best at any longer length counts as grown.
    Returns:
        ``knee_tokens``: the shortest length whose tok/s, times ``1 + tolerance``, reaches that of
        every longer length. ``knee_reached``: a longer point confirms it; False when the knee is
        the longest length timed (tok/s may still grow beyond it: the knee is a lower bound).
        ``peak_tok_s``: the best tok/s seen. ``overhead_s``: the per-step floor, the intercept at
        n = 0 of the line through the two shortest points, clamped to [0, shortest TTFT] (0 with
        one point); on a GPU it is about a short prompt's TTFT, on a CPU much less.
    Raises:
        ValueError: no points, lengths not ascending, or a TTFT <= 0.
    """
    _check_points(points)
    rates = [n / t for n, t in points]
    i = next(i for i in range(len(points)) if rates[i] * (1 + tolerance) >= max(rates[i:]))
    overhead = 0.0
    if len(points) >= 2:
        (n0, t0), (n1, t1) = points[0], points[1]
        overhead = min(max(0.0, t0 - (t1 - t0) / (n1 - n0) * n0), t0)
    return {"knee_tokens": points[i][0], "knee_reached": i < len(points) - 1, "peak_tok_s": max(rates),
            "overhead_s": overhead}


def probe_lengths(max_prompt_tokens: int, start: int = 64) -> list[int]:
    """Doubling lengths from ``start`` up to ``max_prompt_tokens``, which closes the list."""
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens={max_prompt_tokens} must be >= 1")
    lengths = []
    n = min(start, max_prompt_tokens)
    while n < max_prompt_tokens:
        lengths.append(n)
        n *= 2
    return lengths + [max_prompt_tokens]


def scan_prefill(time_prefill: Callable[[int], float], lengths: Sequence[int], budget_s: float,
                 runs_per_length: int = 1, tolerance: float = KNEE_TOLERANCE) -> list[tuple[int, float]]:
    """Time prefill at growing lengths until the knee is confirmed or the budget would run out.

    Args:
        time_prefill: ``n -> TTFT (s)`` of an n-token prompt (the caller warms up and takes a median).
        lengths: ascending; the first is always timed.
        budget_s: seconds the scan may spend, counted from the TTFTs it got back (``runs_per_length``
            runs each), not from a clock. A length is skipped, and the scan ends, when the last
            TTFT scaled linearly to it would overrun the budget.
        runs_per_length: prefills one ``time_prefill`` call runs (warm-up included).
    Returns:
        the ``(prompt_tokens, ttft_s)`` points timed, for ``prefill_knee``.
    """
    points: list[tuple[int, float]] = []
    spent = 0.0
    for n in lengths:
        if points:
            last_n, last_t = points[-1]
            if spent + last_t * n / last_n * runs_per_length > budget_s:
                break
        t = time_prefill(n)
        spent += t * runs_per_length
        points.append((n, t))
        if len(points) >= 2 and prefill_knee(points, tolerance)["knee_reached"]:
            break
    return points


def predict_ttft_s(probe: dict, prompt_tokens: int) -> float:
    """A prefill's rough time from a probe: ``overhead_s + prompt_tokens / prefill_tok_s``, where
    ``prefill_tok_s`` is the best rate the probe saw (it ignores the n^2 term: an underestimate at
    long context)."""
    return probe.get("overhead_s", 0.0) + prompt_tokens / probe["prefill_tok_s"]


def _geometric(lo: float, hi: float, count: int) -> list[float]:
    if count <= 0:
        return []
    if count == 1:
        return [hi]
    return [lo * (hi / lo) ** (i / (count - 1)) for i in range(count)]


def prefill_sweep_lengths(probe: dict, n_points: int = 5, max_prompt_tokens: int | None = None,
                          budget_s: float | None = None, runs_per_length: float = 1, span: float = 16,
                          multiple: int = 16) -> list[int]:
    """Prompt lengths for a prefill sweep on this device: from below the knee to well above it.

    Args:
        probe: ``bench.probe_speed``'s result (``knee_tokens``, ``knee_reached``, ``prefill_tok_s``,
            ``overhead_s``, ``max_prompt_tokens``).
        n_points: how many lengths. With the knee reached, about a third lie below it (down to
            knee / 4) and the rest from the knee up, so a fit of the compute-bound range has
            points; without it, all lie geometrically from the top / ``span`` to the top. One
            point: the top alone (a length well past the knee, for one experiment).
        max_prompt_tokens: cap (default: the probe's, i.e. the engine's max_model_len - 1).
        budget_s: the sweep's rough time, ``runs_per_length`` prefills per length (whole-prompt
            equivalents: it may be fractional) at ``predict_ttft_s``; the top length shrinks until the sweep fits (never below the knee).
            None: no budget.
        span: the top is at most ``span`` x the knee (when reached).
        multiple: lengths are rounded to multiples of it (a KV block), at least ``multiple``.
    Returns:
        ascending distinct lengths (fewer than ``n_points`` when rounding merges some).
    Raises:
        ValueError: ``n_points`` < 1, or a cap below 1.
    """
    if n_points < 1:
        raise ValueError(f"n_points={n_points} must be >= 1")
    cap = max_prompt_tokens or probe["max_prompt_tokens"]
    if cap < 1:
        raise ValueError(f"max_prompt_tokens={cap} must be >= 1")
    multiple = max(1, min(multiple, cap))
    cap = cap // multiple * multiple
    reached = probe.get("knee_reached", False)
    knee = min(max(probe.get("knee_tokens") or multiple, multiple), cap)

    def lengths_up_to(hi: float) -> list[int]:
        if reached and n_points > 1:
            below = max(1, n_points // 3)
            raw = _geometric(knee / 4, knee, below + 1)[:-1] + _geometric(min(knee, hi), hi, n_points - below)
        else:
            raw = _geometric(max(multiple, hi / span), hi, n_points)
        rounded = (min(cap, max(multiple, multiple * round(n / multiple))) for n in raw)
        return sorted(set(rounded))

    def cost_s(lengths: list[int]) -> float:
        return runs_per_length * sum(predict_ttft_s(probe, n) for n in lengths)

    hi = float(min(cap, knee * span) if reached else cap)
    floor = knee if reached else multiple
    while budget_s is not None and hi > floor and cost_s(lengths_up_to(hi)) > budget_s:
        hi = max(floor, hi * 0.9)
    return lengths_up_to(hi)


def fit_ttft(points: Sequence[tuple[int, float]], from_tokens: int | None = None, tolerance: float = KNEE_TOLERANCE,
             z: float = 2.0) -> dict:
    """Fit TTFT = a + b n + c n^2 over the compute-bound part of a sweep; is the n^2 term real?

    Below the knee TTFT is flat (overhead), then it rises: that bend alone would make a quadratic
    fit over the whole sweep find a positive c with no attention in it, and a sweep of flat points
    finds c ~ 0 or negative. So the fit takes the points from the knee on (the sweep's own, or
    ``from_tokens`` if that is shorter: the probe's knee, which the sweep was laid out around),
    by ordinary least squares, with c's standard error from the residuals. A point fitted from
    below the true knee bends the fit concave: it can hide an n^2 term, never invent one.

    Args:
        points: ``(prompt_tokens, ttft_s)``, ascending, one-step prefills.
        from_tokens: fit from this length on when it is shorter than the sweep's own knee.
        z: c is significantly positive when c > z x its standard error.
    Returns:
        ``knee`` (``prefill_knee``'s dict), ``fitted_tokens`` (the lengths fitted), ``a_s``,
        ``b_s_per_token``, ``c_s_per_token2``, ``c_stderr`` (None without a spare point),
        ``significant`` (bool), ``quadratic_share`` (c n^2 / TTFT at the longest length, when
        significant, else None) and ``reason``: why not significant, in words, else None.
        The coefficients are None when fewer than 3 points are past the knee.
    Raises:
        ValueError: as ``prefill_knee``.
    """
    knee = prefill_knee(points, tolerance)
    start = knee["knee_tokens"] if from_tokens is None else min(from_tokens, knee["knee_tokens"])
    fitted = [(n, t) for n, t in points if n >= start]
    out = {"knee": knee, "fitted_tokens": [n for n, _ in fitted], "a_s": None, "b_s_per_token": None,
           "c_s_per_token2": None, "c_stderr": None, "significant": False, "quadratic_share": None}
    if not knee["knee_reached"]:
        out["reason"] = ("prefill tok/s was still growing at the longest prompt: the sweep stayed in the "
                         "overhead-bound range, where TTFT is mostly the per-step overhead and the n^2 term is hidden")
        return out
    if len(fitted) < 3:
        out["reason"] = (f"only {len(fitted)} point(s) lie past the knee ({start} tokens): "
                         "too few for a quadratic fit of the compute-bound range")
        return out
    n = np.array([p[0] for p in fitted], dtype=float)
    t = np.array([p[1] for p in fitted], dtype=float)
    scale = n.max()  # fit in n / max(n): a well-conditioned design matrix
    x = np.stack([np.ones_like(n), n / scale, (n / scale) ** 2], axis=1)
    coef, *_ = np.linalg.lstsq(x, t, rcond=None)
    a, b, c = coef[0], coef[1] / scale, coef[2] / scale**2
    out.update(a_s=float(a), b_s_per_token=float(b), c_s_per_token2=float(c))
    dof = len(fitted) - 3
    if dof > 0:
        residual = t - x @ coef
        cov = float(residual @ residual) / dof * np.linalg.inv(x.T @ x)
        out["c_stderr"] = math.sqrt(max(float(cov[2, 2]), 0.0)) / float(scale) ** 2
    stderr = out["c_stderr"]
    if c <= 0:
        out["reason"] = ("the fitted n^2 coefficient is not positive: over these lengths TTFT grows no faster "
                         "than linearly, the overhead and linear terms hide attention's n^2 work")
    elif stderr is None:
        out["reason"] = "no point to spare for an error estimate (3 points past the knee): c is not tested"
    elif c <= z * stderr:
        out["reason"] = (f"the n^2 coefficient ({c:.3g} s/token^2) is within {z:g} standard errors of 0 "
                         f"({stderr:.2g}): timing noise at these lengths is larger than the n^2 term")
    else:
        out["significant"], out["reason"] = True, None
        out["quadratic_share"] = float(c * n[-1] ** 2 / t[-1])
    return out
