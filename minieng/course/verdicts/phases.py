"""The two phases' costs: S1 (prefill against decode, as measured, and as vLLM logs it: explained by the load), S2 (the n²
share of TTFT) and S14 (each phase grows with its own length).
"""

from __future__ import annotations

from minieng.course.claims import TOO_NOISY, verdict
from minieng.course.verdicts.wording import EXPLAINED, FAILS, HOLDS

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


# S1 as vLLM logs it: each logged ratio must lie within this factor of its load's prompt tokens per output token.
LOGGED_IS_LOAD_X = 1.05


def s1_logged_ratio(logged_ratios: list[float], *, load_ratios: list[float]) -> str:
    """S1 as vLLM's log reads it: ``logged_ratios`` are the logged prompt / generation throughput of
    the same engine under different loads (``lab.logged_ratio.logged_ratios``: one interval over each
    whole run); ``load_ratios`` (counted) each load's prompt tokens per output token (``run_load``'s
    ``load_ratio``), in the same order.

    The verdict is "explained", never "holds": over a whole run the logged prompt tok/s and
    generation tok/s share one interval, so their ratio is the load's prompt tokens per output token,
    set by its parameters (4x to 132x on any machine) whatever either phase's speed; the article's
    136x is its load's (97% of long prompts cached, short answers), and ``s1_physics`` judges the
    speeds. Explained when every logged ratio lies within ``LOGGED_IS_LOAD_X`` of its load's; else
    the load does not explain the log ("does not hold here": it counted other tokens than the
    load's, as an interval that cuts requests does). Counts over one interval: no timing, no noise."""
    if len(load_ratios) != len(logged_ratios) or not logged_ratios:
        raise ValueError("s1_logged_ratio: one load ratio per logged ratio, one load at least")
    off = max(max(g / w, w / g) for g, w in zip(logged_ratios, load_ratios))
    low, high = min(logged_ratios), max(logged_ratios)
    if off > LOGGED_IS_LOAD_X:
        return f"{FAILS}: a logged ratio is {off:.2f}x off its load's prompt tokens per output token"
    return (
        f"{EXPLAINED}: the log read {low:.0f}x to {high:.0f}x, each load's own prompt tokens per output "
        "token: fixed by the load, not by either phase's speed"
    )


# S2: a significant n^2 share of TTFT must lie between QUADRATIC_FOUND and QUADRATIC_EXCESS_X times
# attention's share of the FLOPs; below ATTENTION_SMALL of the FLOPs a fit that finds no n^2 term is
# the linear regime the article describes. The fitted per-token cost may be at most LINEAR_SLOPE_X
# times 2 x parameters / peak (the linear term at 10% of the peak or more) and no less than it.
QUADRATIC_FOUND = 1 / 3
QUADRATIC_EXCESS_X = 3.0
ATTENTION_SMALL = 0.10
LINEAR_SLOPE_X = 10.0


def s2_quadratic(
    quadratic_share: float | None,
    *,
    attention_share: float,
    prompt_tokens: int,
    noise,
    linear_s_per_token: float | None,
    params: float,
    peak_flops: float,
    unphysical_fit: str | None = None,
) -> str:
    """S2: the fitted n² share of TTFT at the longest prompt (``fit_ttft``'s ``quadratic_share``; None
    or 0 when the fit found no significant n² term) against attention's share of that prefill's
    FLOPs (``prefill_work``: 4·heads·head_dim per key per layer).

    Terms, each able to fail: a significant n² share below ``QUADRATIC_FOUND`` of attention's FLOP
    share (the formula's n² term not found) or above ``QUADRATIC_EXCESS_X`` times it (n² costs far
    more than its FLOPs: it held even at 90% of TTFT with attention at 3% before). A fit with no
    significant n² term reads "too noisy" where attention takes ``ATTENTION_SMALL`` or more of the
    FLOPs (the timings cannot see the term), and holds below (the linear regime). The linear term
    (``linear_s_per_token``: ``fit_ttft``'s ``b_s_per_token``, None where it fitted none; ``params``:
    the parameters each prompt token's matmuls use, ``flops_bytes.prefill_params_per_token``;
    ``peak_flops``: FLOP/s, the measured matmul ceiling): the fitted cost per token against
    2 x params / peak fails below it (fewer FLOPs than 2 a parameter, or a ceiling measured low) and
    above ``LINEAR_SLOPE_X`` times it. ``unphysical_fit``: ``fit_ttft``'s reason
    when its fit bent up only with a negative cost (``physical`` False): too noisy."""
    if unphysical_fit:
        return f"{TOO_NOISY}: {unphysical_fit}"
    floor = None if linear_s_per_token is None else 2 * params / peak_flops
    share = quadratic_share or None  # 0 reads as "no significant n² term"
    attention, at = f"{100 * attention_share:.0f}%", f"{prompt_tokens:,} tokens"

    def judge(quadratic_share, linear_s_per_token):
        slope = ""
        if floor is not None:
            x = linear_s_per_token / floor
            if x < 1:
                return f"{FAILS}: the fitted cost per token beats 2·P / peak ({x:.2f}x): a FLOP count or ceiling is off"
            if x > LINEAR_SLOPE_X:
                return f"{FAILS}: the fitted cost per token is {x:.0f}x 2·P / peak: not the parameters' FLOPs"
            slope = f"; the linear cost per token is {x:.1f}x 2·P / peak"
        if quadratic_share is None:
            if attention_share >= ATTENTION_SMALL:
                return f"{TOO_NOISY}: no significant n² term in the fit where attention is {attention} of the FLOPs"
            return f"{HOLDS} (linear regime): attention {attention} of the FLOPs at {at}, no n² term to time" + slope
        said = f"n² is {100 * quadratic_share:.0f}% of TTFT at {at}, attention {attention} of the FLOPs"
        if quadratic_share > QUADRATIC_EXCESS_X * attention_share:
            return f"{FAILS}: {said}: n² costs far more than its FLOPs"
        if quadratic_share < QUADRATIC_FOUND * attention_share:
            return f"{FAILS}: {said}: the timings find less n² than the formula"
        return f"{HOLDS}: {said}{slope}"

    return verdict(judge, noise, quadratic_share=share, linear_s_per_token=linear_s_per_token if floor else None)


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
