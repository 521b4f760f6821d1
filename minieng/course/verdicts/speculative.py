"""Speculative decoding (notebook 09): S8 (one weight read amortized over several tokens) and greedy
speculation's lossless output.
"""

from __future__ import annotations

from minieng.course.claims import verdict
from minieng.course.verdicts.wording import FAILS, HOLDS


def s8_speculative(speedup_x: float, *, tokens_per_step: float, noise) -> str:
    """S8: speculative decoding emits ``tokens_per_step`` > 1 per target step (a count) and, to
    amortize the weight read, a measured speedup over plain decoding above 1."""

    def judge(speedup_x):
        if tokens_per_step <= 1:
            return f"{FAILS}: {tokens_per_step:.2f} tokens per target step, no read amortized"
        if speedup_x <= 1:
            return (
                f"{FAILS}: {tokens_per_step:.2f} tokens per step, but {speedup_x:.2f}x: the draft and verify cost more"
            )
        return f"{HOLDS}: {tokens_per_step:.2f} tokens per step, {speedup_x:.2f}x"

    return verdict(judge, noise, speedup_x=speedup_x)


def greedy_lossless(spec_token_ids: list[int], plain_token_ids: list[int], *, dtype: str) -> str:
    """Beyond the articles (notebook 09): greedy speculative decoding emits the target's own greedy
    tokens (docs/architecture.md section 7: token for token in float32). ``dtype``: the target's; in a coarser
    one the verification's k + 1 rows round differently from a one-token step, so a near-tie may
    break the other way, and the verdict says so. Tokens, not timings: no noise band."""
    if spec_token_ids == plain_token_ids:
        return f"{HOLDS}: all {len(plain_token_ids)} tokens identical"
    first = next((i for i, (a, b) in enumerate(zip(spec_token_ids, plain_token_ids)) if a != b), None)
    first = min(len(spec_token_ids), len(plain_token_ids)) if first is None else first
    if dtype == "float32":
        why = " (in float32 only a near-tie within rounding could excuse it)"
    else:
        why = f" (in {dtype} a k + 1-token verification rounds unlike a one-token step: a near-tie may flip)"
    return f"{FAILS}: the outputs part at token {first} of {len(plain_token_ids)}{why}"
