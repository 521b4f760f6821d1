"""The lessons that measure through the API, against any OpenAI-compatible server: notebook 01's two
phases, 07's prefix-cache sweep and 10's goodput run, when their ``ENDPOINT`` parameter names a server
(vLLM, SGLang, llama.cpp's server, ``python -m minieng serve``) instead of the in-process engine.
This module holds what every lesson needs: the ``Endpoint``, its calibration (``connect_endpoint``),
one streamed request (``send_one``), the corpus texts, ``ENGINE_ONLY``, and what both of a lesson's
backends share (``Backend``, ``PhaseRun``; ``lab.backend``). The server's backend is
``endpoint_backend.EndpointBackend``; 07's sweep is in ``endpoint_prefix_cache``, 10's workload in
``endpoint_goodput``.

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

What an API cannot give is in ``ENGINE_ONLY``, each with why (``Backend.needs_engine``): a step's FLOPs and
bytes (MFU, MBU, the roofline), energy, vLLM's logged line, the prefix cache switched off (the cold
point here is distinct prompts, which no cache can serve), the server's settings (block size, batch
caps: its launch flags). The client is the load generator's (``measure.loadgen``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from minieng.lab.probes import estimate_s as probe_estimate_s
from minieng.measure.loadgen import LoadRequest, run_load, served_models
from minieng.measure.metrics import RequestMetrics
from minieng.measure.workloads import DEFAULT_TEXT

CALIBRATION_CHARS = 2000  # the text whose token count sets the characters per token (about 450 tokens)
NOT_REPORTED = (
    "not reported by this server (usage.prompt_tokens_details.cached_tokens: vLLM reports it with "
    "--enable-prompt-tokens-details, SGLang with --enable-cache-report)"
)

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


@dataclass
class PhaseRun:
    """One phase timed alone (``Backend.prefill``, ``Backend.decode``). ``tokens``: the prompt's length
    (prefill) or the answer's (decode), the server's count through an API; ``seconds``: the median TTFT
    (prefill) or TPOT (decode); ``tok_s``: prompt tokens / TTFT, or sequences / TPOT; ``steps``: the
    engine's step records of the run (None through an API); ``itl_s``: a decode's gaps, where kept."""

    tokens: int
    seconds: float
    tok_s: float
    steps: list | None = None
    itl_s: list[float] = field(default_factory=list)


class Backend:
    """What ``EngineBackend`` and ``EndpointBackend`` (``lab.backend``) share: the probe's figures
    (``speed``), ``estimate_s``, the engine-only rule (``needs_engine``) and ``caption``."""

    has_steps = False
    engine = None
    ceilings = None
    model = None
    speed: dict | None = None
    label = ""

    def __init__(self):
        self._said: set[str] = set()

    @property
    def noise(self):
        """This machine's timing noise now (``ceilings.Noise``); None through an API (not this machine's)."""
        return self.ceilings.noise if self.ceilings is not None else None

    def estimate_s(self, prefill_tokens: int = 0, decode_steps: int = 0, prefills: int = 0) -> float:
        """Rough seconds of a run: ``probes.estimate_s`` of this backend's ``probe``."""
        if self.speed is None:
            raise RuntimeError("estimate_s: call probe() first")
        return probe_estimate_s(self.speed, prefill_tokens, decode_steps, prefills)

    def needs_engine(self, what: str) -> bool:
        """True where this backend has the engine's step records for ``what`` (a key of ``ENGINE_ONLY``);
        through an API it prints, the first time for each ``what``, why not, and returns False."""
        if what not in ENGINE_ONLY:
            raise KeyError(f"needs_engine({what!r}): one of {', '.join(ENGINE_ONLY)}")
        if not self.has_steps and what not in self._said:
            self._said.add(what)
            print(f"(not through the API: {ENGINE_ONLY[what]})")
        return self.has_steps

    def utilization(self, run: PhaseRun) -> dict | None:
        """``measure.phase_utilization`` of ``run``'s steps on this machine's measured peak; None
        through an API (no steps)."""
        return None

    def why_not(self, what: str) -> str | None:
        """None on the engine; through an API, why ``what`` needs the engine (``ENGINE_ONLY[what]``)."""
        return None if self.has_steps else ENGINE_ONLY[what]

    def caption(self, fig):
        """``fig`` (a matplotlib ``Figure``), with the server measured as its suptitle through an API."""
        if not self.has_steps:
            fig.suptitle(f"measured through the API: {self.label}", fontsize=9)
        return fig


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
