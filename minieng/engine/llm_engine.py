"""``LLMEngine``: the engine core built from an ``EngineConfig``, its features attached at their seams.

Where the wings are composed (with ``model_loading`` and ``config_checks``, the ``engine`` package is
the only one that imports them). ``EngineCore`` (``minieng/core/``) is the plain engine;
this one loads what the config names (the model, quantized; a draft; the tensor-parallel ranks:
``model_loading``), sizes the KV pool (``wings.gpu_memory``) and attaches each feature the config
turns on:

- log-probabilities: a hook on the logits the runner samples (``ModelRunner.logprobs``);
- fast paths: the runner's forward strategy (``ModelRunner.fast``: CUDA graphs, ``compile``,
  the Triton decode kernel);
- tensor parallelism: rank 0's runner sends each layout to the other ranks (``Workers.attach``);
- speculative decoding: a drafter before each schedule and verification in place of sampling
  (``Speculator``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from dataclasses import replace

from minieng.config import EngineConfig, SamplingParams
from minieng.core.engine_core import EngineCore
from minieng.core.kv_cache import KVCache
from minieng.core.llama import LlamaForCausalLM
from minieng.core.model_runner import ModelRunner
from minieng.core.block_manager import BlockManager
from minieng.core.outputs import Prompt, RequestOutput
from minieng.engine import offline
from minieng.engine.chat_template import Message, chat_token_ids
from minieng.engine.model_loading import load_engine_models
from minieng.model.loader import LoadedModel
from minieng.wings.fast_paths.strategy import build_fast_paths
from minieng.wings.gpu_memory.kv_sizing import gather_budget_tokens, size_kv_pool
from minieng.wings.logprobs import LogprobsHook
from minieng.wings.parallel.workers import closing_on_error
from minieng.wings.speculative.drafters import make_drafter
from minieng.wings.speculative.speculator import Speculator


class LLMEngine(EngineCore):
    """The engine. ``LLMEngine()`` loads the embedded default model on the best device.

    Args:
        config: an ``EngineConfig``; keyword arguments override its fields
            (``LLMEngine(max_num_seqs=8)``).
        loaded: an already loaded model (tests, or sharing weights between engines).
    With ``tensor_parallel_size`` p > 1 the engine starts p - 1 worker processes
    (``engine.workers``); ``close()`` or ``with LLMEngine(...) as engine:`` stops them (so does
    the interpreter's exit).

    Raises:
        ValueError: for a model that cannot be loaded, or a KV budget too small for one sequence
            of ``max_model_len`` tokens; for a tensor-parallel size the model or the machine cannot
            split (``config_checks.check_tensor_parallel_engine``).
        workers.WorkerError: a tensor-parallel worker that failed to start or load.
    """

    # Fields an experiment may change on a live engine: the scheduler reads them at every step.
    RECONFIGURABLE = ("max_num_batched_tokens", "enable_chunked_prefill", "num_speculative_tokens", "max_num_seqs")

    def __init__(self, config: EngineConfig | None = None, loaded: LoadedModel | None = None, **overrides):
        models = load_engine_models(replace(config or EngineConfig(), **overrides), loaded)
        config = models.config  # it names the scheme of a model quantized before it came
        self.loaded, self.workers = models.loaded, models.workers
        if self.workers:  # stopped when the engine is collected, if nobody closed it
            weakref.finalize(self, self.workers.close)
        self.matmul_bytes = models.matmul_bytes  # the products' weight bytes, scales included (None: dtype's)
        with closing_on_error(self.workers):  # a failure below leaves no worker behind
            pool = size_kv_pool(config, models.with_kv_pools, models.max_model_len, self.matmul_bytes)
            loaded = self.loaded
            super().__init__(
                config, models.model, loaded.tokenizer, loaded.eos_token_ids, pool.num_blocks, pool.max_model_len
            )
            self.memory_plan = pool.plan
            self.runner.logprobs = LogprobsHook(self.tokenizer)
            build_runner(config, self.runner, self.max_model_len, self.workers)
            if config.num_speculative_tokens:
                draft_runner = None
                if models.draft_model is not None:
                    draft_runner = runner_for(models.draft_model, pool.num_blocks, config.block_size)
                    build_runner(config, draft_runner, self.max_model_len, compile=False, query_lens=(1,))
                self.speculator = Speculator(self, make_drafter(config, draft_runner))
                self.runner.verify = self.speculator.verify

    @property
    def drafter(self):
        """The speculator's drafter (``drafters.py``), or None without speculative decoding."""
        return self.speculator.drafter if self.speculator is not None else None

    @property
    def spec_records(self) -> list[tuple[int, str, int, int]]:
        """One row per verification: (step index, request id, drafts proposed, drafts accepted),
        counted over the tokens the request emits (``Speculator.release``); [] without speculation."""
        return self.speculator.records if self.speculator is not None else []

    @contextmanager
    def reconfigured(self, **fields) -> Iterator[LLMEngine]:
        """Run a block with some of the config's per-step fields (``RECONFIGURABLE``) changed, then
        restore them, even when the block raises: ``with engine.reconfigured(max_num_seqs=8): ...``.
        ``max_num_seqs`` may only go down (buffers were sized for it); a ``num_speculative_tokens``
        above the built one runs its steps eagerly (no graph was captured for them). Raises
        ``ValueError`` for another field or a config the dataclass refuses."""
        others = sorted(set(fields) - set(self.RECONFIGURABLE))
        if others:
            raise ValueError(
                f"reconfigured({', '.join(others)}=...): only {', '.join(self.RECONFIGURABLE)} can "
                "change on a built engine; build another (LLMEngine(config, loaded=engine.loaded))"
            )
        built = self.config
        new = replace(built, **fields)  # validates: ValueError naming the field
        if new.max_num_seqs > built.max_num_seqs:
            raise ValueError(
                f"reconfigured(max_num_seqs={new.max_num_seqs}): at most the {built.max_num_seqs} "
                "the engine was built for"
            )
        self.config = self.scheduler.config = new
        try:
            yield self
        finally:
            self.config = self.scheduler.config = built

    def close(self) -> None:
        """Stop the tensor-parallel workers (a no-op without them); the engine cannot step after.
        Also called by ``with LLMEngine(...) as engine:`` and at interpreter exit."""
        if self.workers is not None:
            self.workers.close()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def chat_prompt(self, messages: str | list[Message]) -> list[int]:
        """Token ids of a conversation through the model's chat template, the generation prompt
        added, for ``add_request``/``generate``/``stream`` (``chat_template.chat_token_ids``: tokenized once,
        so no second BOS). ``messages``: ``[{"role": "user", "content": ...}, ...]`` or a str
        (one user message). Raises ``ValueError`` without a chat template, for an empty user message,
        or for text that is not valid Unicode (a lone surrogate)."""
        return chat_token_ids(self.tokenizer, messages)

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run prompts to completion together (continuous batching); outputs in prompt order.

        Under static batching, a partial batch waits for its timeout asleep (``idle_wait_s``).

        Raises:
            ValueError: for any bad prompt or params (as ``add_request``), or as many params as
                prompts missing. Every prompt is checked before any is queued, so a call that
                raises leaves the engine as it found it. Also for a static batch that can never
                fill (``batch_timeout_s=inf`` and fewer prompts than ``max_num_seqs``): its
                requests are aborted and released before it raises.
        """
        return offline.generate(self, prompts, params, use_tqdm)

    def stream(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> Iterator[str]:
        """Queue one request now and return an iterator of its text deltas, as they become safe to show.

        Their concatenation equals the final text; other queued requests advance meanwhile.
        ``engine.output(request_id)`` has the request's timestamps afterwards.
        Raises:
            ValueError: at the call (not at the first ``next``), for the input ``add_request`` refuses;
                from ``next``, for a static batch that can never fill (as ``generate``).
        """
        request_id = self.add_request(prompt, params, request_id)
        return offline.stream_deltas(self, request_id)


def runner_for(model: LlamaForCausalLM, num_blocks: int, block_size: int) -> ModelRunner:
    """A plain runner of ``model`` over a pool of its own and a block manager of its own (a draft's)."""
    return ModelRunner(model, KVCache.for_model(model, num_blocks, block_size), BlockManager(num_blocks, block_size))


def build_runner(config: EngineConfig, runner: ModelRunner, max_model_len: int, workers=None, **fast) -> None:
    """Attach to ``runner`` what ``config`` asks of it: the decodes' gather budget
    (``kv_sizing.gather_budget_tokens``), the other ranks' pools of as many blocks and the
    lockstep (``Workers``), then its fast paths (``strategy.build_fast_paths``; ``fast``: its
    ``compile`` and ``query_lens``)."""
    runner.max_gather_tokens = gather_budget_tokens(runner.kv_cache)
    if workers is not None:
        workers.allocate_kv(runner.kv_cache.num_blocks, runner.max_gather_tokens)
        workers.attach(runner)
    runner.fast = build_fast_paths(config, runner, max_model_len, **fast)
