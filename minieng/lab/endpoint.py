"""The lessons that measure through the API, against any OpenAI-compatible server: notebook 01's two
phases, 07's prefix-cache sweep and 10's goodput run, when their ``ENDPOINT`` parameter names a server
(vLLM, SGLang, llama.cpp's server, ``python -m minieng serve``) instead of the in-process engine.

Every request is a streamed completion (``stream_options.include_usage``), timed on the client from its
chunks as vLLM's ``bench serve`` times them (``loadgen.stream_figures``: TTFT, TPOT, ITL, E2EL,
docs/architecture.md, Figures), one at a time where the lesson times a request alone. TTFT through an
API includes the HTTP path (milliseconds on loopback, a network's round trip otherwise) and the
server's tokenization of the text.

Prompts are real text (the course's corpus, ``workloads.DEFAULT_TEXT``) sent as text, so the server's
own tokenizer reads them, and every size reported is the server's count (``usage.prompt_tokens``,
``usage.completion_tokens``), never a re-tokenization here (loadgen's rule: a client's tokenizer can
disagree with the server's). A prompt of about n tokens is n x the characters per token the server
counted in a calibration text when connecting (``connect_endpoint``), cut at word boundaries from a
place a random generator draws (its ``seed``; None: fresh places each run, so a server's prefix cache holds
nothing of an earlier run). A shared prefix is sized by the server's count of it sent alone.

The prefix cache's share is OpenAI's ``usage.prompt_tokens_details.cached_tokens``. vLLM reports it
with ``--enable-prompt-tokens-details`` and leaves it out when it is 0
(``vllm/entrypoints/openai/serving_completion.py``: ``if self.enable_prompt_tokens_details and
num_cached_tokens``), SGLang with ``--enable-cache-report``, minieng always. So a request without it
counts 0 once any request of the same sweep reported it. When none did, a point's hit rate is the
server's own prefix-cache counters over its timed requests, read from its ``/metrics`` before and
after them (``server_metrics``: vLLM's ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``,
minieng's ``minieng:`` ones); a server with neither has none, and the results say "not reported by
this server" rather than guess. Each point says which (``hit_rate_source``).

What an API cannot give is in ``ENGINE_ONLY``, each with why (``engine_only``): a step's FLOPs and
bytes (MFU, MBU, the roofline), energy, vLLM's logged line, the prefix cache switched off (the cold
point here is distinct prompts, which no cache can serve), the server's settings (block size, batch
caps: its launch flags). The client is the load generator's (``measure.loadgen``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from minieng.lab.phase_costs import grid_medians, grid_shapes, run_grid
from minieng.lab.prefix_caching import ARTICLE_POINTS, hit_rate_pair
from minieng.lab.server_metrics import counted_between, read_prefix_cache_counters
from minieng.measure.loadgen import LoadRequest, run_load, served_models
from minieng.measure.metrics import RequestMetrics, ServingMetrics, common_tail, served_from_cache, summarize_ms
from minieng.measure.sweep_plan import prefill_knee, probe_lengths, scan_prefill
from minieng.measure.workloads import DEFAULT_TEXT, RequestSpec

CALIBRATION_CHARS = 2000  # the text whose token count sets the characters per token (about 450 tokens)
NOT_REPORTED = (
    "not reported by this server (usage.prompt_tokens_details.cached_tokens: vLLM reports it with "
    "--enable-prompt-tokens-details, SGLang with --enable-cache-report)"
)
HIT_RATE_SOURCES = {
    "usage": "from each answer's usage.prompt_tokens_details.cached_tokens",
    "metrics": "from the server's /metrics: {prefix}prefix_cache_hits_total / {prefix}prefix_cache_queries_total "
    "over each point's timed requests (its answers do not report cached_tokens)",
}

# What only the in-process engine shows, and why an API cannot: the notebooks print these when ENDPOINT is set.
ENGINE_ONLY = {
    "napkin": "the napkin's floors need the model's shape and the serving machine's ceilings; a server's API gives neither",
    "mfu": "MFU and MBU are a step's FLOPs and bytes over its duration, read from the engine's step records; "
    "an API shows requests, not steps",
    "roofline": "a point on the roofline is a step's FLOPs, bytes and duration: the engine's step records, not the API's",
    "energy": "joules per token need the serving machine's energy counters (NVML, RAPL); "
    "price yours from the tok/s measured here",
    "logged_ratio": "vLLM's throughput line is in the server's own log (every 10 s; minieng's: --log-interval-s): "
    "read it there",
    "attention_share": "attention's share of the FLOPs needs the model's shape, which the API does not give",
    "floor": "the TPOT floor is the bytes a step reads over the machine's bandwidth: neither is in the API",
    "block_hash": "the hash chain is the server's internal (vLLM's blocks are 16 tokens by default, --block-size)",
    "multi_turn": "each turn resends the model's reply, and the load generator keeps a stream's clocks and "
    "usage, not its text",
    "levers": "chunking and batching are the server's launch settings, and FLOPs per step its records",
    "two_clocks": "the engine's clock is the server's own record; through the API there is only the client's",
    "caps": "batch caps are the server's launch flags (vLLM: --max-num-seqs, --max-num-batched-tokens): "
    "restart it with other values and run this lesson again",
    "disaggregation": "the split is a measured model of two in-process engines; a server's is its deployment",
}


def engine_only(what: str) -> str:
    """The line a notebook prints where ``ENDPOINT`` is set and a figure needs the in-process engine:
    ``ENGINE_ONLY[what]``. Raises ``KeyError`` naming the known keys for another ``what``."""
    if what not in ENGINE_ONLY:
        raise KeyError(f"engine_only({what!r}): one of {', '.join(ENGINE_ONLY)}")
    return f"(not through the API: {ENGINE_ONLY[what]})"


@dataclass(frozen=True)
class Endpoint:
    """A server the lessons measure: its ``base_url`` (``http://host:port/v1``), the ``model`` id it
    serves (``GET /models``), the characters of the course's text per token of its tokenizer (from
    a calibration request's usage), its ``max_model_len`` where ``/models`` gives one (vLLM's and
    minieng's field; None otherwise)."""

    base_url: str
    model: str
    chars_per_token: float
    max_model_len: int | None = None

    @property
    def label(self) -> str:
        """``"<model> at <base_url>"``: what the notebooks' text and figures say was measured."""
        return f"{self.model} at {self.base_url}"

    def lines(self) -> list[str]:
        """What a notebook prints on connecting."""
        context = f"{self.max_model_len} tokens of context" if self.max_model_len else "context length not given"
        return [
            f"measured through the API: {self.label} ({context})",
            f"its tokenizer: {self.chars_per_token:.2f} characters of the course's text a token (its own usage count)",
            "TTFT includes the HTTP path and the server's tokenization; sizes are the server's counts",
        ]


def captioned(fig, endpoint: Endpoint | None):
    """``fig`` (a matplotlib ``Figure``) with the server measured as its suptitle; unchanged for None."""
    if endpoint is not None:
        fig.suptitle(f"measured through the API: {endpoint.label}", fontsize=9)
    return fig


def _max_model_len(base_url: str, model: str) -> int | None:
    """The ``max_model_len`` vLLM (and minieng) give ``model`` in ``GET /models`` (OpenAI's model object
    has none); None where absent or unreadable."""
    import httpx  # lazy: the serve extra's

    try:
        data = httpx.get(f"{base_url.rstrip('/')}/models", timeout=10).json().get("data", [])
        value = next((m.get("max_model_len") for m in data if m.get("id") == model), None)
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def connect_endpoint(base_url: str, model: str | None = None) -> Endpoint:
    """The server at ``base_url``, ready to measure: its model id from ``GET /models``
    (``loadgen.served_models``), and its tokenizer's characters per token from the usage of one
    request of ``CALIBRATION_CHARS`` characters of the course's text, from 32 places of it (that
    request also warms it up).

    Args:
        model: the id to measure where the server serves several (default: the first listed).
    Raises:
        ValueError: the server cannot be reached, serves no model, or not ``model``.
        RuntimeError: the calibration request failed (the server's message).
    """
    models = served_models(base_url)
    if not models:
        raise ValueError(f"{base_url}/models lists no model: is a model loaded on that server?")
    if model is not None and model not in models:
        raise ValueError(f"{base_url} serves {models}, not {model!r}: pick one of those")
    model = model or models[0]
    endpoint = Endpoint(base_url.rstrip("/"), model, 1.0, _max_model_len(base_url, model))
    text = _calibration_text()
    counted = send_one(endpoint, text, 1).prompt_tokens
    if counted < 1:
        raise RuntimeError(f"{endpoint.label} counted {counted} prompt tokens in {len(text)} characters")
    return Endpoint(endpoint.base_url, endpoint.model, len(text) / counted, endpoint.max_model_len)


@lru_cache(maxsize=2)
def _corpus(path: Path = DEFAULT_TEXT) -> str:
    """The course's text, its runs of whitespace made single spaces (word boundaries are spaces)."""
    if not path.is_file():
        raise ValueError(
            f"{path} not found: install minieng from its wheel or sdist, or run from a "
            "clone of the repository (the text corpus lives in its data/ folder)"
        )
    return " ".join(path.read_text(encoding="utf-8").split())


def _cut(text: str, start: int, chars: int) -> str:
    """``chars`` characters of ``text`` or a few more, from the first word at or after ``start`` to the
    end of the word that reaches ``chars`` (whole words: a prefix's last token is the same alone and
    with a turn after it)."""
    if start > 0:
        start = text.find(" ", start) + 1
    end = text.find(" ", start + chars)
    return text[start : end if end >= 0 else len(text)]


def _calibration_text(slices: int = 32) -> str:
    """``CALIBRATION_CHARS`` characters of the course's text in ``slices`` pieces spread evenly over
    it: its mix of narration and dialogue, whose characters per token vary by 10% from place to place."""
    text = _corpus()
    return " ".join(_cut(text, i * len(text) // slices, CALIBRATION_CHARS // slices) for i in range(slices))


def _texts(endpoint: Endpoint, tokens: int, count: int, rng: np.random.Generator) -> list[str]:
    """``count`` texts of about ``tokens`` of the server's tokens, each from a place ``rng`` draws."""
    if tokens < 1:
        raise ValueError(f"a prompt of {tokens} tokens: give 1 or more")
    text = _corpus()
    chars = max(1, round(tokens * endpoint.chars_per_token))
    if chars + 200 > len(text):
        raise ValueError(
            f"{tokens} tokens (about {chars} characters) exceed the course's text ({len(text)} characters): "
            "ask for shorter prompts"
        )
    starts = rng.integers(0, len(text) - chars - 100, count)
    return [_cut(text, int(s), chars) for s in starts]


def send_one(
    endpoint: Endpoint, prompt: str, max_tokens: int, chat: bool = False, ignore_eos: bool = True
) -> RequestMetrics:
    """One request sent alone (nothing else in flight from here), streamed, timed from its chunks
    (``loadgen.stream_figures``). ``chat``: a ``/chat/completions`` user message rather than a
    completion's prompt. ``ignore_eos`` (vLLM's extension, which SGLang and llama.cpp's server share):
    the answer runs to ``max_tokens``. Raises ``RuntimeError`` with the server's message when the
    request failed."""
    request = LoadRequest(0.0, prompt, max_tokens)
    result = run_load(endpoint.base_url, endpoint.model, [request], chat=chat, ignore_eos=ignore_eos, progress=False)
    if result.errors:
        raise RuntimeError(f"{endpoint.label}: {result.errors[0]}")
    return result.requests[0]


def endpoint_request(
    endpoint: Endpoint, prompt_tokens: int, output_tokens: int, seed: int | None = None
) -> RequestMetrics:
    """One request of about ``prompt_tokens`` prompt tokens answered in ``output_tokens`` tokens, sent
    alone (a notebook's panel). Returns its ``RequestMetrics`` (sizes: the server's usage)."""
    return send_one(endpoint, _texts(endpoint, prompt_tokens, 1, np.random.default_rng(seed))[0], output_tokens)


def endpoint_chat(endpoint: Endpoint, message: str, max_tokens: int) -> RequestMetrics:
    """One chat turn (``message`` as the user's), greedy, ended by the model or ``max_tokens``:
    notebook 01's first request. Its text is not kept (the load generator keeps clocks and usage)."""
    return send_one(endpoint, message, max_tokens, chat=True, ignore_eos=False)


def _median_int(values) -> int:
    return int(round(statistics.median(values)))


def endpoint_probe(
    endpoint: Endpoint,
    max_prompt_tokens: int,
    budget_s: float = 15.0,
    repeats: int = 3,
    decode_tokens: int = 6,
    seed: int | None = None,
) -> dict:
    """``probes.probe_speed`` through the API: where the server's prefill tok/s stops growing, and
    its batch-1 decode step, in the dict ``probe_speed`` returns, so ``estimate_s`` and
    ``sweep_plan.prefill_sweep_lengths`` size a lesson's runs from it.

    Prompts at doubling lengths from 64 tokens (``sweep_plan.scan_prefill``, within ``budget_s``),
    each length's first discarded, then the median TTFT of ``repeats`` more, each sent alone and
    answered in one token; then the median TPOT of ``repeats`` decodes of ``decode_tokens`` tokens
    after a 64-token prompt. Lengths are the server's counts (``prefill_points``: its medians).
    ``max_prompt_tokens`` is capped by the server's ``max_model_len`` less the answer where known.
    Unlike ``probe_speed`` it cannot switch the server's prefix cache off or raise its step's token
    budget: distinct prompts share nothing a cache could serve, and a server that chunks a long prompt
    (vLLM does, past ``--max-num-batched-tokens``) times its chunks together.

    Returns:
        ``prefill_tok_s``, ``decode_step_s``, ``knee_tokens``, ``knee_reached``, ``overhead_s``,
        ``prefill_points``, ``max_prompt_tokens`` (``probe_speed``'s) and ``server``
        (``Endpoint.label``).
    Raises:
        ValueError: ``repeats`` < 1, ``decode_tokens`` < 2 or ``max_prompt_tokens`` < 1.
        RuntimeError: a request failed, or answered fewer than 2 tokens (no TPOT).
    """
    if repeats < 1 or decode_tokens < 2 or max_prompt_tokens < 1:
        raise ValueError(
            f"endpoint_probe: repeats={repeats} (>= 1), decode_tokens={decode_tokens} (>= 2) and "
            f"max_prompt_tokens={max_prompt_tokens} (>= 1)"
        )
    cap = max_prompt_tokens
    if endpoint.max_model_len:
        cap = max(1, min(cap, endpoint.max_model_len - decode_tokens - 8))  # 8: a BOS and the text's rounding
    rng = np.random.default_rng(seed)
    counted: dict[int, int] = {}

    def time_prefill(n: int) -> float:
        prompts = _texts(endpoint, n, repeats + 1, rng)
        send_one(endpoint, prompts[0], 1)  # a new length: on a GPU server, possibly a new shape to plan
        runs = [send_one(endpoint, p, 1) for p in prompts[1:]]
        counted[n] = _median_int(r.prompt_tokens for r in runs)
        return statistics.median(r.ttft_s for r in runs)

    asked = scan_prefill(time_prefill, probe_lengths(cap), budget_s, repeats + 1)
    points: list[tuple[int, float]] = []
    for n, t in asked:  # the server's counts, kept ascending (two close asked lengths may count alike)
        if not points or counted[n] > points[-1][0]:
            points.append((counted[n], t))
    knee = prefill_knee(points)
    decode_prompts = _texts(endpoint, min(64, cap), repeats, rng)
    tpots = [_tpot(send_one(endpoint, p, decode_tokens), endpoint) for p in decode_prompts]
    return {
        "prefill_tok_s": knee["peak_tok_s"],
        "decode_step_s": statistics.median(tpots),
        "knee_tokens": knee["knee_tokens"],
        "knee_reached": knee["knee_reached"],
        "overhead_s": knee["overhead_s"],
        "prefill_points": [list(p) for p in points],
        "max_prompt_tokens": cap,
        "server": endpoint.label,
    }


def _tpot(m: RequestMetrics, endpoint: Endpoint) -> float:
    if m.tpot_s is None:
        raise RuntimeError(
            f"{endpoint.label} answered {m.output_tokens} token(s): TPOT needs 2 or more "
            "(does it honour ignore_eos, vLLM's extension?)"
        )
    return m.tpot_s


def endpoint_two_phases(
    endpoint: Endpoint,
    prompt_tokens: Sequence[int],
    decode_tokens: int,
    repeats: int = 1,
    decode_prompt_tokens: int = 64,
    seed: int | None = None,
) -> dict:
    """Notebook 01's section 2 through the API: TTFT against prompt length, and the TPOT of a batch-1
    decode.

    For each length of ``prompt_tokens`` (asked; about that many of the server's tokens),
    ``repeats`` distinct prompts, each sent alone and answered in one token: their median TTFT, and
    prefill tok/s = the server's median prompt count / that TTFT. Then one request of about
    ``decode_prompt_tokens`` prompt tokens decoding ``decode_tokens`` tokens alone (batch 1): its
    TPOT (``stream_figures``: (E2EL - TTFT) / (tokens - 1)) and ITL. No step records: no MFU, MBU
    or roofline point (``ENGINE_ONLY``).

    Returns:
        a JSON-serializable dict: ``server`` (``Endpoint.label``), ``prefill``: per length, in the
        order of the server's counts, ``asked_tokens``, ``prompt_tokens`` (the server's median count), ``ttft_s``, ``tok_s``,
        ``cached_tokens`` (summed over the length's requests; None: not reported); ``decode``:
        ``prompt_tokens``, ``output_tokens``, ``tpot_s``, ``tok_s`` (1 / TPOT), ``itl_ms``
        (``summarize_ms``), ``cached_tokens``.
    Raises:
        ValueError: no length, a length < 1, ``repeats`` < 1 or ``decode_tokens`` < 2.
        RuntimeError: a request failed, or the decode answered fewer than 2 tokens.
    """
    if not prompt_tokens or min(prompt_tokens) < 1 or repeats < 1 or decode_tokens < 2:
        raise ValueError(
            f"endpoint_two_phases: prompt_tokens={list(prompt_tokens)} (one or more lengths >= 1), "
            f"repeats={repeats} (>= 1), decode_tokens={decode_tokens} (>= 2)"
        )
    rng = np.random.default_rng(seed)
    rows = []
    for n in prompt_tokens:
        runs = [send_one(endpoint, p, 1) for p in _texts(endpoint, n, repeats, rng)]
        counted, ttft = _median_int(r.prompt_tokens for r in runs), statistics.median(r.ttft_s for r in runs)
        rows.append(
            {
                "asked_tokens": n,
                "prompt_tokens": counted,
                "ttft_s": ttft,
                "tok_s": counted / ttft,
                "cached_tokens": served_from_cache(r.cached_tokens for r in runs),
            }
        )
    rows.sort(key=lambda r: r["prompt_tokens"])  # by the server's count, as a fit of TTFT against it needs
    m = send_one(endpoint, _texts(endpoint, decode_prompt_tokens, 1, rng)[0], decode_tokens)
    tpot = _tpot(m, endpoint)
    decode = {
        "prompt_tokens": m.prompt_tokens,
        "output_tokens": m.output_tokens,
        "tpot_s": tpot,
        "tok_s": 1 / tpot,
        "itl_ms": summarize_ms(m.itl_s),
        "cached_tokens": m.cached_tokens,
    }
    return {"server": endpoint.label, "prefill": rows, "decode": decode}


def format_two_phases(result: dict) -> list[str]:
    """``endpoint_two_phases``'s result as notebook 01's table: per length the server's prompt count,
    TTFT and prefill tok/s (and the cache's share where a prompt hit one), then the decode and the
    prefill / decode ratio."""
    lines = [
        f"measured through the API: {result['server']}",
        f"{'prompt tokens':>13} {'TTFT ms':>9} {'prefill tok/s':>13}",
    ]
    for r in result["prefill"]:
        hit = f"  ({r['cached_tokens']} served from its cache)" if r["cached_tokens"] else ""
        lines.append(f"{r['prompt_tokens']:>13} {r['ttft_s'] * 1e3:>9.1f} {r['tok_s']:>13.0f}{hit}")
    dec = result["decode"]
    best = max(result["prefill"], key=lambda r: r["tok_s"])
    lines += [
        "",
        f"batch-1 decode: {dec['output_tokens']} tokens after {dec['prompt_tokens']}: TPOT {dec['tpot_s'] * 1e3:.1f} ms "
        f"= {dec['tok_s']:.1f} tok/s, ITL P50 {dec['itl_ms']['p50']:.1f} ms",
        f"prefill / decode = {best['tok_s']:.0f} / {dec['tok_s']:.1f} = {best['tok_s'] / dec['tok_s']:.0f}x on this "
        "server; the article's vLLM panel: 12,968.6 / 95 = 136x",
    ]
    return lines


def endpoint_phase_grid(
    endpoint: Endpoint,
    prompt_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
    repeats: int = 1,
    seed: int | None = None,
) -> dict[str, dict]:
    """``phase_costs.phase_cost_grid`` through the API: the three requests of ``phase_costs.CASES``
    (short prompt and answer; long prompt; long answer), each sent alone: one untimed request of
    each, then ``repeats`` rounds (``phase_costs.run_grid``), timed as TTFT and decode time (E2EL -
    TTFT), medians. Returns per case ``prompt_tokens`` and ``output_tokens`` (the server's median
    counts), ``ttft_s``, ``decode_s``. Raises ``ValueError`` as ``phase_costs.grid_shapes`` does,
    ``RuntimeError`` for a failed request."""
    shapes = grid_shapes(prompt_tokens, output_tokens, repeats, "endpoint_phase_grid")
    rng = np.random.default_rng(seed)
    texts = {case: _texts(endpoint, p, repeats + 1, rng) for case, (p, _) in shapes.items()}
    runs = run_grid(shapes, repeats, lambda case, i: send_one(endpoint, texts[case][i], shapes[case][1]))
    grid = grid_medians(shapes, runs)
    for case, r in grid.items():  # the server's counts of what was sent, not the lengths asked for
        r["prompt_tokens"] = _median_int(x.prompt_tokens for x in runs[case])
        r["output_tokens"] = _median_int(x.output_tokens for x in runs[case])
    return grid


def _shared_prompts(endpoint: Endpoint, prompt_tokens: int, share: float, count: int, rng) -> tuple[str, list[str]]:
    """A shared prefix of about ``share`` of a ``prompt_tokens``-token prompt ("" for 0) and ``count``
    prompts of about ``prompt_tokens`` tokens that begin with it, each then a distinct turn."""
    chars = max(2, round(prompt_tokens * endpoint.chars_per_token))
    shared_chars = round(share * chars)
    shared = _cut(_corpus(), int(rng.integers(0, len(_corpus()) - chars - 100)), shared_chars) if shared_chars else ""
    turn_tokens = max(1, round((chars - len(shared) - 1) / endpoint.chars_per_token))
    turns = _texts(endpoint, turn_tokens, count, rng)
    return shared, [f"{shared} {t}" if shared else t for t in turns]


def endpoint_hit_rate_point(
    endpoint: Endpoint,
    prompt_tokens: int,
    share: float,
    requests: int,
    absent_is_zero: bool = False,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
) -> dict:
    """One point of notebook 07's sweep through the API: ``requests`` prompts of about
    ``prompt_tokens`` tokens whose first ``share`` (of the characters, cut at a word) is one shared
    system prompt, each sent alone and answered in one token, after the shared prefix was sent alone
    (untimed) so the server's cache holds it. With ``share`` 0 the prompts share nothing (the cold
    point: an API cannot switch a server's cache off, but no cache serves a prefix it never saw), and
    one distinct prompt goes first, untimed, as a warm-up.

    ``absent_is_zero``: count a request whose usage lacks ``cached_tokens`` as 0 (vLLM leaves the field
    out when it is 0: the module docstring); ``endpoint_hit_rate_sweep`` sets it once any request of
    the sweep reported the field. The server's prefix-cache counters are read from its ``/metrics``
    after the untimed request and after the timed ones (``server_metrics``), so they count the timed
    requests alone. Returns a JSON-serializable dict of ``HitRatePoint``'s fields
    (``shared_tokens``: the server's count of the shared prefix alone; ``user_tokens``: the mean prompt
    count beyond it; ``hit_rate``: cached / prompt tokens over the timed requests, from their usage or
    else the counters' hits / queries, None when neither reported it; ``ttft_ms``: ``summarize_ms``;
    ``cache``: True; ``uncached_tokens``: mean prompt - cached tokens, None when not reported) and
    ``share``, ``prompt_tokens`` (mean count), ``cached_tokens`` (per request, None where not
    reported), ``prefix_cache_counted`` (the counters' deltas: ``PrefixCacheCounters.since``; None
    without them), ``hit_rate_source`` (``"usage"``, ``"metrics"`` or None) and ``server``.
    Raises ``ValueError`` for a share outside [0, 1) or ``requests`` < 1; ``RuntimeError`` for a failed request.
    """
    if not 0 <= share < 1 or requests < 1:
        raise ValueError(f"share={share} must lie in [0, 1) and requests={requests} be >= 1")
    rng = rng if rng is not None else np.random.default_rng(seed)
    shared, prompts = _shared_prompts(endpoint, prompt_tokens, share, requests + (0 if share else 1), rng)
    if shared:
        shared_tokens = send_one(endpoint, shared, 1).prompt_tokens  # the cache now holds its full blocks
    else:
        send_one(endpoint, prompts.pop(0), 1)  # a warm-up, as the engine's cold point runs one first
        shared_tokens = 0
    before = read_prefix_cache_counters(endpoint.base_url)  # after the untimed request: it is not counted
    runs = [send_one(endpoint, p, 1) for p in prompts]
    after = read_prefix_cache_counters(endpoint.base_url) if before is not None else None
    point = {
        "share": share,
        "shared_tokens": shared_tokens,
        "prompt_tokens": statistics.mean(r.prompt_tokens for r in runs),
        "ttft_ms": summarize_ms(r.ttft_s for r in runs),
        "cache": True,
        "cached_tokens": [r.cached_tokens for r in runs],
        "prefix_cache_counted": counted_between(before, after),
        "server": endpoint.label,
    }
    point["user_tokens"] = point["prompt_tokens"] - shared_tokens
    return _with_hit_rate(point, [r.prompt_tokens for r in runs], absent_is_zero)


def _with_hit_rate(point: dict, prompts: list[int], absent_is_zero: bool) -> dict:
    """``point`` with ``hit_rate``, ``uncached_tokens`` and ``hit_rate_source``: from its per-request
    ``cached_tokens`` ("usage"; a missing one is unknown unless ``absent_is_zero``), else from its
    ``prefix_cache_counted`` ("metrics": hits / queries, computed = (queries - hits) / requests),
    else None."""
    cached = served_from_cache(point["cached_tokens"], absent_is_zero)
    counted = point.get("prefix_cache_counted")
    point["prompt_token_counts"] = prompts
    if cached is not None:
        point["hit_rate"], point["hit_rate_source"] = cached / sum(prompts), "usage"
        point["uncached_tokens"] = (sum(prompts) - cached) / len(prompts)
    elif counted is not None and counted["hit_rate"] is not None:
        point["hit_rate"], point["hit_rate_source"] = counted["hit_rate"], "metrics"
        point["uncached_tokens"] = (counted["queries"] - counted["hits"]) / len(prompts)
    else:
        point["hit_rate"], point["uncached_tokens"], point["hit_rate_source"] = None, None, None
    return point


def endpoint_hit_rate_sweep(
    endpoint: Endpoint,
    prompt_tokens: int,
    shares: Sequence[float] = (0.0, 0.01, 0.25, 0.5, 0.75, 0.9, 0.97),
    requests: int = 4,
    seed: int | None = None,
) -> dict:
    """``prefix_caching.ttft_vs_hit_rate`` through the API: a cold point (``share`` 0: distinct
    prompts) and one ``endpoint_hit_rate_point`` per share, in the dict that sweep returns, so
    ``prefix_caching.hit_rate_pair`` and notebook 07's figure read it. Each point's prompts are cut from
    fresh places of the text: no point hits what an earlier one (or an earlier run, ``seed=None``) left.

    Returns:
        ``server``, ``prompt_tokens`` (asked), ``block_size`` (None: the server's is not in its API),
        ``cold``, ``points``, ``article_points``, ``cached_tokens_reported`` (whether any request of
        the sweep reported ``cached_tokens``) and ``hit_rate_source``: "usage" when one did, else
        "metrics" when the server's ``/metrics`` counted a point's requests, else None (every hit
        rate None: ``NOT_REPORTED``).
    Raises:
        ValueError: no share, a share outside [0, 1), or ``requests`` < 1.
    """
    if not shares:
        raise ValueError("endpoint_hit_rate_sweep: give one or more shares")
    rng = np.random.default_rng(seed)
    cold = endpoint_hit_rate_point(endpoint, prompt_tokens, 0.0, requests, rng=rng)
    points = [endpoint_hit_rate_point(endpoint, prompt_tokens, s, requests, rng=rng) for s in shares]
    reported = any(c is not None for p in [cold, *points] for c in p["cached_tokens"])
    for p in [cold, *points]:
        _with_hit_rate(p, p["prompt_token_counts"], absent_is_zero=reported)
    sources = {p["hit_rate_source"] for p in [cold, *points]}
    return {
        "server": endpoint.label,
        "prompt_tokens": prompt_tokens,
        "block_size": None,
        "cold": cold,
        "points": points,
        "article_points": [{"hit_rate": h, "ttft_s": t} for h, t in ARTICLE_POINTS],
        "cached_tokens_reported": reported,
        "hit_rate_source": "usage" if reported else ("metrics" if "metrics" in sources else None),
    }


def endpoint_hit_rate_pair(result: dict) -> tuple[dict, dict]:
    """``prefix_caching.hit_rate_pair`` of ``endpoint_hit_rate_sweep``'s result: the highest hit rate
    and the lower point nearest the article's 85.5%, which claim S5 compares.

    Raises:
        ValueError: a point has no hit rate (the server neither reported cached tokens nor counted
            them in ``/metrics``: ``NOT_REPORTED``), or every point hit alike (its prefix cache off,
            or prompts too short for a block).
    """
    if any(p["hit_rate"] is None for p in [result["cold"], *result["points"]]):
        raise ValueError(f"hit rates {NOT_REPORTED}")
    if len({p["hit_rate"] for p in result["points"]}) < 2:
        raise ValueError(
            "every point of the sweep hit alike: is the server's prefix cache on (vLLM: on by default; "
            "--no-enable-prefix-caching turns it off), and are the prompts longer than one of its blocks?"
        )
    return hit_rate_pair(result)


def format_hit_rate(point: dict) -> str:
    """A point's hit rate as a notebook prints it: ``"90.0%"``, or "not reported"."""
    return "not reported" if point["hit_rate"] is None else f"{point['hit_rate']:.1%}"


def format_hit_rate_sweep(result: dict) -> list[str]:
    """``endpoint_hit_rate_sweep``'s result as notebook 07's table: per point the shared tokens (the
    server's count), the hit rate and computed tokens (from its usage, else its ``/metrics``, or "not
    reported"), P50 and tail TTFT (the P99 where 100 requests support it, else the max) and the
    speed-up over cold; then where the hit rates came from (``HIT_RATE_SOURCES``, or ``NOT_REPORTED``)."""
    cold = result["cold"]["ttft_ms"]["p50"]
    tail, key = common_tail([result["cold"]["ttft_ms"]] + [p["ttft_ms"] for p in result["points"]])
    lines = [
        f"measured through the API: {result['server']}; prompts of about {result['prompt_tokens']} tokens",
        f"{'shared tokens':>13} {'hit rate':>12} {'computed tokens':>16} {'P50 TTFT ms':>12} {tail + ' TTFT ms':>15} "
        f"{'faster than cold':>17}",
    ]
    for name, p in [("cold", result["cold"])] + [(str(p["shared_tokens"]), p) for p in result["points"]]:
        computed = "?" if p["uncached_tokens"] is None else f"{p['uncached_tokens']:.0f}"
        lines.append(
            f"{name:>13} {format_hit_rate(p):>12} {computed:>16} {p['ttft_ms']['p50']:>12.1f} {p['ttft_ms'][key]:>15.1f} "
            f"{cold / p['ttft_ms']['p50']:>16.2f}x"
        )
    lines.append(
        "(cold: prompts that share nothing, which no cache can serve; an API cannot switch the server's cache off)"
    )
    source = result["hit_rate_source"]
    if source is None:
        lines.append(f"hit rates: {NOT_REPORTED}; nor counted in its /metrics (vllm:prefix_cache_hits_total)")
    else:
        counted = [p["prefix_cache_counted"] for p in [result["cold"], *result["points"]] if p["prefix_cache_counted"]]
        lines.append(f"hit rates: {HIT_RATE_SOURCES[source].format(prefix=counted[0]['prefix'] if counted else '')}")
    return lines


def endpoint_requests(endpoint: Endpoint, specs: list[RequestSpec], seed: int | None = None) -> list:
    """Notebook 10's workload for a server: one ``loadgen.LoadRequest`` per spec, at its arrival, a text
    of about its prompt length (the server counts it) asking for its output length. Send them with
    ``loadgen.run_load(endpoint.base_url, endpoint.model, ...)``."""
    rng = np.random.default_rng(seed)
    return [LoadRequest(s.arrival_s, _texts(endpoint, s.prompt_tokens, 1, rng)[0], s.output_tokens) for s in specs]


def format_client_clock(summary: ServingMetrics, endpoint: Endpoint) -> list[str]:
    """A load run's figures as its client timed them (``metrics.serving_metrics`` of its stream
    figures): per figure the sample size, P50 and tail (P99 where 100 samples support it, else the
    max), then the prefix cache's share (or ``NOT_REPORTED``)."""
    lines = [
        f"measured through the API: {endpoint.label}",
        f"  {'ms':<6} {'n':>5} {'client P50':>11} {'client tail':>12}  tail",
    ]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        s = getattr(summary, key)
        if not s["count"]:
            lines.append(f"  {key[:-3].upper():<6} (not measured: no samples)")
            continue
        label, tail = common_tail([s])
        lines.append(f"  {key[:-3].upper():<6} {s['count']:>5} {s['p50']:>11.1f} {s[tail]:>12.1f}  {label}")
    rate = summary.prefix_cache_hit_rate
    lines.append(f"  prefix cache: {NOT_REPORTED if rate is None else f'{rate:.1%} of prompt tokens served from it'}")
    return lines
