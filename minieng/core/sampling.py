"""Turning logits into tokens: greedy, temperature, top-k, top-p, with random numbers keyed per token.

``probabilities`` returns the distribution a token is actually drawn from after temperature,
top-k and top-p; speculative decoding compares the draft's with the target's, so it is a
function of its own.

What a seed promises. A sampled request's token at output position j is drawn with noise that
depends on nothing but (the request's seed, j): never on a random stream shared with other
requests, nor on how many numbers the request drew before. So a seeded request gives the same
tokens whatever its batch-mates, the pool size, chunking, preemption (which recomputes and then
samples position j again with the same noise) or speculative decoding (``wings/speculative/verification.py``:
verification emits exactly these samples). The one caveat is floating point, as for greedy
decoding: a different batch changes the matmul shapes, so p can differ in its last bits, and a
draw that falls within that rounding of a tie between two tokens may flip.

The draw is the exponential race, a form of the Gumbel-max trick (Gumbel 1954; as vLLM's
sampler): with E_i ~ Exp(1) independent, argmax_i p_i / E_i is token i with probability p_i
(E_i / p_i ~ Exp(p_i), and the smallest of independent exponentials is i with probability
p_i / sum p). One draw needs one noise vector, and two distributions raced with the *same*
noise pick the same token as often as they agree, which is what speculative decoding uses.
"""

from __future__ import annotations

import hashlib

import torch

from minieng.config import SamplingParams


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


class KeyedRandom:
    """A request's random numbers, each drawn from a generator seeded by (seed, output position,
    purpose): the same numbers whenever and however often they are drawn.

    Args:
        seed: the request's seed (``SamplingParams.seed``, or one derived from the engine's).
        device: where the numbers are drawn (a CUDA generator draws on the GPU).
    """

    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        self.seed = seed
        self._generator = torch.Generator(device=device)

    def generator(self, position: int, purpose: str = "sample") -> torch.Generator:
        """The generator, reseeded for the draws of ``purpose`` at output position ``position``."""
        digest = hashlib.sha256(f"{self.seed}:{position}:{purpose}".encode()).digest()
        return self._generator.manual_seed(int.from_bytes(digest[:8], "little") >> 1)

    def exponentials(self, position: int, n: int) -> torch.Tensor:
        """E ~ Exp(1), [n] float64: the noise of the token at output position ``position``.

        float64, so that a zero (from a uniform of exactly 0) has odds 2^-53, not 2^-24, per entry.
        """
        gen = self.generator(position)
        u = torch.rand(n, generator=gen, dtype=torch.float64, device=gen.device)
        return -torch.log1p(-u)


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax p / E along the last dim: a draw from ``probs`` given exponential ``noise``.

    Args:
        probs: [..., vocab] probabilities (zeros allowed). noise: the same shape, E ~ Exp(1).
    Returns:
        [...] token ids (long). A token of probability 0 never wins, even against E = 0.
    """
    scores = probs.double() / noise
    return torch.where(probs > 0, scores, -1.0).argmax(dim=-1)


def sample(
    logits: torch.Tensor, params: list[SamplingParams], rngs: list[KeyedRandom | None], positions: list[int]
) -> list[int]:
    """One token per row, with one host sync for the whole step.

    The non-greedy rows that share their temperature, top-k and top-p (a server's usual batch:
    one group) are drawn in one pass (``probabilities`` and ``race`` on their rows together, each
    row with its own noise); the tokens reach the host once, at the end. A row's draw is the same
    whatever rows share its pass: every operation is row by row.

    Args:
        logits: [n, vocab], one row per sequence that samples this step.
        params, rngs: per row; a ``KeyedRandom`` is required for non-greedy rows.
        positions: per row, the output position of the token drawn (its index in the output).
    Returns:
        n token ids.
    """
    tokens = logits.argmax(dim=-1)  # [n]: greedy rows are done; the others are overwritten
    groups: dict[tuple[float, int, float], list[int]] = {}
    for row, p in enumerate(params):
        if not p.greedy:
            groups.setdefault((p.temperature, p.top_k, p.top_p), []).append(row)
    vocab = logits.shape[-1]
    for rows in groups.values():
        noise = torch.stack([rngs[r].exponentials(positions[r], vocab) for r in rows])  # [m, vocab]
        # Host-to-device copies that do not wait for the GPU: torch's blocking copy would synchronize
        # the stream (``memcpy_and_sync``), a host sync per group. The index is staged in pinned
        # memory on CUDA (from pageable memory the driver may still wait); the engine's noise is
        # drawn on the device already.
        index = torch.tensor(rows, pin_memory=logits.is_cuda).to(logits.device, non_blocking=True)
        noise = noise.to(logits.device, non_blocking=True)
        tokens[index] = race(probabilities(logits[index], params[rows[0]]), noise)
    return tokens.tolist()
