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
from minieng.measure.metrics import request_metrics, summarize_ms
from minieng.measure.workloads import text_prompts
from minieng.units import cdiv

SEED_POINTS = [(0.97, 0.87), (0.855, 1.72)]  # (hit rate, TTFT s) from the vLLM panel of Nascimento's article


@dataclass
class HitRatePoint:
    """One sweep point: the measured hit rate over the warm requests, and their TTFT (ms)."""

    shared_tokens: int
    user_tokens: int
    hit_rate: float
    ttft_ms: dict  # summarize_ms of the warm requests: mean, p50, p90, p95, p99, max, count
    cache: bool


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
    hit = sum(o.num_cached_tokens for o in outs) / sum(len(o.prompt_token_ids) for o in outs)
    return HitRatePoint(shared, user, hit, summarize_ms(m.ttft_s for m in ms), cache)


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
    Returns a JSON-serializable dict: ``cold``, ``points`` (one per share) and the article's points.
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
        "seed_points": [{"hit_rate": h, "ttft_s": t} for h, t in SEED_POINTS],
    }


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
