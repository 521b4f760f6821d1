"""Notebook 05's KV-cache experiments: generating with and without the cache, a live batch's block
tables, and how many sequences a KV pool holds.

Without a KV cache, every new token needs the keys and values of every token before it, so the
model runs the whole sequence again: token i of an answer to an n-token prompt costs a prefill of
n + i tokens, and m tokens cost n m + m (m - 1) / 2 token-passes, quadratic in m. With the cache,
the prompt is run once and every later token runs alone against the stored K/V: n + m - 1
token-passes, linear. ``recompute_vs_cache`` measures both through the engine itself (the
recompute side is the engine with its prefix cache off, asked for one token at a time with the
growing sequence as the prompt), so the two differ only in what is recomputed.

Time follows the work only where a step's cost follows its tokens: below the prefill knee
(``sweep_plan.prefill_knee``) a prefill step costs its fixed overhead whatever its length, and the
recompute's time then grows linearly though its work grows quadratically.

Pure bookkeeping reads (``block_table_snapshot``) and arithmetic (``sequences_that_fit``) sit
beside the engine drivers; nothing here decides policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.core.outputs import StepRecord
from minieng.measure.flops_bytes import step_work
from minieng.measure.metrics import request_metrics
from minieng.measure.sweep_plan import predict_ttft_s
from minieng.units import cdiv


def _per_token(steps: list[StepRecord], model_config, dtype_bytes: float) -> tuple[list[int], list[float]]:
    """Token-passes and FLOPs per emitted token of one request run alone: the steps up to and
    including each step that sampled (a chunk computing logits) belong to that token."""
    tokens_run, flops = [], []
    run = work = 0.0
    for step in steps:
        run += sum(n for n, _, _ in step.chunks)
        work += step_work(model_config, step.chunks, dtype_bytes).total_flops
        if any(logits for _, _, logits in step.chunks):
            tokens_run.append(int(run))
            flops.append(work)
            run = work = 0.0
    return tokens_run, flops


def recompute_vs_cache(engine: LLMEngine, prompt: Sequence[int], max_tokens: int) -> dict:
    """Generate ``max_tokens`` greedy tokens after ``prompt`` twice: with the KV cache (one
    request, decoded step by step), and without it (each token a fresh one-token request whose
    prompt is the prompt plus the tokens so far, the prefix cache off, so nothing is reused).

    Returns a JSON-serializable dict: per side (``"cache"``, ``"recompute"``) ``token_s`` (the
    wait for each token: the first is TTFT, the rest the gaps after it, s), ``tokens_run``
    (token-passes through the model per token), ``work`` (per token, ``flops_bytes.step_work`` of the
    recorded steps) and ``token_ids``; ``prompt_tokens``; ``same_tokens`` (whether both sides
    generated the same ids; fp32 batching can flip a near-tie, nothing else); and
    ``first_difference`` (the first output position where they differ, or None).
    Raises ``ValueError`` for ``max_tokens`` < 1 or a prompt with no room for them.
    """
    prompt = list(prompt)
    if max_tokens < 1 or len(prompt) + max_tokens > engine.max_model_len:
        raise ValueError(
            f"max_tokens={max_tokens} after a {len(prompt)}-token prompt must be >= 1 and fit "
            f"max_model_len={engine.max_model_len}"
        )
    cfg, dtype_bytes = engine.model_config, engine.dtype.itemsize
    greedy = SamplingParams.fixed_length(max_tokens)
    one = SamplingParams.fixed_length(1)
    sides = {}
    with engine.block_manager.caching(False):
        first = len(engine.step_records)
        out = engine.generate([prompt], greedy)[0]
        m = request_metrics(out)
        run, flops = _per_token(engine.step_records[first:], cfg, dtype_bytes)
        sides["cache"] = {
            "token_s": [m.ttft_s] + m.itl_s,
            "tokens_run": run,
            "flops": flops,
            "token_ids": list(out.token_ids),
        }
        ids, waits, run, flops = [], [], [], []
        for _ in range(max_tokens):
            first = len(engine.step_records)
            out = engine.generate([prompt + ids], one)[0]
            waits.append(request_metrics(out).ttft_s)
            ids.append(out.token_ids[0])
            r, f = _per_token(engine.step_records[first:], cfg, dtype_bytes)
            run += r
            flops += f
        sides["recompute"] = {"token_s": waits, "tokens_run": run, "flops": flops, "token_ids": ids}
    cached_ids = sides["cache"]["token_ids"]
    diff = next((i for i, (a, b) in enumerate(zip(cached_ids, ids)) if a != b), None)
    return {
        "prompt_tokens": len(prompt),
        "max_tokens": max_tokens,
        **sides,
        "same_tokens": diff is None,
        "first_difference": diff,
    }


def recompute_estimate_s(probe: dict, prompt_tokens: int, answer_tokens: int) -> float:
    """Rough seconds of ``recompute_vs_cache`` for an answer of ``answer_tokens``, from
    ``probes.probe_speed``'s result: a prefill of ``prompt_tokens + i`` tokens for token i
    (``sweep_plan.predict_ttft_s``), plus one decode step per token for the cached side."""
    return sum(predict_ttft_s(probe, prompt_tokens + i) + probe["decode_step_s"] for i in range(answer_tokens))


def recompute_budget_tokens(probe: dict, prompt_tokens: int, budget_s: float, max_tokens: int) -> int:
    """The longest answer, at least 2 tokens (``max_tokens`` if that is fewer) and at most
    ``max_tokens``, whose ``recompute_estimate_s`` fits ``budget_s``."""
    spent, m = 0.0, 0
    while m < max_tokens:
        spent += predict_ttft_s(probe, prompt_tokens + m) + probe["decode_step_s"]
        if spent > budget_s and m >= 2:
            break
        m += 1
    return m


def block_table_snapshot(engine: LLMEngine) -> dict:
    """The block manager's state as plain data: per running sequence its id, tokens (known and
    with K/V computed) and ``block_table`` (physical block ids in token order), the waiting
    requests' ids, the pool's size and how many blocks are free."""
    bm = engine.block_manager
    return {
        "block_size": bm.block_size,
        "num_blocks": bm.num_blocks,
        "num_free_blocks": bm.num_free_blocks,
        "sequences": [
            {
                "request_id": s.request_id,
                "num_tokens": s.num_tokens,
                "num_computed_tokens": s.num_computed_tokens,
                "block_table": list(s.block_table),
            }
            for s in engine.scheduler.running
        ],
        "waiting": [s.request_id for s in engine.scheduler.waiting],
    }


def live_block_tables(
    engine: LLMEngine, prompts: Sequence[Sequence[int]], output_tokens: Sequence[int], join_every: int, steps: int
) -> dict:
    """Run a batch that changes while it runs, and take the block tables mid-run.

    Request i (greedy, ``output_tokens[i]`` tokens, ``ignore_eos``) joins at step
    ``i * join_every``; after ``steps`` steps the state is read (``block_table_snapshot``, plus
    ``finished``: the ids done by then, and ``step``), then every request still there is
    aborted. Requests that finish early return their blocks, and later ones take them, so a
    sequence's blocks need not be adjacent: its block table says where its tokens live.
    Raises ``ValueError`` for mismatched lengths or ``join_every`` < 1.
    """
    if len(prompts) != len(output_tokens) or join_every < 1:
        raise ValueError(
            f"need one output length per prompt and join_every >= 1; got {len(prompts)} prompts, "
            f"{len(output_tokens)} lengths, join_every={join_every}"
        )
    ids: list[str] = []
    for step in range(steps):
        if step % join_every == 0 and len(ids) < len(prompts):
            i = len(ids)
            ids.append(engine.add_request(list(prompts[i]), SamplingParams.fixed_length(output_tokens[i])))
        engine.step()
    snapshot = block_table_snapshot(engine) | {"step": steps, "finished": [r for r in ids if engine.output(r).finished]}
    for rid in ids:
        engine.abort_request(rid)
    return snapshot


def sequences_that_fit(num_blocks: int, block_size: int, tokens_per_sequence: int) -> int:
    """How many sequences of ``tokens_per_sequence`` tokens a pool of ``num_blocks`` blocks holds at
    once: each takes whole blocks (``ceil(tokens / block_size)``). Raises ``ValueError`` for
    non-positive sizes."""
    if block_size < 1 or tokens_per_sequence < 1 or num_blocks < 0:
        raise ValueError(
            f"need num_blocks >= 0, block_size >= 1 and tokens_per_sequence >= 1; got "
            f"{num_blocks}, {block_size}, {tokens_per_sequence}"
        )
    return num_blocks // cdiv(tokens_per_sequence, block_size)


def concurrency_run(engine: LLMEngine, prompts: Sequence[Sequence[int]], output_tokens: int) -> dict:
    """Send every prompt at once and watch what the KV pool lets run: per step, the sequences
    running, the blocks in use and the preemptions (``StepRecord``), beside the caps the
    arithmetic predicts. The scheduler admits a request when its *prompt* fits (vLLM does the
    same) and preempts the newest when a growing sequence finds no free block, so the batch
    peaks near the prompt-length cap and settles near the full-length one.

    Returns a JSON-serializable dict: ``running``, ``used_blocks``, ``preempted`` (per step),
    ``num_blocks``, ``block_size``, ``max_num_seqs``, ``cap_at_prompt`` and
    ``cap_at_full_length`` (``sequences_that_fit``), ``peak_running``, ``num_preemptions``.
    """
    bm = engine.block_manager
    params = SamplingParams.fixed_length(output_tokens)
    prompt_tokens = max(len(p) for p in prompts)
    with bm.caching(False):
        first = len(engine.step_records)
        engine.generate([list(p) for p in prompts], params)
        steps = engine.step_records[first:]
    return {
        "running": [s.num_prefill_seqs + s.num_decode_seqs for s in steps],
        "used_blocks": [s.num_used_blocks for s in steps],
        "preempted": [s.num_preempted for s in steps],
        "num_blocks": bm.num_blocks,
        "block_size": bm.block_size,
        "max_num_seqs": engine.config.max_num_seqs,
        "num_requests": len(prompts),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "cap_at_prompt": sequences_that_fit(bm.num_blocks, bm.block_size, prompt_tokens),
        "cap_at_full_length": sequences_that_fit(bm.num_blocks, bm.block_size, prompt_tokens + output_tokens),
        "peak_running": max(s.num_prefill_seqs + s.num_decode_seqs for s in steps),
        "num_preemptions": sum(s.num_preempted for s in steps),
    }


def recompute_work(prompt_tokens: int, answer_tokens: int) -> dict:
    """Token-passes through the model for an answer of ``answer_tokens`` (m) after a prompt of
    ``prompt_tokens`` (n): ``cache`` n + m - 1 (the prompt once, then one token per step);
    ``recompute`` n m + m (m - 1) / 2 (token i re-runs the n + i tokens before it); ``ratio`` of the two.
    Raises ``ValueError`` for n < 1 or m < 1."""
    n, m = prompt_tokens, answer_tokens
    if n < 1 or m < 1:
        raise ValueError(f"need prompt_tokens >= 1 and answer_tokens >= 1; got {n}, {m}")
    cache, recompute = n + m - 1, n * m + m * (m - 1) // 2
    return {"cache": cache, "recompute": recompute, "ratio": recompute / cache}


def recompute_totals(result: dict) -> dict:
    """Per side of ``recompute_vs_cache``'s result, the token-passes, FLOPs and seconds summed over
    its tokens; ``work_x`` and ``time_x``: the recompute's over the cache's."""
    sums = {
        side: {key: sum(result[side][key]) for key in ("tokens_run", "flops", "token_s")}
        for side in ("cache", "recompute")
    }
    return sums | {
        "work_x": sums["recompute"]["tokens_run"] / sums["cache"]["tokens_run"],
        "time_x": sums["recompute"]["token_s"] / sums["cache"]["token_s"],
    }


def format_recompute(result: dict) -> list[str]:
    """``recompute_vs_cache``'s result as a table (token-passes, TFLOP, seconds, first and last
    token's wait, per side), the ratios, and whether both sides wrote the same tokens."""
    t = recompute_totals(result)
    lines = [f"{'':<22} {'token-passes':>13} {'TFLOP':>9} {'time s':>8} {'first token ms':>15} {'last token ms':>14}"]
    for side, label in (("cache", "KV cache"), ("recompute", "no cache (recompute)")):
        waits = result[side]["token_s"]
        lines.append(
            f"{label:<22} {t[side]['tokens_run']:>13,} {t[side]['flops'] / 1e12:>9.3f} {t[side]['token_s']:>8.2f} "
            f"{waits[0] * 1e3:>15.1f} {waits[-1] * 1e3:>14.1f}"
        )
    same = (
        "yes"
        if result["same_tokens"]
        else f"no, from output position {result['first_difference']} (an fp32 near-tie between a prefill and a decode)"
    )
    return lines + [
        f"without the cache: {t['work_x']:.1f}x the token-passes, "
        f"{t['recompute']['flops'] / t['cache']['flops']:.1f}x the FLOPs, {t['time_x']:.1f}x the time",
        f"same tokens both ways: {same}",
    ]


def recompute_why(result: dict, probe: dict) -> str:
    """Why the recompute's time ratio differs from its work ratio, from the prefill knee
    (``probe_speed``): past it a prefill costs time in proportion to its tokens; below it, about a
    step's fixed overhead whatever its length."""
    longest = result["prompt_tokens"] + result["max_tokens"] - 1
    knee = probe["knee_tokens"]
    if probe["knee_reached"] and longest > knee:
        return (
            f"the recomputed prefixes grew past the prefill knee ({knee} tokens): from there each cost time in "
            "proportion to its length, so the time follows the quadratic work"
        )
    where = f"({knee} tokens)" if probe["knee_reached"] else f"(past {knee} tokens)"
    return (
        f"every recomputed prefix (at most {longest} tokens) stayed below the prefill knee {where}: each cost about a "
        "step's fixed overhead whatever its length, so the work grew quadratically and the time only linearly"
    )
