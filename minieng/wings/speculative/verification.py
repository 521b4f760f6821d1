"""Verifying draft tokens: the acceptance rules of speculative decoding, greedy and sampled.

Greedy: accept while the target's argmax equals the draft token, then emit the target's argmax.

Sampled, two rules. Both emit tokens distributed exactly as the target's own sampling.

- ``verify_coupled``, the rule the engine runs. Each output position j has its request's keyed
  noise E_j (``sampling.KeyedRandom``), and the target's token there is the race
  argmax p_j / E_j, the very draw plain sampling makes. The draft proposed argmax q_j / E_j with
  the same noise (prompt lookup proposes a fixed token). Verification is then greedy verification
  against the target's draws: accept while the draft equals it, emit it at the first mismatch,
  and after k accepted drafts emit the bonus draw at position k + 1. Every emitted token is the
  one non-speculative sampling would have drawn at that position, so a seeded request's output
  does not depend on whether, or how many, drafts were proposed (which memory pressure, batch
  size and preemption change): speculation changes the speed, never the tokens.
- ``verify_sampled``, the rejection rule of Leviathan et al. 2023 (Fast Inference from
  Transformers via Speculative Decoding, algorithm 1) and Chen et al. 2023 (Accelerating LLM
  Decoding with Speculative Sampling, algorithm 2): the draft drew x_i ~ q_i; accept x_i with
  probability min(1, p_i(x_i) / q_i(x_i)), in order, stopping at the first rejection; there,
  emit a token drawn from normalize(max(0, p_i - q_i)) instead; if all k pass, emit a bonus
  token drawn from p_{k+1}. The emitted tokens follow the target's law (Leviathan et al.,
  appendix A.1), and the acceptance probability, sum_x min(p, q) = 1 - TV(p, q), is the highest
  any rule can reach. But which token it emits at a position depends on whether a draft was
  proposed there, so the output of a seeded request would change with the schedule; the engine
  does not run it. It stays here, with its statistical tests (docs/architecture.md, Speculative decoding), as the
  textbook rule.

The price of coupling: a draft model's proposal is accepted with probability
P(argmax q / E = argmax p / E), at most the 1 - TV(p, q) of the rejection rule (equal to it when
q is one-hot, as for prompt lookup, where both accept x with probability p(x)). Greedy requests
are unaffected: both sampled rules reduce to the greedy one when p is one-hot.
"""

from __future__ import annotations

import torch

from minieng.core.sampling import race


def verify_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> list[int]:
    """Greedy verification of one sequence.

    Args:
        draft_tokens: the k proposed tokens.
        target_logits: [k + 1, vocab], the target's logits at the positions predicting each draft
            token and the one after the last.
    Returns:
        the emitted tokens: the accepted drafts, then the target's own token (1 to k + 1 tokens).
    """
    return accept_matching(draft_tokens, target_logits.argmax(dim=-1).tolist())


def accept_matching(draft_tokens: list[int], target_tokens: list[int]) -> list[int]:
    """The drafts while each equals the target's token at its position, then the target's token
    at the first mismatch (or its bonus token after k matches). ``target_tokens``: k + 1 ids."""
    out = []
    for i, token in enumerate(draft_tokens):
        if token != target_tokens[i]:
            break
        out.append(token)
    out.append(target_tokens[len(out)])
    return out


def verify_coupled(draft_tokens: list[int], target_probs: torch.Tensor, noise: torch.Tensor) -> list[int]:
    """Coupled verification of one sequence: the emitted tokens are the target's own keyed draws.

    Args:
        draft_tokens: the k proposed tokens (for a draft model: argmax q_i / E_i, same noise).
        target_probs: [k + 1, vocab], p_i after temperature / top-k / top-p.
        noise: [k + 1, vocab], E_i ~ Exp(1): the request's keyed noise of each output position.
    Returns:
        the emitted tokens (1 to k + 1): the accepted drafts, then the target's draw.
    """
    return accept_matching(draft_tokens, race(target_probs, noise).tolist())
