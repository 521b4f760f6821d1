"""Turning logits into tokens: greedy, temperature, top-k, top-p, each request with its own generator.

``probabilities`` returns the distribution a token is actually drawn from after temperature,
top-k and top-p; speculative decoding needs exactly that distribution (the q of its acceptance
rule), so it is a function of its own.
"""

from __future__ import annotations

import torch

from .config import SamplingParams


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution of one position.

    Args:
        logits: [vocab] or [n, vocab], any float dtype (computed in float32).
        params: a non-greedy request (greedy has no distribution to sample from).
    Returns:
        Probabilities of the same shape, summing to 1 along the last dim, zero outside top-k/top-p.
    Top-p keeps the smallest prefix of the sorted distribution whose mass reaches top_p
    (Holtzman et al. 2020, section 3.1): a token is kept while the mass of the tokens before it
    is strictly below top_p, so the most likely token is always kept, and at an exact boundary
    (0.5 + 0.3 with top_p=0.8) the next token is not.
    """
    assert not params.greedy, "greedy requests have no sampling distribution"
    # float32 whatever the model's dtype: a bfloat16 cumsum (8-bit mantissa) over a large
    # vocabulary would misplace the top-p boundary by whole tokens.
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # A token stays while the mass strictly before it is below top_p: once the kept tokens
        # reach top_p, nothing more is needed. That mass is the exclusive cumsum (the cumsum
        # shifted right by one), not cumsum - p: the subtraction rounds (0.8 - 0.1 gave
        # 0.79999995 < 0.8 in float32 and kept a token too many at an exact boundary).
        mass_before = torch.nn.functional.pad(sorted_probs.cumsum(dim=-1)[..., :-1], (1, 0))
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """One token per row.

    Args:
        logits: [n, vocab] float32, one row per sequence that samples this step.
        params, generators: per row; a generator is required for non-greedy rows.
    Returns:
        n token ids.
    """
    tokens = logits.argmax(dim=-1).tolist()  # greedy rows are done; others are overwritten
    for row, (p, gen) in enumerate(zip(params, generators)):
        if not p.greedy:
            probs = probabilities(logits[row], p)
            tokens[row] = int(torch.multinomial(probs, 1, generator=gen).item())
    return tokens
