"""One object a lesson measures, whether it is an engine in this kernel or an OpenAI-compatible server:
``lesson_backend(ENDPOINT, MODEL, ...)`` returns an ``EngineBackend`` (``ENDPOINT`` None) or an
``EndpointBackend`` (``lab.endpoint``), with the same methods, so no notebook cell branches on ``ENDPOINT``.

Both answer the same questions: ``probe`` (where prefill stops speeding up, a decode step), ``chat``
(a streamed reply), ``request`` (one request of given lengths), ``prefill`` and ``decode`` (a phase
timed alone: ``PhaseRun``), ``phase_grid`` (``phase_costs``' three requests), ``hit_rate_sweep`` and
``hit_rate_point`` (notebook 07), ``serve`` / ``load`` (notebook 10's load run). Figures that need the
engine's step records (MFU, MBU, the roofline, the napkin) ask ``needs_engine(what)``: True on the
engine; an endpoint prints once why not (``endpoint.ENGINE_ONLY``) and answers False.
``measure(name, compute, **params)`` caches an engine's result on disk (the ``cache`` function the
notebook passes, ``course.cached``: the lab layer does not import the course's); a server's state is
not this kernel's to key, so an endpoint always measures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.lab.endpoint import Backend, PhaseRun
from minieng.lab.endpoint_backend import EndpointBackend
from minieng.lab.model_for_device import course_model
from minieng.lab.phase_costs import phase_cost_grid
from minieng.lab.prefix_caching import measure_point, ttft_vs_hit_rate
from minieng.lab.report import format_two_clocks
from minieng.lab.probes import minieng_decode, minieng_prefill, probe_speed
from minieng.measure.ceilings import machine_ceilings
from minieng.measure.loadgen import LoadRequest, LoadResult, load_requests, run_load, served_models
from minieng.measure.roofline import phase_utilization
from minieng.measure.metrics import RequestMetrics, ServingMetrics, request_metrics, serving_metrics
from minieng.measure.workloads import RequestSpec, text_prompts
from minieng.units import cdiv


class EngineBackend(Backend):
    """The engine in this kernel: this machine's ceilings (``machine_ceilings``), the lesson's model
    (``course_model``) and an ``LLMEngine`` built with ``engine_args``. ``cache``: ``course.cached``."""

    has_steps = True

    def __init__(self, model: str | None = None, cache: Callable | None = None, **engine_args):
        super().__init__()
        self._cache, self._engine_args = cache, engine_args
        self.ceilings = machine_ceilings()
        self.model = course_model(model, self.ceilings.peak.bandwidth_gbps)
        self.engine = LLMEngine(**self.model.engine_args, **engine_args)
        self.label = f"{self.model.name} on {self.engine.device}"
        self.server, self.finished = None, []

    def lines(self) -> list[str]:
        """The ceilings, the model and why, the engine's memory plan."""
        return [*self.ceilings.lines(), "", *self.model.lines(), "", *self.engine.memory_plan.lines()]

    def measure(self, name: str, compute: Callable[[], dict], **params) -> dict:
        """``compute()``'s dict, cached on disk under ``name``, ``params`` and the model, device and dtype,
        with this machine's noise (``course.cached``: its ``.noise``); measured now without a cache."""
        if self._cache is None:
            return compute()
        key = params | {"model": self.model.name, "device": str(self.engine.device), "dtype": str(self.engine.dtype)}
        return self._cache(name, key, compute, noise=self.noise)

    def probe(self, max_prompt_tokens: int, repeats: int = 3, budget_s: float = 15.0) -> dict:
        """``probes.probe_speed``: kept as ``speed`` for ``estimate_s``."""
        self.speed = probe_speed(self.engine, max_prompt_tokens, budget_s, repeats)
        return self.speed

    def text_engine(self) -> LLMEngine:
        """An engine whose text means something (``CourseModel.text_engine``)."""
        return self.model.text_engine(self.engine, **self._engine_args)

    def chat(self, text: str, max_tokens: int) -> RequestMetrics:
        """One chat turn, greedy, its reply printed as it streams; its ``RequestMetrics``."""
        talker = self.text_engine()
        if talker is not self.engine:
            print(f"(the reply comes from the embedded model's real weights: {self.model.name}'s are random)\n")
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        for delta in talker.stream(talker.chat_prompt(text), params, request_id="chat"):
            print(delta, end="", flush=True)
        print()
        return request_metrics(talker.output("chat"))

    def request(self, prompt_tokens: int, output_tokens: int) -> RequestMetrics:
        """One request of real text, ``prompt_tokens`` long, answered in exactly ``output_tokens``."""
        prompt = text_prompts(self.engine.tokenizer, prompt_tokens, 1)[0]
        return request_metrics(self.engine.generate([prompt], SamplingParams.fixed_length(output_tokens))[0])

    def prefill(self, prompt_tokens: int, repeats: int = 1) -> PhaseRun:
        """``repeats`` prompts of ``prompt_tokens`` sent alone, answered in one token: median TTFT, steps."""
        ttft, steps = minieng_prefill(self.engine, text_prompts(self.engine.tokenizer, prompt_tokens, repeats))
        return PhaseRun(prompt_tokens, ttft, prompt_tokens / ttft, steps)

    def decode(self, output_tokens: int, prompt_tokens: int = 64, batch: int = 1) -> PhaseRun:
        """``batch`` requests decoding ``output_tokens`` together after ``prompt_tokens``: median TPOT, steps."""
        tpot, steps = minieng_decode(
            self.engine, text_prompts(self.engine.tokenizer, prompt_tokens, batch), output_tokens
        )
        return PhaseRun(output_tokens, tpot, batch / tpot, steps)

    def utilization(self, run: PhaseRun) -> dict | None:
        """``measure.phase_utilization`` of ``run``'s steps against this machine's measured peak."""
        dtype_bytes = self.engine.dtype.itemsize
        return phase_utilization(self.engine.model_config, dtype_bytes, run.steps, [self.ceilings.peak])

    def phase_grid(self, prompt_tokens: tuple[int, int], output_tokens: tuple[int, int], repeats: int = 1) -> dict:
        """``phase_costs.phase_cost_grid``, cached (``measure``)."""
        return self.measure(
            "phase_cost_grid",
            lambda: phase_cost_grid(self.engine, prompt_tokens, output_tokens, repeats),
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            repeats=repeats,
        )

    def hit_rate_sweep(self, prompt_tokens: int, shares, requests: int) -> dict:
        """``prefix_caching.ttft_vs_hit_rate`` (the cold point with the cache off), cached; its
        ``cached_tokens_reported`` True, ``hit_rate_source`` "engine" and ``server`` as an endpoint's."""
        return self.measure(
            "prefix_ttft",
            lambda: ttft_vs_hit_rate(self.engine, prompt_tokens, shares, requests) | self._sweep_source,
            prompt_tokens=prompt_tokens,
            shares=list(shares),
            requests=requests,
        )

    @property
    def _sweep_source(self) -> dict:
        return {"cached_tokens_reported": True, "hit_rate_source": "engine", "server": self.label}

    def hit_rate_point(self, prompt_tokens: int, share: float, requests: int, **_) -> dict:
        """One point of the sweep: ``share`` of the prompt shared, in whole blocks where over one."""
        bs = self.engine.block_manager.block_size
        shared = round(share * prompt_tokens)
        shared = min(cdiv(shared, bs) * bs if shared >= bs else shared, prompt_tokens - 1)
        return asdict(measure_point(self.engine, shared, prompt_tokens - shared, requests))

    def serve(self, start: Callable) -> None:
        """Serve the engine over HTTP: ``start(engine, on_finished)`` returns a started server with
        ``base_url`` and ``stop()`` (``serve.ServerThread(serve.build_app(engine, on_finished=...)).start()``:
        the lab layer does not import the server's). The engine's record of each request is kept."""
        self.server = start(self.engine, self.finished.append)
        self.base_url, self.served_model = self.server.base_url, served_models(self.server.base_url)[0]

    def load_requests(self, specs: list[RequestSpec], seed: int = 0) -> list[LoadRequest]:
        """``loadgen.load_requests`` with the engine's tokenizer."""
        return load_requests(specs, self.engine.tokenizer, seed=seed)

    def load(self, requests: list[LoadRequest]) -> tuple[LoadResult, ServingMetrics | None]:
        """``requests`` sent through HTTP (``loadgen.run_load``): the client's result, and the engine's
        own figures of the same requests (``serving_metrics`` of its records)."""
        before = len(self.finished)
        client = run_load(self.base_url, self.served_model, requests)
        return client, serving_metrics(self.finished[before:])

    def clock_lines(self, client: ServingMetrics, engine: ServingMetrics | None = None) -> list[str]:
        """The client's figures beside the engine's own (``report.format_two_clocks``)."""
        return format_two_clocks(client, engine)

    def stop(self) -> None:
        """Stop the server ``serve`` started (nothing else to stop)."""
        if self.server is not None:
            self.server.stop()
            self.server = None


def lesson_backend(endpoint: str | None, model: str | None = None, cache: Callable | None = None, **engine_args):
    """The backend a lesson measures: an ``EndpointBackend`` connected to ``endpoint`` (a ``/v1`` URL;
    ``model``: the served id, default its first), else an ``EngineBackend`` for ``model`` built with
    ``engine_args`` (``LLMEngine``'s keywords), its results cached through ``cache`` (``course.cached``)."""
    if endpoint:
        return EndpointBackend.connect(endpoint, model)
    return EngineBackend(model, cache, **engine_args)
