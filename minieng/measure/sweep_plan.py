"""Sizing a prefill sweep to the device: where prefill turns compute-bound, and which lengths to time.

A whole prompt of n tokens prefilled in one step costs about t(n) = overhead + n / rate, plus
attention's n^2 term at long context. While the per-step overhead dominates (kernel launches on a
GPU, Python, the LM head), TTFT stays flat and prefill tok/s = n / t(n) grows with n; once the
arithmetic dominates, tok/s stops growing. That length is the **knee**. On a 2-core CPU it comes
within a few hundred tokens; on an H200 a 135M model's TTFT stays flat (~13 ms) past 1,024 tokens.
A sweep that stops before the knee times the overhead, not the prefill: a linear + quadratic fit
of it finds no n^2 term, or a negative one.

So the notebooks take their lengths from the device: ``probes.probe_speed`` times prefill at
doubling lengths (``scan_prefill`` decides how far, within a time budget), ``prefill_knee`` reads
the knee off the timings, ``prefill_sweep_lengths`` spans from below it to well above it (capped by
the longest prompt the engine takes and a time budget), and ``fit_ttft`` fits TTFT = a + b n + c n^2
over the compute-bound part and says whether c is significantly positive.

Decode sweeps are sized the same way: ``decode_sweep_batches`` climbs from batch 1 to past the
batch where decode turns compute-bound (``flops_bytes.decode_ridge_batch``), and ``kv_sweep_plan``
picks a batch and contexts at which the KV cache a step reads outgrows what the step already
costs (the weights, and on a GPU the per-step overhead that hides them).

Pure functions of (prompt tokens, seconds) pairs and the probe's dict: no engine, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from minieng.measure.flops_bytes import prefill_work

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
    return {
        "knee_tokens": points[i][0],
        "knee_reached": i < len(points) - 1,
        "peak_tok_s": max(rates),
        "overhead_s": overhead,
    }


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


def scan_prefill(
    time_prefill: Callable[[int], float],
    lengths: Sequence[int],
    budget_s: float,
    runs_per_length: int = 1,
    tolerance: float = KNEE_TOLERANCE,
) -> list[tuple[int, float]]:
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


def predict_ttft_s(probe: dict, prompt_tokens: int, model_config=None, count: int = 1) -> float:
    """A prefill's rough time from a probe: ``overhead_s + prompt_tokens / prefill_tok_s``, where
    ``prefill_tok_s`` is the best rate the probe saw. That ignores the n^2 term (an underestimate
    at long context) unless ``model_config`` is given: then the linear term is scaled by the
    prompt's FLOPs over its linear FLOPs (``flops_bytes.prefill_work``), attention included. ``count``
    prompts sent together (a batch about to decode) share the steps: one fixed cost, not one each."""
    scale = 1.0
    if model_config is not None:
        work = prefill_work(model_config, prompt_tokens, 2)  # FLOPs do not depend on the dtype
        scale = work.total_flops / (work.matmul_flops + work.lm_head_flops)
    return probe.get("overhead_s", 0.0) + count * scale * prompt_tokens / probe["prefill_tok_s"]


def predict_decode_step_s(probe: dict, batch_size: int = 1) -> float:
    """A decode step's rough time at ``batch_size``: the probe's batch-1 step, or ``batch_size /
    prefill_tok_s`` once that is longer (the batch's tokens cost what a prefill's do: the step has
    turned compute-bound). Ignores the KV cache's growth with context."""
    return max(probe["decode_step_s"], batch_size / probe["prefill_tok_s"])


def _geometric(lo: float, hi: float, count: int) -> list[float]:
    if count <= 0:
        return []
    if count == 1:
        return [hi]
    return [lo * (hi / lo) ** (i / (count - 1)) for i in range(count)]


def prefill_sweep_lengths(
    probe: dict,
    n_points: int = 5,
    max_prompt_tokens: int | None = None,
    budget_s: float | None = None,
    runs_per_length: float = 1,
    span: float = 16,
    multiple: int = 16,
) -> list[int]:
    """Prompt lengths for a prefill sweep on this device: from below the knee to well above it.

    Args:
        probe: ``probes.probe_speed``'s result (``knee_tokens``, ``knee_reached``, ``prefill_tok_s``,
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


def fit_ttft(
    points: Sequence[tuple[int, float]],
    from_tokens: int | None = None,
    tolerance: float = KNEE_TOLERANCE,
    z: float = 2.0,
) -> dict:
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
        ``significant`` (bool: c > 0 beyond ``z`` standard errors, with a >= 0 and b >= 0: a fit
        that needs a negative overhead or per-token cost to bend is no evidence of an n^2 term),
        ``physical`` (False when the fit bends up only with a negative a or b; None without a fit),
        ``quadratic_share`` (c n^2 / TTFT at the longest length, when significant, else None) and
        ``reason``: why not significant, in words, else None.
        The coefficients are None when fewer than 3 points are past the knee.
    Raises:
        ValueError: as ``prefill_knee``.
    """
    knee = prefill_knee(points, tolerance)
    start = knee["knee_tokens"] if from_tokens is None else min(from_tokens, knee["knee_tokens"])
    fitted = [(n, t) for n, t in points if n >= start]
    out = {
        "knee": knee,
        "fitted_tokens": [n for n, _ in fitted],
        "a_s": None,
        "b_s_per_token": None,
        "c_s_per_token2": None,
        "c_stderr": None,
        "significant": False,
        "physical": None,
        "quadratic_share": None,
    }
    if not knee["knee_reached"]:
        out["reason"] = (
            "prefill tok/s was still growing at the longest prompt: the sweep stayed in the "
            "overhead-bound range, where TTFT is mostly the per-step overhead and the n^2 term is hidden"
        )
        return out
    if len(fitted) < 3:
        out["reason"] = (
            f"only {len(fitted)} point(s) lie past the knee ({start} tokens): "
            "too few for a quadratic fit of the compute-bound range"
        )
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
    out["physical"] = not (c > 0 and min(a, b) < 0)
    if not out["physical"]:
        term = "overhead a" if a < 0 else "per-token b"
        out["reason"] = (
            f"the best fit needs a negative {term} ({1e3 * (a if a < 0 else b):.3g} ms{'' if a < 0 else ' per token'}): "
            "these timings are not an overhead, a linear and an n^2 cost that each add time (a machine "
            "busy with other work, or noise), so its n^2 term measures nothing"
        )
    elif c <= 0:
        out["reason"] = (
            "the fitted n^2 coefficient is not positive: over these lengths TTFT grows no faster "
            "than linearly, the overhead and linear terms hide attention's n^2 work"
        )
    elif stderr is None:
        out["reason"] = "no point to spare for an error estimate (3 points past the knee): c is not tested"
    elif c <= z * stderr:
        out["reason"] = (
            f"the n^2 coefficient ({c:.3g} s/token^2) is within {z:g} standard errors of 0 "
            f"({stderr:.2g}): timing noise at these lengths is larger than the n^2 term"
        )
    else:
        out["significant"], out["reason"] = True, None
        out["quadratic_share"] = float(c * n[-1] ** 2 / t[-1])
    return out


def decode_sweep_batches(
    probe: dict,
    ridge_batch: int | None,
    max_batch: int,
    steps: int,
    prompt_tokens: int,
    budget_s: float | None = None,
    factor: int = 4,
) -> list[int]:
    """Batch sizes for a decode sweep on this device: from 1 along the memory-bound slope to past the ridge.

    Args:
        probe: ``probes.probe_speed``'s result.
        ridge_batch: the batch where decode turns compute-bound (``flops_bytes.decode_ridge_batch``), or
            None when no batch does (then the sweep climbs to ``max_batch``).
        max_batch: the largest batch the engine takes (``max_num_seqs``, the KV pool).
        steps, prompt_tokens: each batch prefills ``prompt_tokens`` per sequence, then decodes
            ``steps`` steps; the rough cost (``predict_ttft_s``, ``predict_decode_step_s``) is held
            to ``budget_s`` by dropping the largest batches (1 always stays).
        factor: the ratio between successive batches.
    Returns:
        ascending batch sizes: powers of ``factor`` up to the first at or past twice the ridge
        batch (a point past the ridge), capped by ``max_batch``, which closes the list when
        reached.
    Raises:
        ValueError: ``max_batch`` < 1 or ``factor`` < 2.
    """
    if max_batch < 1 or factor < 2:
        raise ValueError(f"need max_batch >= 1 and factor >= 2; got {max_batch}, {factor}")
    top = max_batch if ridge_batch is None else min(max_batch, 2 * ridge_batch)
    batches = [1]
    while batches[-1] < top:
        batches.append(min(batches[-1] * factor, max_batch))

    def cost_s(b: int) -> float:
        return predict_ttft_s(probe, prompt_tokens, count=b) + steps * predict_decode_step_s(probe, b)

    while budget_s is not None and len(batches) > 1 and sum(map(cost_s, batches)) > budget_s:
        batches.pop()
    return batches


def kv_sweep_plan(
    probe: dict,
    weight_bytes: float,
    kv_bytes_per_token: float,
    bandwidth: float,
    max_context: int,
    max_tokens: int,
    max_batch: int,
    n_points: int = 5,
    steps: int = 16,
    budget_s: float | None = None,
    model_config=None,
    multiple: int = 16,
) -> dict:
    """A batch and the contexts at which the KV cache a decode step reads grows to dominate its time.

    Each sequence's decode step reads ``kv_bytes_per_token`` per token of its context, on top of the
    weights read once for the batch. For that to show in the measured TPOT, the KV read must
    reach what the step already costs: the weights, and, where a step is overhead-bound (a small
    model on a GPU: milliseconds for microseconds of bytes), the bytes its whole measured time
    could move at ``bandwidth``. So the target is ``max(weight_bytes, decode_step_s x bandwidth)``
    of KV per step. Each power-of-two batch gets the longest top context it needs (or can
    afford, within ``budget_s``); the plan takes the smallest batch whose top context reaches the
    target, or, when none does, the one whose KV read grows most across the sweep (fewest
    sequences on a tie: a batch so large that the budget leaves it one context measures nothing).

    Args:
        probe: ``probes.probe_speed``'s result (``decode_step_s``, ``prefill_tok_s``, ``overhead_s``).
        bandwidth: bytes/s (the measured ceiling).
        max_context: the longest context a sequence may reach (``max_model_len`` less the decode).
        max_tokens: the KV pool's tokens (batch x context stays within it).
        max_batch: the engine's ``max_num_seqs``.
        n_points: contexts in the sweep: geometric from the top / 16 up to the top, after a short one.
        steps, budget_s, model_config: the rough cost of each point (its prefill,
            ``predict_ttft_s`` with attention when ``model_config`` is given, then ``steps`` decode
            steps of at least bytes / bandwidth) is held to ``budget_s`` by lowering the top context.
        multiple: contexts are rounded to multiples of it (a KV block).
    Returns:
        ``batch_size``, ``contexts`` (ascending), ``target_kv_bytes`` and ``reached``: whether the
        top context's KV read reaches the target (False when capped by the pool, the batch or
        the budget).
    Raises:
        ValueError: sizes below 1 or a non-positive bandwidth.
    """
    if min(max_context, max_tokens, max_batch, n_points, multiple) < 1 or bandwidth <= 0 or kv_bytes_per_token <= 0:
        raise ValueError(
            "need contexts, tokens, batch, points and multiple >= 1 and positive bytes and bandwidth; got "
            f"max_context={max_context}, max_tokens={max_tokens}, max_batch={max_batch}, "
            f"n_points={n_points}, multiple={multiple}, kv_bytes_per_token={kv_bytes_per_token}, "
            f"bandwidth={bandwidth}"
        )
    target = max(weight_bytes, probe["decode_step_s"] * bandwidth)
    need_tokens = math.ceil(target / kv_bytes_per_token)  # batch x context

    def contexts_up_to(hi: float, cap: int) -> list[int]:
        raw = [multiple] + _geometric(hi / 16, hi, n_points - 1) if n_points > 1 else [hi]
        return sorted({min(cap, max(multiple, multiple * round(c / multiple))) for c in raw})

    def cost_s(batch: int, contexts: list[int]) -> float:
        step_s = [
            max(predict_decode_step_s(probe, batch), (weight_bytes + batch * c * kv_bytes_per_token) / bandwidth)
            for c in contexts
        ]
        return sum(predict_ttft_s(probe, c, model_config, batch) + steps * s for c, s in zip(contexts, step_s))

    def plan_for(batch: int) -> list[int]:
        cap = max(multiple, min(max_context, max_tokens // batch) // multiple * multiple)
        top = float(min(cap, math.ceil(need_tokens / batch)))
        while budget_s is not None and top > multiple and cost_s(batch, contexts_up_to(top, cap)) > budget_s:
            top = max(multiple, top * 0.9)
        return contexts_up_to(top, cap)

    def growth(batch: int, contexts: list[int]) -> int:  # KV tokens the sweep adds from its first point to its top
        return batch * (contexts[-1] - contexts[0])

    best_batch, best = 1, plan_for(1)
    batch = 1
    while best_batch * best[-1] < need_tokens and batch < max_batch:
        batch = min(2 * batch, max_batch)
        contexts = plan_for(batch)
        if growth(batch, contexts) > growth(best_batch, best):
            best_batch, best = batch, contexts
    return {
        "batch_size": best_batch,
        "contexts": best,
        "target_kv_bytes": target,
        "reached": best_batch * best[-1] * kv_bytes_per_token >= target,
    }


def prefill_batch_length(
    probe: dict,
    batch_sizes: Sequence[int],
    max_tokens: int,
    min_tokens: int = 256,
    budget_s: float | None = None,
    multiple: int = 16,
) -> dict:
    """One prompt length for a prefill batch sweep (``sum(batch_sizes)`` prompts, each batch in one
    step): past the probe's knee, where one prompt already keeps the device computing.

    The length is the knee or ``min_tokens``, the larger, capped so that the largest batch's
    prompts fit in ``max_tokens`` (the step's token budget and the KV pool's tokens, the smaller)
    and, with ``budget_s``, so that the sweep's predicted time (``predict_ttft_s`` per batch) fits
    it, but never below a knee the probe reached (past it is the experiment's point: a slow
    device overruns the budget instead); a multiple of ``multiple``, at least ``multiple``.

    Returns:
        ``prompt_tokens``; ``past_knee``: whether that length is at or past a knee the probe
        reached; ``why``: None when past it, else why not, in words.
    Raises:
        ValueError: no batch size, a batch size below 1, or ``max_tokens`` under one ``multiple``
            per prompt of the largest batch.
    """
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"batch_sizes={list(batch_sizes)}: one or more batch sizes, each >= 1")
    largest = max(batch_sizes)
    cap = max_tokens // largest // multiple * multiple
    if cap < multiple:
        raise ValueError(f"max_tokens={max_tokens} holds fewer than {multiple} tokens per prompt for {largest} prompts")
    reached = probe.get("knee_reached", False)
    want = max(min_tokens, probe.get("knee_tokens") or 0) if reached else min_tokens
    n = min(cap, max(multiple, math.ceil(want / multiple) * multiple))

    def cost_s(length: int) -> float:
        return sum(predict_ttft_s(probe, length, count=b) for b in batch_sizes)

    floor = min(n, max(multiple, math.ceil(probe["knee_tokens"] / multiple) * multiple) if reached else multiple)
    while budget_s is not None and n - multiple >= floor and cost_s(n) > budget_s:
        n -= multiple
    past = bool(reached and n >= probe["knee_tokens"])
    why = None
    if not reached:
        why = "the probe's prefill tok/s was still growing at its longest prompt: no knee to pass"
    elif not past:
        why = (
            f"{n} tokens, under the probe's knee ({probe['knee_tokens']}): the step's token budget or the KV "
            "pool capped it"
        )
    return {"prompt_tokens": n, "past_knee": past, "why": why}
