"""What a quantization scheme costs in accuracy, measured against the unquantized model.

The unquantized model writes ``new_tokens`` greedy tokens after each prompt. Each scheme then
reads the same prompt and tokens (teacher forcing: every position sees the reference's history,
so one early difference does not derail the rest) and, at each of the ``new_tokens``
positions, we compare:

- greedy agreement: its argmax against the reference's (the fraction of positions that agree);
- KL(p_ref || p_q): how far its next-token distribution is from the reference's, in nats,
  averaged over positions (0 when identical; Kullback & Leibler 1951).

Prompts are real text (``workloads.text_prompts``) and held out by construction: no scheme is
calibrated on anything (a weight's scale comes from its own row or group, an activation's from
its own token). ``activation_outliers`` shows why W8A8 needs per-token scales: within one
layer's input, a few tokens' largest values stand far above the rest.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from minieng.config import SamplingParams
from minieng.engine.memory_plan import throwaway_forward


@torch.inference_mode()
def sequence_logits(model, token_ids: list[int]) -> torch.Tensor:
    """The model's next-token logits after every prefix of ``token_ids``: [len, vocab] float32,
    from one forward pass over a throwaway KV cache (row i predicts token i + 1)."""
    device = next(model.parameters()).device
    n = len(token_ids)
    return throwaway_forward(model, torch.tensor(token_ids, device=device), torch.arange(n, device=device))[0]


def reference_sequences(engine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Each prompt followed by ``new_tokens`` greedy tokens of ``engine`` (the unquantized model)."""
    outs = engine.generate(prompts, SamplingParams.fixed_length(new_tokens))
    return [p + o.token_ids for p, o in zip(prompts, outs)]


def quality(reference_model, models: dict, sequences: list[list[int]], prompt_len: int) -> dict[str, dict]:
    """Greedy agreement and mean KL(p_ref || p_q) of each of ``models`` (label -> model) against
    ``reference_model`` over the positions after ``prompt_len`` of every sequence
    (``reference_sequences``).

    Returns, per label, a JSON-serializable dict: ``agreement`` (fraction, all positions pooled),
    ``agreement_min`` (the worst sequence's), ``kl_nats`` (mean over positions), ``positions``.
    """
    out = {label: {"agree": 0, "kl": 0.0, "worst": 1.0} for label in models}
    positions = 0
    for seq in sequences:
        ref = sequence_logits(reference_model, seq)[prompt_len - 1 : -1].float().log_softmax(-1)
        positions += len(ref)
        for label, model in models.items():
            got = sequence_logits(model, seq)[prompt_len - 1 : -1].float().log_softmax(-1)
            same = (ref.argmax(-1) == got.argmax(-1)).sum().item()
            acc = out[label]
            acc["agree"] += same
            acc["worst"] = min(acc["worst"], same / len(ref))
            acc["kl"] += F.kl_div(got, ref, log_target=True, reduction="sum").item()
    return {
        label: {
            "agreement": a["agree"] / positions,
            "agreement_min": a["worst"],
            "kl_nats": a["kl"] / positions,
            "positions": positions,
        }
        for label, a in out.items()
    }


@torch.inference_mode()
def activation_outliers(model, token_ids: list[int], layer: int, projection: str = "down_proj") -> dict:
    """The input of one linear layer (``layers[layer].mlp.down_proj`` or ``.self_attn.o_proj``,
    ``qkv_proj``, ``gate_up_proj``) over a real sequence: per token, max|x|; and what 8-bit codes
    (127 levels a side) leave each token with under one scale per tensor against one per token.

    Returns ``token_max`` (per token), ``tensor_max``, ``median_token_max``, and
    ``median_levels_per_tensor``: the levels the median token's largest value gets when the
    scale is the tensor's max / 127 (per token it is always 127).
    """
    block = model.layers[layer]
    module = getattr(block.mlp, projection, None) or getattr(block.self_attn, projection)
    seen = []
    handle = module.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().float()))
    try:
        sequence_logits(model, token_ids)
    finally:
        handle.remove()
    token_max = seen[0].abs().amax(-1)  # [tokens]
    tensor_max = token_max.max().item()
    median = statistics.median(token_max.tolist())
    return {
        "layer": layer,
        "projection": projection,
        "token_max": token_max.tolist(),
        "tensor_max": tensor_max,
        "median_token_max": median,
        "median_levels_per_tensor": 127 * median / tensor_max,
    }
