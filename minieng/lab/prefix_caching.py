"""The prefix-cache experiment: how TTFT falls as the shared share of the prompt rises.

Requests share a system prompt of S tokens followed by a distinct user turn of U tokens. The
first request of a group computes the system prompt and leaves its full blocks in the cache; every
later one prefills only what the cache does not hold. Sweeping S / (S + U) at a fixed prompt
length sweeps the hit rate (cached prompt tokens / prompt tokens) from 0 towards 1, and TTFT
follows the tokens left to compute. Requests run one at a time, so TTFT is the prefill itself,
with no queueing in it.

The vLLM panel in "O erro de resumir performance a um número" (Igor Nascimento): 97% hit rate next to 0.87 s TTFT, 85.5% next to 1.72 s.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.core.outputs import StepRecord
from minieng.measure.flops_bytes import prefill_work, step_work
from minieng.measure.metrics import request_metrics, summarize_ms
from minieng.measure.workloads import text_prompts
from minieng.units import cdiv

ARTICLE_POINTS = [(0.97, 0.87), (0.855, 1.72)]  # (hit rate, TTFT s) from the vLLM panel of Nascimento's article


@dataclass
class HitRatePoint:
    """One sweep point: the measured hit rate over the warm requests, their TTFT (ms), and the
    prompt tokens each computed (what the cache left to prefill)."""

    shared_tokens: int
    user_tokens: int
    hit_rate: float
    ttft_ms: dict  # summarize_ms of the warm requests: mean, p50, p90, p95, p99, max, count
    cache: bool
    uncached_tokens: float  # prompt tokens computed per warm request (mean): prompt - cached


def _prompts(engine: LLMEngine, shared: int, user: int, count: int) -> list[list[int]]:
    """``count`` prompts: one shared prefix of ``shared`` tokens, then distinct ``user``-token turns."""
    texts = text_prompts(engine.tokenizer, shared + user, count)
    return [texts[0][:shared] + t[shared:] for t in texts]


def measure_point(engine: LLMEngine, shared: int, user: int, requests: int, cache: bool = True) -> HitRatePoint:
    """TTFT of ``requests`` warm requests sharing ``shared`` tokens, after one that fills the cache.

    The cache is emptied first, so a point never hits what an earlier one left behind;
    ``cache=False`` switches the prefix cache off for this point (the cold baseline).
    """
    with engine.block_manager.caching(cache):
        prompts = _prompts(engine, shared, user, requests + 1)
        params = SamplingParams.fixed_length(1)
        engine.generate([prompts[0]], params)  # the first request computes the shared prefix
        outs = [engine.generate([p], params)[0] for p in prompts[1:]]
    ms = [request_metrics(o) for o in outs]
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    cached = sum(o.num_cached_tokens for o in outs)
    return HitRatePoint(
        shared, user, cached / prompt, summarize_ms(m.ttft_s for m in ms), cache, (prompt - cached) / len(outs)
    )


def ttft_vs_hit_rate(
    engine: LLMEngine,
    prompt_tokens: int = 1024,
    shares=(0.0, 0.01, 0.25, 0.5, 0.75, 0.9, 0.97),
    requests: int = 4,
    progress=None,
) -> dict:
    """Sweep the shared share of a ``prompt_tokens``-token prompt; return cold and warm points.

    The cold point runs the same prompts with the cache off. A share whose shared prefix is shorter
    than one block (the 1% point at 1,024 tokens) shows the block-size floor: no hit at all.
    Returns a JSON-serializable dict: ``prompt_tokens``, ``block_size``, ``cold`` and ``points`` (one
    per share; each ``HitRatePoint``'s fields: ``hit_rate``, ``ttft_ms``, ``uncached_tokens``, ...) and
    the article's points.
    """
    bs = engine.block_manager.block_size
    cold = measure_point(engine, 0, prompt_tokens, requests, cache=False)
    points = []
    for share in shares:
        if progress:
            progress(f"prefix cache: shared share {share:.0%}")
        shared = round(share * prompt_tokens)
        if shared >= bs:  # a whole number of blocks, so the hit rate is the share asked for
            shared = min(cdiv(shared, bs) * bs, prompt_tokens - 1)
        points.append(measure_point(engine, shared, prompt_tokens - shared, requests))
    return {
        "prompt_tokens": prompt_tokens,
        "block_size": engine.block_manager.block_size,
        "cold": asdict(cold),
        "points": [asdict(p) for p in points],
        "article_points": [{"hit_rate": h, "ttft_s": t} for h, t in ARTICLE_POINTS],
    }


def hit_rate_pair(sweep: dict, near_hit_rate: float = ARTICLE_POINTS[1][0]) -> tuple[dict, dict]:
    """The two points of ``ttft_vs_hit_rate``'s sweep that the hit-rate comparison uses, as the
    article's panel does (97% and 85.5%): the highest hit rate measured, and among the lower ones the
    point nearest ``near_hit_rate``. Returns ``(near, high)``, two of ``sweep["points"]``. Raises ``ValueError``
    when the sweep has no two distinct hit rates."""
    high = max(sweep["points"], key=lambda p: p["hit_rate"])
    lower = [p for p in sweep["points"] if p["hit_rate"] < high["hit_rate"]]
    if not lower:
        raise ValueError("hit_rate_pair: the sweep needs two points of different hit rates")
    return min(lower, key=lambda p: abs(p["hit_rate"] - near_hit_rate)), high


def block_floor_verdict(sweep: dict) -> tuple[str, str]:
    """The block-size floor (beyond the articles): a shared prefix shorter than one block is never a
    hit, since only full blocks are shared. Reads ``ttft_vs_hit_rate``'s sweep (hit rates are counts:
    no noise). Returns (what was measured, verdict); "not testable here" when no point of the sweep
    shares between 1 token and one block (a sweep without its 1% point, at a prompt too short)."""
    bs = sweep["block_size"]
    floor = [p for p in sweep["points"] if 0 < p["shared_tokens"] < bs]
    if not floor:
        return (
            f"no point shares 1 to {bs - 1} tokens here",
            f"not testable here: no point of this sweep shares less than one {bs}-token block",
        )
    p = min(floor, key=lambda p: p["shared_tokens"])
    here = f"{p['shared_tokens']} shared tokens (blocks of {bs}) -> {p['hit_rate']:.0%} hits"
    if p["hit_rate"] == 0:
        return here, f"holds: {p['shared_tokens']} shared tokens, under one block, hit nothing"
    return here, f"does not hold here: {p['shared_tokens']} shared tokens, under one block, hit {p['hit_rate']:.1%}"


def multi_turn_verdict(turns: list[dict]) -> str:
    """The multi-turn row: the hit rate climbs with the history when the last turn of ``multi_turn``'s
    conversation hits a larger share of its prompt than the first (counts: no noise). Raises
    ``ValueError`` for fewer than two turns."""
    if len(turns) < 2:
        raise ValueError("multi_turn_verdict: a conversation of two turns at least")
    first, last = turns[0]["hit_rate"], turns[-1]["hit_rate"]
    said = f"turn 1 hit {first:.0%} of its prompt, turn {turns[-1]['turn']} {last:.0%}"
    return f"holds: {said}" if last > first else f"does not hold here: {said}"


def _first_token(
    engine: LLMEngine, prompt: list[int], budget_tokens: int, decoder_prompts: list[list[int]] = ()
) -> tuple[float, list[StepRecord], int]:
    """One request's TTFT with the prefix cache off (and emptied), chunked prefill on at
    ``budget_tokens`` tokens a step, admitted alone or, with ``decoder_prompts``, once those requests
    are all decoding (each has its first token, then one step more). Returns the TTFT (s), the steps
    from its arrival to its first token, and the tokens the decoders held in the KV cache at its
    arrival. Every request is aborted and released afterwards; the engine's settings are restored.
    Raises ``ValueError`` on an engine with unfinished requests or too few sequence slots,
    ``RuntimeError`` when a sequence was preempted (the TTFT would include recomputation)."""
    if engine.has_unfinished_requests():
        raise ValueError("the engine has unfinished requests: measure on an idle engine")
    seqs_needed = len(decoder_prompts) + 1
    if seqs_needed > engine.config.max_num_seqs:
        raise ValueError(f"{seqs_needed} requests at once, the engine takes {engine.config.max_num_seqs}")
    budget = max(budget_tokens, seqs_needed)
    ids: list[str] = []
    held = 0
    with (
        engine.block_manager.caching(False),
        engine.reconfigured(max_num_batched_tokens=budget, enable_chunked_prefill=True, max_num_seqs=seqs_needed),
    ):
        try:
            if decoder_prompts:
                room = engine.max_model_len - max(len(p) for p in decoder_prompts) - 1
                ids = [engine.add_request(list(p), SamplingParams.fixed_length(max(2, room))) for p in decoder_prompts]
                decoders = [engine.requests[i].seq for i in ids]
                while not all(s.output_token_ids for s in decoders):
                    engine.step()
                engine.step()  # a step in which every one of them decodes
                held = sum(s.num_computed_tokens for s in decoders)
            first = len(engine.step_records)
            ids.append(engine.add_request(list(prompt), SamplingParams.fixed_length(1)))
            seq = engine.requests[ids[-1]].seq
            while not seq.output_token_ids:
                engine.step()
            preempted = any(engine.requests[i].seq.times.num_preemptions for i in ids)
        finally:
            for request_id in ids:
                engine.abort_request(request_id)
                engine.release_request(request_id)
    if preempted:
        raise RuntimeError("a sequence was preempted: give the engine more KV blocks for this measurement")
    return seq.times.emissions[0][0] - seq.times.arrival_s, engine.step_records[first:], held


def ttft_levers(
    engine: LLMEngine,
    sweep: dict,
    *,
    chunk_tokens: int,
    num_decoders: int = 4,
    decoder_prompt_tokens: int = 32,
    warmup_runs: int = 0,
) -> dict:
    """Is prefix caching the cheapest lever? What each lever on TTFT saves or costs, on one long
    prompt (``sweep["prompt_tokens"]`` tokens of real text), and what it spends for that: FLOPs and
    memory.

    - prefix caching, read from ``ttft_vs_hit_rate``'s ``sweep``: its cold TTFT (cache off, P50)
      against its highest-hit point's (P50). It computes fewer FLOPs (``flops_bytes.prefill_work`` with the
      cached tokens, against none) and keeps the cached prefix's K/V in memory between requests.
    - the baseline: the prompt alone, cache off, whole in one step (measured here, once);
    - chunked prefill: the same prompt alone, cut into steps of ``chunk_tokens`` tokens (measured);
    - batching: the same prompt admitted beside ``num_decoders`` requests of
      ``decoder_prompt_tokens``-token prompts that are decoding (decode-first; a budget that takes
      the whole prompt beside their tokens: one step) (measured).

    Each lever's ``extra_flops``: the FLOPs of the steps its first token waited for (``flops_bytes.step_work``
    on the recorded chunks), beyond the prompt's prefill alone: for chunked prefill 0 (the same causal
    work, cut up), for batching the decodes that ran beside it. ``extra_memory_bytes``: the K/V it
    keeps beyond the request's own: the cached prefix, or the decoders' K/V held beside it. Quantization,
    the fourth lever, needs another engine: notebook 08 measures it. ``warmup_runs``: discarded runs
    of each measured setting first (on a GPU, the first run of a new chunk shape plans attention).

    Returns a JSON-serializable dict: ``prompt_tokens``, ``chunk_tokens``, ``num_decoders``, and
    ``levers``: name -> ``ttft_s`` (with the lever), ``baseline_ttft_s`` (without: prefix caching's
    is the sweep's cold P50, the others' the baseline measured here), ``ttft_saved_s`` (baseline -
    with; negative: a cost), ``extra_flops``, ``extra_memory_bytes``, ``how`` (what was run).
    Raises ``ValueError`` for ``chunk_tokens`` < 1 or not under the prompt, ``num_decoders`` < 1 or
    ``warmup_runs`` < 0.
    """
    n = sweep["prompt_tokens"]
    if not 1 <= chunk_tokens < n or num_decoders < 1 or warmup_runs < 0:
        raise ValueError(
            f"need 1 <= chunk_tokens < {n} (the prompt), num_decoders >= 1 and warmup_runs >= 0; got "
            f"{chunk_tokens}, {num_decoders}, {warmup_runs}"
        )
    cfg, dtype_bytes = engine.model_config, engine.dtype.itemsize
    kv_per_token = cfg.kv_bytes_per_token(engine.kv_cache.k.dtype.itemsize)
    alone_flops = prefill_work(cfg, n, dtype_bytes).total_flops

    def extra(steps: list[StepRecord]) -> float:
        return sum(step_work(cfg, s.chunks, dtype_bytes).total_flops for s in steps) - alone_flops

    prompt = text_prompts(engine.tokenizer, n, 1)[0]
    decoders = text_prompts(engine.tokenizer, decoder_prompt_tokens, num_decoders)
    settings = {"alone": (n, []), "chunked": (chunk_tokens, []), "batched": (n + num_decoders, decoders)}
    for _ in range(warmup_runs):
        for budget, beside in settings.values():
            _first_token(engine, prompt, budget, beside)
    alone_s, _, _ = _first_token(engine, prompt, *settings["alone"])
    chunked_s, chunked_steps, _ = _first_token(engine, prompt, *settings["chunked"])
    batched_s, batched_steps, held = _first_token(engine, prompt, *settings["batched"])

    _, high = hit_rate_pair(sweep)
    cold_s, cached_s = sweep["cold"]["ttft_ms"]["p50"] / 1e3, high["ttft_ms"]["p50"] / 1e3
    cached_tokens = round(n - high["uncached_tokens"])
    levers = {
        "prefix caching": (
            cold_s,
            cached_s,
            prefill_work(cfg, n, dtype_bytes, num_cached_tokens=cached_tokens).total_flops - alone_flops,
            cached_tokens * kv_per_token,
            f"{high['hit_rate']:.1%} of the prompt cached, against the cache off (the sweep's P50s)",
        ),
        "chunked prefill": (
            alone_s,
            chunked_s,
            extra(chunked_steps),
            0,
            f"{len(chunked_steps)} steps of up to {chunk_tokens} tokens, against one step",
        ),
        "batching": (
            alone_s,
            batched_s,
            extra(batched_steps),
            held * kv_per_token,
            f"admitted beside {num_decoders} decoding requests, against alone",
        ),
    }
    return {
        "prompt_tokens": n,
        "chunk_tokens": chunk_tokens,
        "num_decoders": num_decoders,
        "levers": {
            name: {
                "ttft_s": with_s,
                "baseline_ttft_s": base_s,
                "ttft_saved_s": base_s - with_s,
                "extra_flops": flops,
                "extra_memory_bytes": memory,
                "how": how,
            }
            for name, (base_s, with_s, flops, memory, how) in levers.items()
        },
    }


def format_levers(result: dict) -> list[str]:
    """``ttft_levers``'s result as table lines: per lever, TTFT without and with it, what it saved
    (a cost when negative), its extra FLOPs and memory, and what was run."""
    lines = [f"{'lever':<16} {'TTFT without':>13} {'with':>9} {'saved':>10} {'extra GFLOP':>12} {'extra memory':>13}"]
    for name, lever in result["levers"].items():
        lines.append(
            f"{name:<16} {lever['baseline_ttft_s'] * 1e3:>10.0f} ms {lever['ttft_s'] * 1e3:>6.0f} ms "
            f"{lever['ttft_saved_s'] * 1e3:>+7.0f} ms {lever['extra_flops'] / 1e9:>+12.2f} "
            f"{lever['extra_memory_bytes'] / 2**20:>9.1f} MiB"
        )
    lines += [f"  {name}: {lever['how']}" for name, lever in result["levers"].items()]
    return lines


def multi_turn(engine: LLMEngine, turns: int = 4, user_tokens: int = 64, output_tokens: int = 32) -> list[dict]:
    """One conversation whose every turn resends the whole history (prompt + replies so far).

    Returns per turn: prompt tokens, cached tokens, hit rate and TTFT (ms). The replies' blocks
    are cached too, so the hit rate climbs with the history.
    """
    users = text_prompts(engine.tokenizer, user_tokens, turns)
    history: list[int] = []
    rows = []
    with engine.block_manager.caching(True):
        for t in range(turns):
            prompt = history + users[t]
            out = engine.generate([prompt], SamplingParams.fixed_length(output_tokens))[0]
            m = request_metrics(out)
            rows.append(
                {
                    "turn": t + 1,
                    "prompt_tokens": len(prompt),
                    "cached_tokens": out.num_cached_tokens,
                    "hit_rate": out.num_cached_tokens / len(prompt),
                    "ttft_ms": m.ttft_s * 1e3,
                }
            )
            history = prompt + out.token_ids
    return rows


def zero_hit_overhead(
    engine: LLMEngine, num_requests: int = 8, prompt_tokens: int = 256, output_tokens: int = 16, rounds: int = 3
) -> dict:
    """What the cache costs when nothing hits: output throughput of one batch of distinct prompts
    with the cache on and off, alternated ``rounds`` times (medians), as a ratio measured in one run.

    On, every full block is hashed and registered and the free list is an LRU; off, none of that.
    """
    prompts = text_prompts(engine.tokenizer, prompt_tokens, num_requests)
    params = SamplingParams.fixed_length(output_tokens)
    tok_s = {True: [], False: []}
    for _ in range(rounds):
        for cache in (True, False):
            with engine.block_manager.caching(cache):
                first = len(engine.step_records)
                outs = engine.generate(prompts, params)
            steps = engine.step_records[first:]
            assert not any(o.num_cached_tokens for o in outs), "distinct prompts must not hit"
            tok_s[cache].append(num_requests * output_tokens / sum(s.duration_s for s in steps))
    on, off = statistics.median(tok_s[True]), statistics.median(tok_s[False])
    return {
        "num_requests": num_requests,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "rounds": rounds,
        "cache_on_tok_s": on,
        "cache_off_tok_s": off,
        "overhead_percent": 100 * (off - on) / off,
    }
