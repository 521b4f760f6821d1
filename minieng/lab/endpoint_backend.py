"""The lessons through an OpenAI-compatible server (``lab.endpoint``): ``EndpointBackend``, what
``backend.lesson_backend`` returns when a notebook's ``ENDPOINT`` names one, with ``EngineBackend``'s
methods. Every request is sent alone (nothing else in flight from here), streamed, and timed from its
chunks (``endpoint.send_one``); every size is the server's count. No step records: ``has_steps`` False.
"""

from __future__ import annotations

import statistics

import numpy as np

from minieng.lab.endpoint import Backend, Endpoint, PhaseRun, _texts, connect_endpoint, send_one
from minieng.lab.endpoint_goodput import endpoint_requests, format_client_clock
from minieng.lab.endpoint_prefix_cache import endpoint_hit_rate_point, endpoint_hit_rate_sweep
from minieng.lab.phase_costs import grid_medians, grid_shapes, run_grid
from minieng.measure.loadgen import LoadRequest, LoadResult, run_load
from minieng.measure.metrics import RequestMetrics, ServingMetrics
from minieng.measure.sweep_plan import prefill_knee, probe_lengths, scan_prefill
from minieng.measure.workloads import RequestSpec


def _median_int(values) -> int:
    return int(round(statistics.median(values)))


class EndpointBackend(Backend):
    """A server measured through its API: ``endpoint`` (``lab.endpoint.Endpoint``), ``seed`` for the
    places its prompts are cut from the course's text (None: fresh places, so its prefix cache holds
    nothing of an earlier run)."""

    def __init__(self, endpoint: Endpoint, seed: int | None = None):
        super().__init__()
        self.endpoint, self.label = endpoint, endpoint.label
        self.rng = np.random.default_rng(seed)
        self.base_url, self.served_model = endpoint.base_url, endpoint.model

    @classmethod
    def connect(cls, base_url: str, model: str | None = None, seed: int | None = None) -> "EndpointBackend":
        """The server at ``base_url`` (``endpoint.connect_endpoint``: its model and tokenizer's scale)."""
        return cls(connect_endpoint(base_url, model), seed)

    def lines(self) -> list[str]:
        """What a notebook prints on connecting (``Endpoint.lines``)."""
        return self.endpoint.lines()

    def measure(self, name: str, compute, **params) -> dict:
        """``compute()``: measured now, never cached (a server's state is not this kernel's to key)."""
        return compute()

    def _tpot(self, m: RequestMetrics) -> float:
        if m.tpot_s is None:
            raise RuntimeError(
                f"{self.label} answered {m.output_tokens} token(s): TPOT needs 2 or more "
                "(does it honour ignore_eos, vLLM's extension?)"
            )
        return m.tpot_s

    def probe(self, max_prompt_tokens: int, repeats: int = 3, budget_s: float = 15.0, decode_tokens: int = 6) -> dict:
        """``probes.probe_speed`` through the API, in its dict (and ``server``), kept as ``speed``.

        Prompts at doubling lengths from 64 tokens (``sweep_plan.scan_prefill``, within ``budget_s``),
        each length's first discarded, then the median TTFT of ``repeats`` more, each answered in one
        token; then the median TPOT of ``repeats`` decodes of ``decode_tokens`` after a 64-token prompt.
        Lengths are the server's counts; ``max_prompt_tokens`` is capped by its ``max_model_len`` less
        the answer where known. It cannot switch the server's prefix cache off (distinct prompts share
        nothing a cache could serve) nor stop it chunking a long prompt (vLLM's --max-num-batched-tokens).
        Raises ``ValueError`` for ``repeats`` < 1, ``decode_tokens`` < 2 or ``max_prompt_tokens`` < 1;
        ``RuntimeError`` for a failed request or an answer under 2 tokens."""
        if repeats < 1 or decode_tokens < 2 or max_prompt_tokens < 1:
            raise ValueError(
                f"probe: repeats={repeats} (>= 1), decode_tokens={decode_tokens} (>= 2) and "
                f"max_prompt_tokens={max_prompt_tokens} (>= 1)"
            )
        ep, cap = self.endpoint, max_prompt_tokens
        if ep.max_model_len:
            cap = max(1, min(cap, ep.max_model_len - decode_tokens - 8))  # 8: a BOS and the text's rounding
        counted: dict[int, int] = {}

        def time_prefill(n: int) -> float:
            prompts = _texts(ep, n, repeats + 1, self.rng)
            send_one(ep, prompts[0], 1)  # a new length: on a GPU server, possibly a new shape to plan
            runs = [send_one(ep, p, 1) for p in prompts[1:]]
            counted[n] = _median_int(r.prompt_tokens for r in runs)
            return statistics.median(r.ttft_s for r in runs)

        points: list[tuple[int, float]] = []
        for n, t in scan_prefill(time_prefill, probe_lengths(cap), budget_s, repeats + 1):
            if not points or counted[n] > points[-1][0]:  # the server's counts, ascending
                points.append((counted[n], t))
        knee = prefill_knee(points)
        tpots = [self._tpot(send_one(ep, p, decode_tokens)) for p in _texts(ep, min(64, cap), repeats, self.rng)]
        self.speed = {
            "prefill_tok_s": knee["peak_tok_s"],
            "decode_step_s": statistics.median(tpots),
            "knee_tokens": knee["knee_tokens"],
            "knee_reached": knee["knee_reached"],
            "overhead_s": knee["overhead_s"],
            "prefill_points": [list(p) for p in points],
            "max_prompt_tokens": cap,
            "server": self.label,
        }
        return self.speed

    def chat(self, text: str, max_tokens: int) -> RequestMetrics:
        """One chat turn (``text`` as the user's), greedy, ended by the model or ``max_tokens``. Its text
        is not kept (the load generator keeps clocks and usage): the line printed says so."""
        m = send_one(self.endpoint, text, max_tokens, chat=True, ignore_eos=False)
        print(f"(a chat request to {self.label}: the load generator keeps its clocks and usage, not its text)")
        return m

    def request(self, prompt_tokens: int, output_tokens: int) -> RequestMetrics:
        """One request of about ``prompt_tokens`` answered in ``output_tokens`` (sizes: the server's usage)."""
        return send_one(self.endpoint, _texts(self.endpoint, prompt_tokens, 1, self.rng)[0], output_tokens)

    def prefill(self, prompt_tokens: int, repeats: int = 1) -> PhaseRun:
        """``repeats`` distinct prompts of about ``prompt_tokens``, each alone, answered in one token:
        the server's median count and the median TTFT (the HTTP path included)."""
        runs = [send_one(self.endpoint, p, 1) for p in _texts(self.endpoint, prompt_tokens, repeats, self.rng)]
        n, ttft = _median_int(r.prompt_tokens for r in runs), statistics.median(r.ttft_s for r in runs)
        return PhaseRun(n, ttft, n / ttft)

    def decode(self, output_tokens: int, prompt_tokens: int = 64, batch: int = 1) -> PhaseRun:
        """One request of about ``prompt_tokens`` decoding ``output_tokens`` alone (``batch`` 1 only:
        requests sent together through an API are batched as the server decides): TPOT, its gaps."""
        if batch != 1:
            raise ValueError(f"decode(batch={batch}): through an API only batch 1 is this kernel's to set")
        m = send_one(self.endpoint, _texts(self.endpoint, prompt_tokens, 1, self.rng)[0], output_tokens)
        tpot = self._tpot(m)
        return PhaseRun(m.output_tokens, tpot, 1 / tpot, None, list(m.itl_s))

    def phase_grid(self, prompt_tokens: tuple[int, int], output_tokens: tuple[int, int], repeats: int = 1) -> dict:
        """``phase_costs.phase_cost_grid`` through the API: one untimed request of each case, then
        ``repeats`` rounds (``run_grid``), medians; sizes are the server's median counts."""
        shapes = grid_shapes(prompt_tokens, output_tokens, repeats, "phase_grid")
        texts = {case: _texts(self.endpoint, p, repeats + 1, self.rng) for case, (p, _) in shapes.items()}
        runs = run_grid(shapes, repeats, lambda case, i: send_one(self.endpoint, texts[case][i], shapes[case][1]))
        grid = grid_medians(shapes, runs)
        for case, r in grid.items():  # the server's counts of what was sent, not the lengths asked for
            r["prompt_tokens"] = _median_int(x.prompt_tokens for x in runs[case])
            r["output_tokens"] = _median_int(x.output_tokens for x in runs[case])
        return grid

    def hit_rate_sweep(self, prompt_tokens: int, shares, requests: int) -> dict:
        """``endpoint_prefix_cache.endpoint_hit_rate_sweep``."""
        return endpoint_hit_rate_sweep(self.endpoint, prompt_tokens, shares, requests, rng=self.rng)

    def hit_rate_point(self, prompt_tokens: int, share: float, requests: int, absent_is_zero: bool = False) -> dict:
        """``endpoint_prefix_cache.endpoint_hit_rate_point``."""
        return endpoint_hit_rate_point(self.endpoint, prompt_tokens, share, requests, absent_is_zero, rng=self.rng)

    def serve(self, start) -> None:
        """Nothing to start: the server is already serving (``start`` is the engine's, unused here)."""

    def load_requests(self, specs: list[RequestSpec], seed: int | None = None) -> list[LoadRequest]:
        """``endpoint_goodput.endpoint_requests``: texts of each spec's length for the server to count."""
        return endpoint_requests(self.endpoint, specs, seed)

    def load(self, requests: list[LoadRequest]) -> tuple[LoadResult, ServingMetrics | None]:
        """``requests`` sent to the server (``loadgen.run_load``): the client's result, and None (no
        engine-side record through an API)."""
        return run_load(self.base_url, self.served_model, requests), None

    def clock_lines(self, client: ServingMetrics, engine: ServingMetrics | None = None) -> list[str]:
        """The client's figures (``endpoint_goodput.format_client_clock``)."""
        return format_client_clock(client, self.endpoint)

    def stop(self) -> None:
        """Nothing to stop: the server is not this kernel's."""
