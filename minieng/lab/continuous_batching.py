"""Notebook 12's plumbing: the block tables of a live batch in words, what a KV pool holds, a Poisson
load sized from a measured decode step, and static against continuous batching read back.

The experiments themselves are ``kv_cache.live_block_tables``, ``kv_cache.concurrency_run`` and
``batching.compare_batching``; this module sizes their inputs and puts their results in words.
"""

from __future__ import annotations

from minieng.config import ModelConfig, published_config
from minieng.wings.gpu_memory.memory_plan import kv_blocks_for_bytes, kv_budget_bytes
from minieng.lab.batching import sustainable_rate
from minieng.lab.kv_cache import sequences_that_fit
from minieng.measure.metrics import common_tail
from minieng.measure.roofline import format_percent
from minieng.measure.workloads import poisson_workload, spread_output_lengths
from minieng.units import GIB, cdiv


def format_block_tables(snapshot: dict) -> list[str]:
    """``kv_cache.live_block_tables``' snapshot in words: who finished, the free blocks, each
    sequence's tokens and block table, and the share of held slots left empty (all in last blocks)."""
    block = snapshot["block_size"]
    finished = ", ".join(snapshot["finished"]) or "none"
    lines = [
        f"after {snapshot['step']} steps: request(s) {finished} finished; "
        f"{snapshot['num_free_blocks']} of {snapshot['num_blocks']} blocks free"
    ]
    lines += [
        f"request {s['request_id']}: {s['num_tokens']:>3} tokens in blocks {s['block_table']}"
        for s in snapshot["sequences"]
    ]
    held = sum(len(s["block_table"]) * block for s in snapshot["sequences"])
    used = sum(s["num_tokens"] for s in snapshot["sequences"])
    if held:
        lines.append(
            f"slots held {held}, tokens in them {used}: {format_percent(100 * (held - used) / held)} of the held "
            "slots empty, all in the sequences' last blocks"
        )
    return lines


def block_tables_answer(
    prompt_tokens: list[int], output_tokens: list[int], join_every: int, pool_blocks: int, block_size: int
) -> str:
    """A worked answer (Markdown) to "will the later tables be adjacent, where do freed blocks go?",
    from the requests' lengths: the blocks each needs at full length against the pool, and which
    request ends first."""
    need = [cdiv(p + o, block_size) for p, o in zip(prompt_tokens, output_tokens)]
    first = min(range(len(need)), key=lambda i: i * join_every + output_tokens[i])  # joins at step i * join_every
    return (
        f"At full length the requests need {need} blocks of {block_size} ({sum(need)} in all) from a pool of "
        f"{pool_blocks}. Each takes one block at a time as it grows, from the free list, while the others grow "
        f"too: so its blocks interleave with theirs, not adjacent. The request that joins at step {first * join_every} "
        f"({output_tokens[first]} output tokens) ends first; its blocks go back to the free list and the next "
        "sequence to cross a block boundary takes them. The only waste is each sequence's unfilled last block."
    )


def pool_caps(num_blocks: int, block_size: int, lengths=(512, 2048, 8192)) -> list[str]:
    """Sequences of each length a pool of ``num_blocks`` holds at once (``sequences_that_fit``), and,
    computed, a Llama-3-8B shape's pool on an 80 GiB GPU at ``gpu_memory_utilization`` 0.9 (weights
    only: activations and the CUDA context would take a little more)."""
    lines = [f"this engine's pool: {num_blocks:,} blocks of {block_size} = {num_blocks * block_size:,} tokens"]
    lines += [
        f"  sequences of {n:>5} tokens that fit at once: {sequences_that_fit(num_blocks, block_size, n):>4}"
        for n in lengths
    ]
    big: ModelConfig = published_config("Llama-3-8B")
    weights = big.num_params * 2
    blocks = kv_blocks_for_bytes(kv_budget_bytes(80 * GIB, 0.9, weights, 0), block_size, [big.kv_bytes_per_token(2)])
    lines.append(
        f"computed: Llama-3-8B shape, bf16, 80 GiB x 0.9 - {weights / GIB:.1f} GiB of weights = "
        f"{blocks * block_size:,} tokens of KV: {sequences_that_fit(blocks, block_size, 8192)} sequences of "
        f"8,192 tokens, {sequences_that_fit(blocks, block_size, 2048)} of 2,048"
    )
    return lines


def admitted_at_first(num_blocks: int, block_size: int, prompt_tokens: int, requests: int, max_num_seqs: int) -> int:
    """How many of ``requests`` equal prompts a pool admits at once when a request is admitted as
    soon as its prompt's blocks fit (the scheduler's rule, as vLLM's)."""
    return min(requests, max_num_seqs, sequences_that_fit(num_blocks, block_size, prompt_tokens))


def poisson_load(
    tpot_s: float,
    prefill_tok_s: float,
    batch: int,
    prompt_tokens: int,
    output_tokens: tuple[int, int],
    load: float,
    seconds: float,
    max_requests: int,
) -> dict:
    """Poisson arrivals at ``load`` of what a continuously full batch of ``batch`` sustains
    (``sustainable_rate`` from a measured ``tpot_s`` and prefill tok/s), over about ``seconds``,
    with output lengths drawn from ``output_tokens`` (low, high). Returns ``specs``, ``rate``
    (two digits, so a re-run reads the same cached result), ``capacity``, ``timeout_s`` (twice
    the time a batch takes to arrive: how long a static batch waits to fill) and ``line``."""
    low, high = output_tokens
    capacity = sustainable_rate(tpot_s, batch, (low + high) / 2, prompt_tokens, prefill_tok_s)
    rate = float(f"{load * capacity:.2g}")
    n = min(max_requests, batch * max(2, round(rate * seconds / batch)))
    specs = spread_output_lengths(poisson_workload(n, rate, prompt_tokens, 1, seed=0), low, high, seed=0)
    timeout_s = 2 * batch / rate
    line = (
        f"{n} requests at {rate:g} req/s ({load:.0%} of an estimated {capacity:.2g} req/s for a full batch of "
        f"{batch}), {prompt_tokens}-token prompts, {low}-{high} output tokens; static batches wait at most "
        f"{timeout_s:.1f} s to fill"
    )
    return {"specs": specs, "rate": rate, "capacity": capacity, "timeout_s": timeout_s, "line": line}


def faster_policy(serve: dict) -> str:
    """The policy of ``batching.compare_batching``'s runs with the higher output tok/s."""
    return max(serve["runs"], key=lambda k: serve["runs"][k]["metrics"]["output_throughput_tok_s"])


def tails(serve: dict) -> dict:
    """Per figure (``ttft_ms``, ``e2el_ms``), the tail both runs support (``metrics.common_tail``):
    ``(label, key)``, "P99" where each run has the 100 requests it needs, else "max of N"."""
    runs = serve["runs"].values()
    return {k: common_tail([r["metrics"][k] for r in runs]) for k in ("ttft_ms", "e2el_ms")}


def batching_summary(serve: dict, rate: float) -> list[str]:
    """Static against continuous in words: the throughput ratio and the batch's fullness, whether
    static batching fell behind the arrivals, the tails of TTFT and E2EL, and P50 TPOT."""
    s, c = (serve["runs"][k] for k in ("static", "continuous"))
    sm, cm = s["metrics"], c["metrics"]
    t = tails(serve)
    (tl, tk), (el, ek) = t["ttft_ms"], t["e2el_ms"]
    x = cm["output_throughput_tok_s"] / sm["output_throughput_tok_s"]
    lines = [
        f"Continuous batching served {x:.2f}x the output tok/s of static batching on the same arrivals "
        f"({c['mean_sequences_per_step']:.1f} sequences per step on average against {s['mean_sequences_per_step']:.1f})."
    ]
    if sm["request_throughput_req_s"] < 0.9 * rate:
        lines.append(
            f"Static batching completed {sm['request_throughput_req_s']:.2f} req/s while they arrived at {rate:g} "
            "req/s: past its capacity, its queue grew for the whole run."
        )
    lines.append(
        f"TTFT ({tl}) {cm['ttft_ms'][tk]:.0f} ms against {sm['ttft_ms'][tk]:.0f} ms: a static newcomer waits for the "
        f"running batch's longest request, and for its own batch to fill; E2EL ({el}) {cm['e2el_ms'][ek]:.0f} "
        f"against {sm['e2el_ms'][ek]:.0f} ms."
    )
    higher = cm["tpot_ms"]["p50"] > sm["tpot_ms"]["p50"]
    lines.append(
        f"P50 TPOT {cm['tpot_ms']['p50']:.0f} against {sm['tpot_ms']['p50']:.0f} ms: "
        + (
            "continuous batching's fuller steps take a little longer."
            if higher
            else "no higher with continuous batching."
        )
    )
    return lines
