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

``float_noise_amplification`` measures what W8A8's rounding does to float noise: a nudge of the
input embeddings by a relative epsilon (1e-6 in float32: a few units in the last place) against
the logits it moves and the greedy choices it flips (``noise_sensitivity``), and the same requests'
greedy tokens run together and alone (``batched_vs_alone``). A float model moves its logits by
about as much as the nudge; W8A8 rounds every activation to a step of max|x| / 127 of its row, and
a value that sat within the nudge of a rounding boundary jumps a whole step: a last-bit
difference (the one batching, chunking or a compiler's rounding makes) becomes a visible one.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch
import torch.nn.functional as F

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.core.model_runner import throwaway_forward
from minieng.lab.probes import estimate_s
from minieng.measure.workloads import text_prompts
from minieng.wings.quantization.quantization import DEFAULT_GROUP_SIZE, quantize_model
from minieng.units import cdiv


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


# -- float noise through quantization -------------------------------------------------------------

FLOAT32_NUDGE = 1e-6  # relative: about eight units in float32's last place (finfo.eps 1.19e-7)


def nudge_epsilon(dtype: torch.dtype) -> float:
    """The relative nudge for a model in ``dtype``: ``FLOAT32_NUDGE`` in float32; in a coarser
    float (bfloat16, float16), a unit in its last place (``finfo(dtype).eps``): the smallest nudge
    that survives the dtype's own rounding, the size of the differences batching makes there."""
    return FLOAT32_NUDGE if dtype == torch.float32 else torch.finfo(dtype).eps


@torch.inference_mode()
def nudged_logits(model, token_ids: list[int], epsilon: float, seed: int = 0) -> torch.Tensor:
    """``sequence_logits`` with every input embedding x multiplied by (1 + epsilon z), element by
    element, z ~ N(0, 1) drawn from ``seed`` (the same z for every model of the same width):
    [len(token_ids), vocab] float32. ``epsilon`` 0 gives ``sequence_logits`` exactly."""
    gen = torch.Generator().manual_seed(seed)

    def nudge(_module, _args, out):
        z = torch.randn(out.shape, generator=gen, dtype=torch.float32).to(out.device)
        return (out.float() * (1 + epsilon * z)).to(out.dtype)

    handle = model.embed_tokens.register_forward_hook(nudge)
    try:
        return sequence_logits(model, token_ids)
    finally:
        handle.remove()


def noise_sensitivity(
    models: dict, token_ids: list[int], prompt_len: int, epsilon: float, seed: int = 0
) -> dict[str, dict]:
    """How far a relative ``epsilon`` nudge of the input embeddings (``nudged_logits``) moves each
    of ``models``' (label -> model) next-token logits over the positions after ``prompt_len`` of
    ``token_ids`` (a real sequence: ``reference_sequences``), each model against itself.

    Returns, per label: ``max_dlogit`` (the largest |logit change| over those positions and the
    whole vocabulary, in logits), ``dlogit_per_position`` (the largest at each position, a list
    of ``positions`` floats), ``flips`` (positions whose greedy argmax changed),
    ``positions``, ``max_logit`` (the largest |logit| unnudged: the scale of the change) and
    ``epsilon``. Raises ``ValueError`` when no position follows ``prompt_len``.
    """
    if not 1 <= prompt_len < len(token_ids):
        raise ValueError(f"prompt_len {prompt_len}: the sequence has {len(token_ids)} tokens, none after it")
    out = {}
    for label, model in models.items():
        base = sequence_logits(model, token_ids)[prompt_len - 1 : -1].float()
        moved = nudged_logits(model, token_ids, epsilon, seed)[prompt_len - 1 : -1].float()
        shift = (moved - base).abs().amax(-1)  # [positions]
        out[label] = {
            "max_dlogit": shift.max().item(),
            "dlogit_per_position": shift.tolist(),
            "flips": int((moved.argmax(-1) != base.argmax(-1)).sum().item()),
            "positions": len(base),
            "max_logit": base.abs().max().item(),
            "epsilon": epsilon,
        }
    return out


def staggered_prompts(tokenizer, count: int, shortest: int = 16, step: int = 6) -> list[list[int]]:
    """``count`` prompts cut from real text (``workloads.text_prompts``), of ``shortest``,
    ``shortest + step``, ... tokens: run together under a small step budget, prompts of different
    lengths are prefilled in chunks whose boundaries differ from their runs alone."""
    longest = shortest + step * (count - 1)
    return [p[: shortest + step * i] for i, p in enumerate(text_prompts(tokenizer, longest, count))]


def estimate_amplification_s(
    probe: dict, sequence_len: int, models: int, prompt_lens: list[int], output_tokens: int, batched_schemes: int
) -> float:
    """Rough seconds of ``float_noise_amplification`` from ``probe_speed`` (the float model's speed:
    an upper bound for the quantized ones): two forwards of the sequence per model, then per
    scheme of ``batched_schemes`` the prompts together and each alone."""
    nudge = estimate_s(probe, 2 * models * sequence_len, prefills=2 * models)
    together = estimate_s(probe, sum(prompt_lens), output_tokens, prefills=1) * (1 + len(prompt_lens) / 16)
    alone = estimate_s(probe, sum(prompt_lens), len(prompt_lens) * output_tokens, prefills=len(prompt_lens))
    return nudge + batched_schemes * (together + alone)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first output position where two token lists differ (the shorter one's length when one
    is a prefix of the other), or None when they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def batched_vs_alone(
    engine: LLMEngine,
    prompts: list[list[int]],
    output_tokens: int,
    schemes: list[str],
    token_budget: int = 32,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> dict[str, dict]:
    """Greedy tokens of ``prompts`` run together and each alone, per scheme (``"none"``: the float
    model), in engines sharing ``engine``'s loaded weights and settings, with a step budget of
    ``token_budget`` tokens: prompts longer than it are prefilled in chunks, beside the decodes of
    the others (as a server runs them), so a request's tokens go through other shapes and chunk
    boundaries together than alone. Give prompts of different lengths.

    Returns, per scheme: ``requests``, ``differ`` (requests whose tokens differ), ``first_difference``
    (per request, the first output position that differs, or None), ``mixed_steps`` (steps of the
    run together that carried prefill tokens and decodes) and ``output_tokens``.
    Raises ``ValueError`` for a scheme this device cannot run (``quantization.check_supported``).
    """
    longest = max(len(p) for p in prompts) + output_tokens
    fields = dict(
        enable_prefix_caching=False,
        enable_chunked_prefill=True,
        batching="continuous",
        max_num_batched_tokens=max(token_budget, len(prompts)),
        max_num_seqs=len(prompts),
        max_model_len=longest,
        num_kv_blocks=len(prompts) * cdiv(longest, engine.config.block_size) + 1,
        speculative_method=None,
        num_speculative_tokens=0,
        draft_quantization=None,
    )
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    out = {}
    for scheme in schemes:
        quantization = None if scheme == "none" else scheme
        config = replace(engine.config, quantization=quantization, quantization_group_size=group_size, **fields)
        e = LLMEngine(config, loaded=engine.loaded)
        first_step = len(e.step_records)
        together = [o.token_ids for o in e.generate(prompts, params)]
        mixed = sum(1 for r in e.step_records[first_step:] if r.num_prefill_tokens and r.num_decode_seqs)
        alone = [e.generate([p], params)[0].token_ids for p in prompts]
        firsts = [first_difference(t, a) for t, a in zip(together, alone)]
        out[scheme] = {
            "requests": len(prompts),
            "differ": sum(f is not None for f in firsts),
            "first_difference": firsts,
            "mixed_steps": mixed,
            "output_tokens": output_tokens,
        }
    return out


def float_noise_amplification(
    engine: LLMEngine,
    sequence: list[int],
    prompt_len: int,
    prompts: list[list[int]],
    output_tokens: int,
    schemes: list[str],
    batched_schemes: list[str] | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    token_budget: int = 32,
    epsilon: float | None = None,
) -> dict:
    """The whole measurement, as JSON: ``noise_sensitivity`` of the float model (``"none"``) and of
    each of ``schemes`` (quantized copies of ``engine.model``, this device's kernels) on
    ``sequence``, and ``batched_vs_alone`` for ``batched_schemes`` (default: ``"none"`` and the
    last of ``schemes``) on ``prompts``. ``epsilon`` None: ``nudge_epsilon`` of the model's dtype.

    Returns ``{"dtype", "epsilon", "nudge": {label: ...}, "batched": {scheme: ...}, "token_budget"}``.
    """
    eps = nudge_epsilon(engine.dtype) if epsilon is None else epsilon
    models = {"none": engine.model} | {s: quantize_model(engine.model, s, group_size) for s in schemes}
    batched_schemes = ["none", *schemes[-1:]] if batched_schemes is None else batched_schemes
    return {
        "dtype": str(engine.dtype).removeprefix("torch."),
        "epsilon": eps,
        "nudge": noise_sensitivity(models, sequence, prompt_len, eps),
        "batched": batched_vs_alone(engine, prompts, output_tokens, batched_schemes, token_budget, group_size),
        "token_budget": token_budget,
    }


def format_amplification(result: dict) -> list[str]:
    """``float_noise_amplification``'s result as lines: the nudge's effect per model, then the
    batched-vs-alone comparison per scheme."""
    name = {"none": f"float ({result['dtype']})"}
    lines = [f"a relative {result['epsilon']:.0e} nudge to the input embeddings:"]
    for label, r in result["nudge"].items():
        lines.append(
            f"  {name.get(label, label):>16}: logits move up to {r['max_dlogit']:.2g} (largest |logit| "
            f"{r['max_logit']:.0f}); greedy choice flipped at {r['flips']} of {r['positions']} positions"
        )
    lines.append(f"the same requests together (a {result['token_budget']}-token step budget) and each alone:")
    for scheme, r in result["batched"].items():
        where = [f for f in r["first_difference"] if f is not None]
        lines.append(
            f"  {name.get(scheme, scheme):>16}: {r['differ']} of {r['requests']} requests' greedy tokens differ"
            + (f" (first at output token {', '.join(map(str, where))})" if where else "")
            + f"; {r['mixed_steps']} step{'s' if r['mixed_steps'] != 1 else ''} mixed prefill chunks with decodes"
        )
    return lines
