"""The speculative-decoding experiment: acceptance, tokens per step, cost ratios and speedup against k.

One engine with a drafter runs the same greedy requests for every k (k = 0 is plain decoding,
the baseline), so the ratios are measured in one run. Per k it reports:

- acceptance rate a (accepted / proposed drafts) and mean acceptance length (tokens per step);
- the expected tokens per step from a alone, (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023,
  eq. 1), beside the measured one;
- c = draft time per draft token / a plain target step, and v = the target's part of a
  verification step (k + 1 tokens) / a plain target step;
- the predicted speedup E / (k c + v) and the measured one, TPOT(k = 0) / TPOT(k).

On a memory-bound GPU v stays near 1 (reading the weights costs the same for 1 or k + 1 tokens);
on a CPU the jump from 1 to 2 tokens is in the matmuls, and v grows with k.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.model.loader import LoadedModel
from minieng.wings.quantization.quantization import DEFAULT_GROUP_SIZE, matmul_bytes, model_quantization
from minieng.measure.metrics import acceptance_metrics, request_metrics
from minieng.measure.workloads import text_prompts


def step_weight_bytes(model) -> float:
    """The weight bytes a batch-1 decode step of ``model`` reads: every matrix once (the decoder
    layers' and the LM head's; integer codes and scales for a quantized model, ``matmul_bytes``),
    the embedding lookup one row, nothing."""
    scheme, group_size = model_quantization(model) or (None, None)
    dtype_bytes = model.embed_tokens.weight.element_size()
    read = matmul_bytes(model.config, scheme, group_size or DEFAULT_GROUP_SIZE, dtype_bytes)
    return read.layers + read.lm_head


def draft_alone_engine(engine: LLMEngine, kv_cache_memory_gib: float = 0.5) -> LLMEngine:
    """An engine of the draft model alone, sharing the speculative ``engine``'s drafter weights and
    tokenizer (a small KV pool: one request, beside the first engine's pool on a GPU)."""
    loaded = engine.loaded
    draft = LoadedModel(engine.drafter.model, engine.tokenizer, loaded.hf_config, loaded.eos_token_ids, None)
    return LLMEngine(loaded=draft, enable_prefix_caching=False, kv_cache_memory_gib=kv_cache_memory_gib)


def expected_tokens_per_step(a: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): tokens per verification with i.i.d. acceptance ``a`` (k + 1 at a = 1)."""
    return k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def run_k(engine: LLMEngine, prompts: list[list[int]], k: int, output_tokens: int) -> dict:
    """One run of ``prompts`` together at ``k`` draft tokens (greedy); its figures. The engine's k is
    put back afterwards."""
    first_step, first_spec = len(engine.step_records), len(engine.spec_records)
    with engine.reconfigured(num_speculative_tokens=k):
        outs = engine.generate(prompts, SamplingParams.fixed_length(output_tokens))
    steps = [s for s in engine.step_records[first_step:] if s.num_prefill_tokens == 0]
    spec = engine.spec_records[first_spec:]
    ms = [request_metrics(o) for o in outs]
    row = {
        "k": k,
        "batch_size": len(prompts),
        "tpot_ms": 1e3 * statistics.median(m.tpot_s for m in ms),
        "target_step_ms": 1e3 * statistics.median(s.duration_s - s.draft_s for s in steps),
        "draft_step_ms": 1e3 * statistics.median(s.draft_s for s in steps),
        "tokens_per_step": sum(o.output_tokens - 1 for o in ms) / max(1, sum(s.num_decode_seqs for s in steps)),
    }
    if spec:
        acc = acceptance_metrics([r[3] for r in spec], [r[2] for r in spec])
        row |= {
            "acceptance_rate": acc.acceptance_rate,
            "mean_acceptance_length": acc.mean_acceptance_length,
            "acceptance_per_position": acc.acceptance_rate_per_position,
            "expected_tokens_per_step": expected_tokens_per_step(acc.acceptance_rate, k),
        }
    return row


def k_sweep(
    engine: LLMEngine, prompts: list[list[int]], ks=(1, 2, 4, 8), output_tokens: int = 64, progress=None
) -> dict:
    """Baseline (k = 0) then every k; adds c, v and the predicted and measured speedups."""
    base = run_k(engine, prompts, 0, output_tokens)
    rows = []
    for k in ks:
        if progress:
            progress(f"speculative decoding: k = {k}")
        row = run_k(engine, prompts, k, output_tokens)
        row["c"] = row["draft_step_ms"] / k / base["target_step_ms"]
        row["v"] = row["target_step_ms"] / base["target_step_ms"]
        e = row.get("expected_tokens_per_step", 1.0)
        row["predicted_speedup_x"] = e / (k * row["c"] + row["v"])
        row["measured_speedup_x"] = base["tpot_ms"] / row["tpot_ms"]
        row["break_even_acceptance"] = break_even_acceptance(k, row["c"], row["v"])
        rows.append(row)
    return {"baseline": base, "rows": rows}


def speculative_batch_sweep(
    engine: LLMEngine, prompt_sets: list[list[list[int]]], k: int, output_tokens: int = 32, progress=None
) -> list[dict]:
    """Speedup at a fixed ``k`` against batch size: where speculation pays (small, memory-bound
    batches) and where it hurts (large batches, where verifying k + 1 tokens per sequence turns
    decode compute-bound)."""
    rows = []
    for prompts in prompt_sets:
        if progress:
            progress(f"speculative decoding: batch {len(prompts)}, k = {k}")
        base, spec = run_k(engine, prompts, 0, output_tokens), run_k(engine, prompts, k, output_tokens)
        rows.append(
            {
                "batch_size": len(prompts),
                "k": k,
                "tpot_ms": base["tpot_ms"],
                "spec_tpot_ms": spec["tpot_ms"],
                "acceptance_rate": spec.get("acceptance_rate"),
                "v": spec["target_step_ms"] / base["target_step_ms"],
                "measured_speedup_x": base["tpot_ms"] / spec["tpot_ms"],
            }
        )
    return rows


def break_even_acceptance(k: int, c: float, v: float) -> float | None:
    """The acceptance rate at which speculation starts to pay: E(a, k) = k c + v, solved for a
    (None when even a = 1 does not pay: k + 1 <= k c + v)."""
    cost = k * c + v
    if k + 1 <= cost:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):  # E(a, k) increases with a: bisect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_step(mid, k) < cost else (lo, mid)
    return hi


def machinery_overhead(engine: LLMEngine, prompt: list[int], k: int, output_tokens: int = 32) -> dict:
    """What speculation's machinery costs, apart from the draft model.

    - verification vs a plain forward: the target forward of a verification step (the newest
      token + k drafts) against the forward of a plain (k + 1)-token prefill chunk at a similar
      context (the same prompt prefilled with a budget of k + 1 tokens per step);
    - bookkeeping: the share of a verification step that is neither drafting nor the forward pass
      (scheduling, tensors, acceptance, rollback, detokenization).
    """
    params = SamplingParams.fixed_length(output_tokens)
    # Cache off: the plain run must prefill every chunk, not hit the first run's blocks.
    with engine.block_manager.caching(False):
        with engine.reconfigured(num_speculative_tokens=k):
            first = len(engine.step_records)
            engine.generate([prompt], params)
            verify_steps = [s for s in engine.step_records[first:] if s.num_prefill_tokens == 0]
        # One sequence prefilled k + 1 tokens a step (a budget that small needs a cap as small).
        with engine.reconfigured(
            num_speculative_tokens=0, max_num_batched_tokens=k + 1, max_num_seqs=min(engine.config.max_num_seqs, k + 1)
        ):
            first = len(engine.step_records)
            engine.generate([prompt + prompt[:output_tokens]], SamplingParams(temperature=0, max_tokens=1))
            chunk_steps = [s for s in engine.step_records[first:] if s.num_prefill_tokens == k + 1]
    verify_s = statistics.median(s.forward_s for s in verify_steps)
    chunk_s = statistics.median(s.forward_s for s in chunk_steps[len(chunk_steps) // 2 :])  # similar context
    book = statistics.median((s.duration_s - s.draft_s - s.forward_s) / s.duration_s for s in verify_steps)
    return {
        "k": k,
        "verify_forward_ms": 1e3 * verify_s,
        "plain_chunk_forward_ms": 1e3 * chunk_s,
        "verify_over_plain_x": verify_s / chunk_s,
        "bookkeeping_percent": 100 * book,
    }


def speculative_bench(
    engine: LLMEngine,
    method: str,
    draft_model: str | None,
    ks: list[int],
    batch_sizes: list[int],
    batch_k: int,
    output_tokens: int,
    progress=None,
) -> dict:
    """The bench's ``--speculative`` experiment: a second engine sharing ``engine``'s weights, with a
    drafter (``method`` "draft" or "ngram"), then the k sweep over ``ks``, the batch sweep over
    ``batch_sizes`` at ``batch_k`` and the machinery's overhead, on real-text prompts.

    The default drafter on a CPU is the int8 self-draft (the target's own weights quantized); on a
    GPU, pass ``draft_model``. Returns a JSON-serializable dict.
    """
    int8 = method == "draft" and draft_model is None and engine.device.type == "cpu"
    config = replace(
        engine.config,
        speculative_method=method,
        num_speculative_tokens=1,
        draft_model=draft_model,
        draft_quantization="int8" if int8 else None,
        max_num_seqs=max(batch_sizes + [engine.config.max_num_seqs]),
    )
    spec = LLMEngine(config, loaded=engine.loaded)
    name = {"ngram": "prompt lookup"}.get(method, "int8 self-draft" if int8 else f"draft {draft_model}")
    prompts = text_prompts(engine.tokenizer, 64, 1)
    result = {"drafter": name, **k_sweep(spec, prompts, ks, output_tokens, progress=progress)}
    sets = [text_prompts(engine.tokenizer, 64, b) for b in batch_sizes]
    result["batches"] = speculative_batch_sweep(spec, sets, batch_k, output_tokens, progress=progress)
    result["machinery"] = [machinery_overhead(spec, prompts[0], k, output_tokens) for k in ks]
    return result


def format_speculative(result: dict) -> list[str]:
    """The ``--speculative`` section: the k sweep with measured and expected figures, then batches."""
    b = result["baseline"]
    lines = [
        f"Speculative decoding ({result['drafter']}), greedy, batch {b['batch_size']}: "
        f"plain TPOT {b['tpot_ms']:.1f} ms, plain target step {b['target_step_ms']:.1f} ms",
        f"  {'k':>2} {'accept':>7} {'tok/step':>8} {'expected':>8} {'c':>6} {'v':>6} {'predicted':>9} "
        f"{'measured':>9} {'break-even a':>12}",
    ]
    for r in result["rows"]:
        be = r["break_even_acceptance"]
        lines.append(
            f"  {r['k']:>2} {r.get('acceptance_rate', 0):>7.2f} {r['tokens_per_step']:>8.2f} "
            f"{r.get('expected_tokens_per_step', 1):>8.2f} {r['c']:>6.2f} {r['v']:>6.2f} "
            f"{r['predicted_speedup_x']:>8.2f}x {r['measured_speedup_x']:>8.2f}x "
            f"{'never' if be is None else f'{be:.2f}':>12}"
        )
    lines.append(
        "  c = draft time per draft token / plain target step; v = target part of a verification step / "
        "plain target step; predicted = E / (k c + v), E = (1 - a^(k+1)) / (1 - a)"
    )
    for m in result.get("machinery", []):
        lines.append(
            f"  machinery at k = {m['k']}: verification forward {m['verify_forward_ms']:.1f} ms vs a plain "
            f"{m['k'] + 1}-token forward {m['plain_chunk_forward_ms']:.1f} ms ({m['verify_over_plain_x']:.2f}x, "
            f"target <= 1.10x); bookkeeping {m['bookkeeping_percent']:.1f}% of the step (target < 5%)"
        )
    for r in result.get("batches", []):
        lines.append(
            f"  batch {r['batch_size']:>3}, k = {r['k']}: TPOT {r['tpot_ms']:.1f} -> {r['spec_tpot_ms']:.1f} ms "
            f"({r['measured_speedup_x']:.2f}x), acceptance {r['acceptance_rate'] or 0:.2f}, v {r['v']:.2f}"
        )
    return lines
