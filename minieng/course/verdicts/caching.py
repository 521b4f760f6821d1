"""The KV cache and the prefix cache: S5 (TTFT follows the uncached tokens), S19 (prefix caching is
the cheapest lever on TTFT), the KV cache's linear work and the KV pool's cap on running sequences.
"""

from __future__ import annotations

from minieng.course.claims import verdict
from minieng.course.verdicts.wording import FAILS, HOLDS, not_testable

# S5: TTFT at the middle hit rate must sit on the line the uncached tokens draw within this factor.
ON_THE_LINE_X = 1.5
CACHE_SAVES_X = 1.2  # the cold TTFT over the best-hit TTFT below which the cache saved nothing worth judging


def s5_hit_rate(
    ttft_near_s: float,
    ttft_high_s: float,
    ttft_cold_s: float,
    *,
    uncached_near: int,
    uncached_high: int,
    uncached_cold: int,
    noise,
) -> str:
    """S5: TTFT follows the tokens the cache leaves to compute. ``ttft_high_s`` at the highest hit
    rate, ``ttft_near_s`` at a lower one (the article's 97% and 85.5%), ``ttft_cold_s`` with nothing
    cached; ``uncached_*`` the prompt tokens computed at each (counts). A TTFT linear in the uncached
    tokens through the cold and the high point predicts the near one; holds when the measurement is
    within ``ON_THE_LINE_X`` of it and the cache saved at least ``CACHE_SAVES_X``."""
    if not uncached_cold > uncached_high:
        raise ValueError("s5_hit_rate: the cold run must compute more tokens than the best-hit one")

    def judge(ttft_near_s, ttft_high_s, ttft_cold_s):
        if ttft_cold_s < CACHE_SAVES_X * ttft_high_s:
            return f"{FAILS}: the cache saved little (cold {ttft_cold_s * 1e3:.0f} ms, best hit {ttft_high_s * 1e3:.0f} ms)"
        per_token = (ttft_cold_s - ttft_high_s) / (uncached_cold - uncached_high)
        predicted = ttft_high_s + per_token * (uncached_near - uncached_high)
        measured_x, predicted_x = ttft_near_s / ttft_high_s, predicted / ttft_high_s
        if not 1 / ON_THE_LINE_X <= ttft_near_s / predicted <= ON_THE_LINE_X:
            return (
                f"{FAILS}: TTFT {measured_x:.1f}x the best hit's, the uncached tokens predict {predicted_x:.1f}x: "
                "TTFT does not follow them"
            )
        return f"{HOLDS}: TTFT {measured_x:.1f}x the best hit's, the uncached tokens predict {predicted_x:.1f}x"

    return verdict(judge, noise, ttft_near_s=ttft_near_s, ttft_high_s=ttft_high_s, ttft_cold_s=ttft_cold_s)


# S19: prefix caching must save at least this share of its TTFT without it to be a lever at all.
SAVES_SHARE = 0.10


def s19_cheapest(
    ttft_s: dict[str, tuple[float, float]],
    *,
    extra_flops: dict[str, float],
    noise,
    costs: dict[str, dict[str, float]] | None = None,
    capacity: dict[str, float] | None = None,
    unmeasured: str | None = None,
) -> str:
    """S19: prefix caching is the cheapest lever on TTFT, judged as cost per millisecond of TTFT saved.

    ``ttft_s``: per lever the course measures (key "prefix caching" required; chunked prefill,
    batching, threads, quantization...), ``(TTFT without it, TTFT with it)`` in seconds on the same
    prompt: the two timings, not their difference, so each gets its noise. Costs, counted: per
    resource, per lever, what the lever adds (negative: what it frees): ``extra_flops`` (FLOPs to that
    request's first token) and ``costs`` (more resources by name, e.g. ``{"memory bytes":
    {"prefix caching": kv_bytes_held, "quantization": -weight_bytes_freed}, "cores": {"threads": 7},
    "tokens changed": {"quantization": 0.02}}``); a lever missing from a resource adds none of it.
    A lever spends what it adds: one that frees a resource (the cache's skipped FLOPs, quantization's
    smaller weights) spends none of it, and that is no credit against another resource.
    ``capacity``: what the machine has of some resources (``{"memory bytes": ..., "cores": ...}``):
    those are pooled into one cost, the share of the machine a lever holds (a core and a byte compare
    through the machine); the others (FLOPs, tokens changed) are compared each on its own.

    Terms, each able to fail: prefix caching must save at least ``SAVES_SHARE`` of its TTFT (1 ms of
    200 is no lever); no other lever that saved TTFT may be cheaper: spend no more per ms saved than
    prefix caching in every cost, and less in one. A lever that adds TTFT (chunked prefill and batching,
    by design) is no rival on TTFT, and with no rival that saved TTFT the claim is not testable here
    (``unmeasured``: what would measure more levers, said in parentheses). Prefix caching that adds
    FLOPs fails outright. At most six levers (12 timings)."""
    if "prefix caching" not in ttft_s or len(ttft_s) < 2:
        raise ValueError('s19_cheapest: give "prefix caching" and at least one other lever')
    names = list(ttft_s)
    resources = {"FLOPs": extra_flops} | (costs or {})
    pooled = {r: c for r, c in (capacity or {}).items() if r in resources}
    spent = {}  # lever -> its costs, each spent (0 when it frees the resource)
    for n in names:
        spend = {r: max(0.0, resources[r].get(n, 0.0)) for r in resources}
        machine = [spend.pop(r) / c for r, c in pooled.items()]
        spent[n] = ({"share of the machine": sum(machine)} if pooled else {}) | spend

    def per_ms(name, saved_s):
        return [v / (saved_s * 1e3) for v in spent[name].values()]

    def judge(without, with_):
        saved = {n: w - t for n, w, t in zip(names, without, with_)}
        mine, base = saved["prefix caching"], without[names.index("prefix caching")]
        if extra_flops.get("prefix caching", 0) > 0:
            return f"{FAILS}: prefix caching added compute here"
        if mine < SAVES_SHARE * base:
            return f"{FAILS}: prefix caching saved {mine * 1e3:.0f} ms of {base * 1e3:.0f} ms: no lever here"
        rivals = [n for n in names if n != "prefix caching" and saved[n] > 0]
        if not rivals:
            why = "no other lever measured on this machine saved TTFT"
            return not_testable(why + (f" ({unmeasured})" if unmeasured else ""))
        own = per_ms("prefix caching", mine)
        for n in rivals:
            theirs = per_ms(n, saved[n])
            if all(t <= o for t, o in zip(theirs, own)) and theirs != own:
                return f"{FAILS}: {n} saved {saved[n] * 1e3:.0f} ms for less of every cost per ms"
        return (
            f"{HOLDS}: it saved {mine * 1e3:.0f} ms of {base * 1e3:.0f} ms; no lever that saved TTFT is cheaper per ms"
        )

    return verdict(judge, noise, without=[ttft_s[n][0] for n in names], with_=[ttft_s[n][1] for n in names])


def kv_cache_linear(recompute_s: float, cache_s: float, *, work_x: float, answer_tokens: int, noise) -> str:
    """Beyond the articles (notebook 05): the KV cache turns quadratic recomputation into linear
    work. ``work_x``: the token-passes of recomputing over those of the cached run (counted,
    exact: n m + m (m - 1) / 2 against n + m - 1 for an m-token answer to an n-token prompt);
    ``recompute_s``, ``cache_s``: the two generations' measured seconds. Holds when recomputing cost
    more work and more time; fails when the timings find no cost (or the count found no extra work)."""

    def judge(recompute_s, cache_s):
        time_x = recompute_s / cache_s
        if work_x <= 1:
            return f"{FAILS}: recomputing counted {work_x:.2f}x the token-passes, no extra work"
        if time_x <= 1:
            return f"{FAILS}: {work_x:.1f}x the token-passes, but {time_x:.2f}x the time: the cache saved nothing here"
        return f"{HOLDS}: {answer_tokens} tokens, {work_x:.1f}x the token-passes and {time_x:.1f}x the time without it"

    return verdict(judge, noise, recompute_s=recompute_s, cache_s=cache_s)


def kv_pool_caps(peak_running: int, *, cap_at_prompt: int, num_preemptions: int) -> str:
    """Beyond the articles (notebook 12): the KV pool caps how many sequences run at once. Counts
    of one run (``lab.concurrency_run``), exact: holds when no step ran more sequences than the
    pool holds at prompt length and the growing answers ran the pool dry (a preemption); fails when
    more ran than fit (a block count is wrong) or the pool never filled (it capped nothing)."""
    if peak_running > cap_at_prompt:
        return f"{FAILS}: {peak_running} ran at once in a pool that holds {cap_at_prompt} prompts (a wrong block count)"
    if num_preemptions == 0:
        return f"{FAILS}: the pool never ran dry (no preemption): it capped nothing on this run"
    return f"{HOLDS}: at most {peak_running} at once (the pool holds {cap_at_prompt} prompts), {num_preemptions} " + (
        "preemption" if num_preemptions == 1 else "preemptions"
    )
