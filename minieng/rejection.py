"""Verifying draft tokens: the acceptance rule of speculative decoding, greedy and sampled.

Leviathan et al. 2023 (Fast Inference from Transformers via Speculative Decoding, algorithm 1)
and Chen et al. 2023 (Accelerating LLM Decoding with Speculative Sampling, algorithm 2):

- the draft proposed tokens x_1..x_k, token x_i drawn from its distribution q_i;
- the target scored all k + 1 positions in one forward pass, giving p_1..p_{k+1};
- accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), in order, stopping at the first
  rejection; there, emit a token drawn from normalize(max(0, p_i - q_i)) instead;
- if all k pass, emit a bonus token drawn from p_{k+1}.

The emitted tokens are distributed exactly as if the target had sampled them one by one
(Leviathan et al., appendix A.1). q must be the distribution the draft token was really drawn from
(after temperature, top-k, top-p): ``sampling.probabilities``. Greedy is the limit where p and q
are one-hot: accept while the target's argmax equals the draft token, then emit the argmax.
"""

from __future__ import annotations

import torch


def verify_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> list[int]:
    """Greedy verification of one sequence.

    Args:
        draft_tokens: the k proposed tokens.
        target_logits: [k + 1, vocab], the target's logits at the positions predicting each draft
            token and the one after the last.
    Returns:
        the emitted tokens: the accepted drafts, then the target's own token (1 to k + 1 tokens).
    """
    best = target_logits.argmax(dim=-1).tolist()  # [k + 1]
    out = []
    for i, token in enumerate(draft_tokens):
        if token != best[i]:
            break
        out.append(token)
    out.append(best[len(out)])
    return out


def verify_sampled(draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                   generator: torch.Generator | None) -> list[int]:
    """Rejection-sampling verification of one sequence.

    Args:
        draft_tokens: the k proposed tokens.
        draft_probs: [k, vocab], q_i: the distribution each draft token was drawn from.
        target_probs: [k + 1, vocab], p_i after the same temperature / top-k / top-p.
        generator: the request's generator (uniforms and resamples are drawn from it).
    Returns:
        the emitted tokens (1 to k + 1).
    """
    device = target_probs.device
    out = []
    for i, token in enumerate(draft_tokens):
        p, q = target_probs[i, token], draft_probs[i, token]
        u = torch.rand((), generator=generator, device=device)
        if q > 0 and u * q <= p:  # u <= p / q, without dividing by a tiny q
            out.append(token)
            continue
        residual = torch.clamp(target_probs[i] - draft_probs[i], min=0)
        total = residual.sum()
        # p == q exactly leaves no residual mass; then every token was accepted with prob 1 and we
        # cannot be here, except through float rounding: fall back to p itself.
        dist = residual / total if total > 0 else target_probs[i]
        out.append(int(torch.multinomial(dist, 1, generator=generator).item()))
        return out
    out.append(int(torch.multinomial(target_probs[len(draft_tokens)], 1, generator=generator).item()))
    return out
