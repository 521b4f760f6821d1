"""The two phases' costs: S1 (prefill against decode, as measured and as vLLM logs it), S2 (the n²
share of TTFT) and S14 (each phase grows with its own length).
"""

from __future__ import annotations

from minieng.course.claims import TOO_NOISY, verdict
from minieng.course.verdicts.wording import FAILS, HOLDS

# S1: below this ratio the two phases are not two regimes; below 1/ROOFLINE_SHORTFALL_X of the roofline's
# prediction the measurement is not the physics the roofline describes (overhead, a cold run).
REGIME_X = 2.0
ROOFLINE_SHORTFALL_X = 4.0


def s1_physics(prefill_tok_s: float, decode_tok_s: float, *, predicted_ratio: float, noise) -> str:
    """S1, one request's physics: the best prefill tok/s of one request against batch-1 decode tok/s,
    judged against the ratio the roofline predicts for this device (``predicted_ratio``: the prefill
    floor's tok/s over the decode floor's, ``measure.roofline.phase_ratio_floor``). Holds when the
    measured ratio is at least ``REGIME_X`` and within ``ROOFLINE_SHORTFALL_X`` of the prediction."""

    def judge(prefill_tok_s, decode_tok_s):
        ratio = prefill_tok_s / decode_tok_s
        if ratio < REGIME_X:
            return f"{FAILS}: prefill only {ratio:.1f}x batch-1 decode, one regime"
        if ratio < predicted_ratio / ROOFLINE_SHORTFALL_X:
            return (
                f"{FAILS}: {ratio:.0f}x, under a quarter of the {predicted_ratio:.0f}x the roofline predicts here "
                "(a phase far from its floor: overhead)"
            )
        return f"{HOLDS}: {ratio:.0f}x here, the roofline predicts {predicted_ratio:.0f}x for this device"

    return verdict(judge, noise, prefill_tok_s=prefill_tok_s, decode_tok_s=decode_tok_s)


# S1 as vLLM logs it: a logged ratio that moves by at least this factor with the load is a property of it.
LOAD_MOVES_X = 2.0


def s1_logged_ratio(logged_ratios: list[float], *, noise) -> str:
    """S1 as vLLM's log reads it: ``logged_ratios`` are the logged prompt / generation throughput of
    the same engine under different loads (cache-hit share, running requests). The article's 136x is
    a property of the load when the ratio moves by ``LOAD_MOVES_X`` or more across them."""
    if len(logged_ratios) < 2:
        raise ValueError("s1_logged_ratio: give the logged ratio of at least two loads")

    def judge(logged_ratios):
        low, high = min(logged_ratios), max(logged_ratios)
        if high < LOAD_MOVES_X * low:
            return f"{FAILS}: the logged ratio stayed within {high / low:.1f}x across the loads"
        return f"{HOLDS}: the same engine logged {low:.0f}x to {high:.0f}x: the ratio follows the load"

    return verdict(judge, noise, logged_ratios=list(logged_ratios)[:12])


# S2: the fit must find an n^2 share of TTFT at least this fraction of attention's FLOP share.
QUADRATIC_FOUND = 1 / 3
ATTENTION_SMALL = 0.10  # below this FLOP share, the n^2 term is too small for a fit to be asked for


def s2_quadratic(
    quadratic_share: float | None,
    *,
    attention_share: float,
    prompt_tokens: int,
    noise,
    unphysical_fit: str | None = None,
) -> str:
    """S2: the fitted n² share of TTFT at the longest prompt (``fit_ttft``'s ``quadratic_share``; None
    or 0 when the fit found no significant n² term) against attention's share of that prefill's
    FLOPs (``prefill_work``: 4·heads·head_dim per key per layer, docs/architecture.md section 4). Fails when the
    formula says attention takes a real share (``ATTENTION_SMALL`` or more) and the timings find
    less than ``QUADRATIC_FOUND`` of it. ``unphysical_fit``: ``fit_ttft``'s reason when its fit bent
    up only with a negative cost (``physical`` False): the timings cannot judge the claim."""
    if unphysical_fit:
        return f"{TOO_NOISY}: {unphysical_fit}"

    def judge(quadratic_share):
        share = quadratic_share or 0.0
        if attention_share < ATTENTION_SMALL:
            return (
                f"{HOLDS} (linear regime): attention is {100 * attention_share:.0f}% of the FLOPs at "
                f"{prompt_tokens:,} tokens; the n² share of TTFT is {100 * share:.0f}%: long context not reached"
            )
        if share < QUADRATIC_FOUND * attention_share:
            return (
                f"{FAILS}: the formula puts attention at {100 * attention_share:.0f}% of the FLOPs at "
                f"{prompt_tokens:,} tokens, the timings find an n² share of {100 * share:.0f}%"
            )
        return (
            f"{HOLDS}: n² is {100 * share:.0f}% of TTFT at {prompt_tokens:,} tokens, attention "
            f"{100 * attention_share:.0f}% of the FLOPs"
        )

    return verdict(judge, noise, quadratic_share=quadratic_share or 0.0)


# S14: a phase's time must grow this much more with its own length than the other phase's does.
OWN_LENGTH_X = 2.0


def s14_slopes(
    ttft_short_s: float,
    ttft_long_prompt_s: float,
    ttft_long_output_s: float,
    decode_short_s: float,
    decode_long_prompt_s: float,
    decode_long_output_s: float,
    *,
    noise,
) -> str:
    """S14: three requests, (short prompt, short answer), (long prompt, short answer), (short
    prompt, long answer), each timed as TTFT and decode time (E2EL - TTFT). Growing the prompt must
    grow TTFT at least ``OWN_LENGTH_X`` times, and ``OWN_LENGTH_X`` times more (as a ratio) than it
    grows the decode time; growing the answer must do the same for the decode time against TTFT."""

    def judge(
        ttft_short_s, ttft_long_prompt_s, ttft_long_output_s, decode_short_s, decode_long_prompt_s, decode_long_output_s
    ):
        prompt_ttft, prompt_decode = ttft_long_prompt_s / ttft_short_s, decode_long_prompt_s / decode_short_s
        output_decode, output_ttft = decode_long_output_s / decode_short_s, ttft_long_output_s / ttft_short_s
        said = (
            f"longer prompt: TTFT x{prompt_ttft:.1f}, decode x{prompt_decode:.1f}; "
            f"longer answer: decode x{output_decode:.1f}, TTFT x{output_ttft:.1f}"
        )
        own = min(prompt_ttft, output_decode) >= OWN_LENGTH_X  # each phase grew with its own length
        if own and prompt_ttft >= OWN_LENGTH_X * prompt_decode and output_decode >= OWN_LENGTH_X * output_ttft:
            return f"{HOLDS}: {said}"
        return f"{FAILS}: {said}"

    return verdict(
        judge,
        noise,
        ttft_short_s=ttft_short_s,
        ttft_long_prompt_s=ttft_long_prompt_s,
        ttft_long_output_s=ttft_long_output_s,
        decode_short_s=decode_short_s,
        decode_long_prompt_s=decode_long_prompt_s,
        decode_long_output_s=decode_long_output_s,
    )
