"""LLMEngine: requests in, tokens out, one step at a time.

A step is: the scheduler picks sequences and token counts, the model runner runs them through
the model and samples, and the engine appends tokens, checks stop conditions, streams text and
records when everything happened. The engine knows nothing of metrics: it leaves timestamps
(``Sequence.times``) and step records (``StepRecord``) for ``metrics`` to turn into figures.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
import weakref
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from dataclasses import replace

from minieng.config import EngineConfig, SamplingParams
from minieng.device import synchronize
from minieng.engine import offline
from minieng.engine.block_manager import BlockManager
from minieng.engine.chat_template import EMPTY_PROMPT, Message, Prompt, chat_token_ids, check_text
from minieng.engine.detokenizer import IncrementalDetokenizer
from minieng.engine.drafters import make_drafter
from minieng.engine.kv_sizing import size_kv_pool
from minieng.engine.logprobs import PROMPT_ROWS_PER_STEP, TokenTexts, make_logprob_dicts
from minieng.engine.model_loading import load_engine_models
from minieng.engine.model_runner import ModelRunner, ModelRunnerOutput
from minieng.engine.output_processor import RequestState, append_tokens, make_output
from minieng.engine.outputs import RequestOutput, StepRecord
from minieng.engine.sampling import KeyedRandom
from minieng.engine.scheduler import Scheduler
from minieng.engine.sequence import Sequence, SequenceStatus
from minieng.engine.workers import closing_on_error
from minieng.model.loader import LoadedModel


class LLMEngine:
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

    def __init__(self, config: EngineConfig | None = None, loaded: LoadedModel | None = None, **overrides):
        models = load_engine_models(replace(config or EngineConfig(), **overrides), loaded)
        self.config = config = models.config  # it names the scheme of a model quantized before it came
        self.loaded, self.model, self.workers = models.loaded, models.model, models.workers
        if self.workers:  # stopped when the engine is collected, if nobody closed it
            weakref.finalize(self, self.workers.close)
        self.tokenizer, self.model_config = self.loaded.tokenizer, self.model.config
        self.token_texts = TokenTexts(self.tokenizer)  # each id's text, for Logprob.decoded_token
        self.matmul_bytes = models.matmul_bytes  # the products' weight bytes, scales included (None: dtype's)
        weight = self.model.embed_tokens.weight  # in the compute dtype, on the engine's device
        self.device, self.dtype = weight.device, weight.dtype
        with closing_on_error(self.workers):  # a failure below leaves no worker behind
            pool = size_kv_pool(config, models.with_kv_pools, models.max_model_len, self.matmul_bytes)
            self.max_model_len, self.memory_plan = pool.max_model_len, pool.plan
            self.block_manager = BlockManager(pool.num_blocks, config.block_size, config.enable_prefix_caching)
            self.scheduler = Scheduler(config, self.block_manager)
            self.runner = ModelRunner.build(
                config, self.model, pool.num_blocks, self.block_manager, self.max_model_len, self.workers
            )
            self.kv_cache = self.runner.kv_cache
            self.drafter = make_drafter(config, models.draft_model, pool.num_blocks, self.max_model_len)
        self._start_records()

    def _start_records(self) -> None:
        """No request yet, and empty records."""
        self.requests: dict[str, RequestState] = {}
        # The time source of every timestamp the engine records (arrivals by default, steps,
        # emissions). A simulation of several devices on one machine gives each engine a clock of its
        # own (``lab.disagg_simulation.VirtualClock``); durations are always real.
        self.clock: Callable[[], float] = time.perf_counter
        self.step_records: list[StepRecord] = []
        # One row per verification: (step index, request id, drafts proposed, drafts accepted),
        # counted over the tokens the request emits (``_count_emitted_drafts``).
        self.spec_records: list[tuple[int, str, int, int]] = []
        self._verified: dict[str, int] = {}  # this step's rows: request id -> index in spec_records
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the tensor-parallel workers (a no-op without them); the engine cannot step after.
        Also called by ``with LLMEngine(...) as engine:`` and at interpreter exit."""
        if self.workers is not None:
            self.workers.close()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------------------

    def chat_prompt(self, messages: str | list[Message]) -> list[int]:
        """Token ids of a conversation through the model's chat template, the generation prompt
        added, for ``add_request``/``generate``/``stream`` (``chat_template.chat_token_ids``: tokenized once,
        so no second BOS). ``messages``: ``[{"role": "user", "content": ...}, ...]`` or a str
        (one user message). Raises ``ValueError`` without a chat template, for an empty user message,
        or for text that is not valid Unicode (a lone surrogate)."""
        return chat_token_ids(self.tokenizer, messages)

    def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass prompts as lists of token ids")
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_s: float | None = None,
    ) -> str:
        """Queue a request; it joins the running batch at a later step. Returns its id.

        Args:
            prompt: text (tokenized as is, with the tokenizer's special tokens: for a chat, use
                ``chat_prompt``) or token ids.
            params: how it samples and stops (default ``SamplingParams()``).
            request_id: its id (default: the next free number, as a str).
            arrival_s: ``engine.clock()`` time it arrived (default: now); TTFT counts from it.
        Raises:
            ValueError: empty prompt, text that is not valid Unicode (a lone surrogate), prompt
                too long for ``max_model_len``, an id outside the vocabulary, params that are not a
                ``SamplingParams``, ``logprobs`` or ``prompt_logprobs`` above the engine's
                ``max_logprobs``, ``prompt_logprobs`` of a prompt longer than
                ``PROMPT_ROWS_PER_STEP`` + 1 tokens without chunked prefill, or a request id already
                in use. Nothing is queued then.
        """
        ids, params = self._check_request(prompt, params, request_id)
        return self._queue(ids, params, request_id, arrival_s)

    def check_request(self, prompt: Prompt, params: SamplingParams | None = None) -> list[int]:
        """Validate a request without queueing it: its token ids, or the ``ValueError`` that
        ``add_request`` would raise. Changes nothing (a server checks in its handlers, then queues
        from its engine loop)."""
        return self._check_request(prompt, params, None)[0]

    def _check_request(
        self, prompt: Prompt, params: SamplingParams | None, request_id: str | None
    ) -> tuple[list[int], SamplingParams]:
        """Validate a request without changing anything: its token ids and its params, or a ValueError."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
        cap = self.config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and k > cap:  # as vLLM's Processor._validate_logprobs refuses them
                raise ValueError(
                    f"{name}={k} is invalid: this engine returns at most max_logprobs={cap} per token "
                    f"(EngineConfig.max_logprobs): ask for {cap} or fewer, or build the engine with a "
                    "larger max_logprobs"
                )
        ids = self.tokenize(prompt)
        if not ids:
            raise ValueError(EMPTY_PROMPT)
        rows = len(ids) - 1  # the prompt positions whose logits score the next prompt token
        if (
            params.prompt_logprobs is not None
            and not self.config.enable_chunked_prefill
            and rows > PROMPT_ROWS_PER_STEP
        ):
            raise ValueError(
                f"prompt_logprobs over a prompt of {len(ids)} tokens needs chunked prefill "
                f"(enable_chunked_prefill=True), which scores {PROMPT_ROWS_PER_STEP} positions a step: "
                f"without it all {rows} rows of logits would be computed in one step, more than the "
                "memory profile counts. Enable chunked prefill, or shorten the prompt"
            )
        if params.max_tokens == 0 and len(ids) > self.max_model_len:  # scoring only: no output token
            raise ValueError(
                f"prompt has {len(ids)} tokens, more than max_model_len={self.max_model_len}: shorten the prompt"
            )
        if params.max_tokens > 0 and len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; max_model_len={self.max_model_len} must leave "
                "room for at least one output token: shorten the prompt"
            )
        vocab = self.model_config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}); got {min(ids)}..{max(ids)}")
        if request_id is not None and request_id in self.requests:
            raise ValueError(f"request_id={request_id!r} is already in use")
        return ids, params

    def _queue(self, ids: list[int], params: SamplingParams, request_id: str | None, arrival_s: float | None) -> str:
        """Queue a request ``_check_request`` accepted; this part cannot fail."""
        while request_id is None or request_id in self.requests:  # an automatic id skips ids in use
            request_id = str(next(self._ids))
        rng = None
        if not params.greedy:
            seed = params.seed if params.seed is not None else _stable_seed(self.config.seed, request_id)
            rng = KeyedRandom(seed, self.device)
        seq = Sequence(request_id, ids, params, self.clock() if arrival_s is None else arrival_s, rng)
        detok = IncrementalDetokenizer(self.tokenizer, params.stop) if self.tokenizer is not None else None
        self.requests[request_id] = RequestState(seq, detok)
        self.scheduler.add(seq)
        return request_id

    # Fields an experiment may change on a live engine: the scheduler reads them at every step.
    RECONFIGURABLE = ("max_num_batched_tokens", "enable_chunked_prefill", "num_speculative_tokens", "max_num_seqs")

    @contextmanager
    def reconfigured(self, **fields) -> Iterator[LLMEngine]:
        """Run a block with some of the config's per-step fields changed, then restore them:
        ``with engine.reconfigured(max_num_batched_tokens=256): ...``.

        The new config is validated as any ``EngineConfig`` is, and put back in ``finally``, even
        when the block raises. Only ``RECONFIGURABLE`` fields may change, and ``max_num_seqs`` only
        down (the CUDA graphs' buffers were sized for it); a ``num_speculative_tokens`` above the
        one the engine was built with runs its verification steps eagerly (no graph was captured
        for them). Raises ``ValueError`` otherwise, or for a config the dataclass refuses.
        """
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

    def abort_request(self, request_id: str) -> None:
        req = self.requests[request_id]
        if not req.seq.is_finished:
            self.scheduler.finish(req.seq, SequenceStatus.FINISHED_ABORTED)
            self._forget_draft(req.seq)
            req.seq.times.finished_s = self.clock()

    def release_request(self, request_id: str) -> RequestOutput:
        """Forget a finished request and return its final output: a long-running server calls this
        so that memory stays flat. Raises ``ValueError`` for a request still running (abort it first)
        and ``KeyError`` for an unknown id."""
        if not self.requests[request_id].seq.is_finished:
            raise ValueError(f"request {request_id!r} is still running: abort_request it first")
        out = self.output(request_id)
        del self.requests[request_id]
        return out

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def idle_wait_s(self) -> float:
        """Seconds before a ``step`` could run anything: 0 when it can now; under static batching,
        while a partial batch fills, the time left before its timeout starts it (``math.inf`` for
        an infinite timeout); ``math.inf`` with no unfinished request. A loop that drives the
        engine sleeps this long, or until a new request arrives, rather than stepping for nothing."""
        if not self.scheduler.has_unfinished():
            return math.inf
        return self.scheduler.batch_wait_s()

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step: draft, schedule, execute (the model runner), process the tokens, record.
        Returns an output for every request that emitted tokens or finished."""
        start = self.clock()
        draft_s = self._draft()
        plan, lookups = self._schedule(start)
        if not plan.scheduled:
            return []
        # The plan's composition, read now: finishing a sequence below resets its state.
        composition = (plan.num_prefill_tokens, len(plan.scheduled) - plan.num_decode_seqs, plan.num_decode_seqs)
        result = self.runner.execute(plan.scheduled)
        synchronize(self.device)
        end = self.clock()
        outputs, chunks = self._process(plan.scheduled, result, end)
        self._record(start, end, composition, len(plan.preempted), chunks, draft_s, lookups)
        return outputs

    def _process(self, scheduled: list[tuple[Sequence, int]], result: ModelRunnerOutput, now: float):
        """Advance the scheduled sequences past the KV the step wrote, keep the prompt
        log-probabilities the step computed, append each request's emitted tokens (finishing those
        that stop), finish the requests that only score their prompt (``max_tokens=0``) once it is
        computed, and cache the full blocks of those still running.
        Returns the step's outputs and its ``StepRecord.chunks``."""
        chunks = self._advance(scheduled, result)
        for rid, (first, rows) in result.prompt_logprobs.items():
            seq = self.requests[rid].seq
            assert first == len(seq.prompt_logprobs), f"{rid}: prompt log-probabilities out of order"
            seq.prompt_logprobs.extend(make_logprob_dicts(rows, self.token_texts))
        outputs = []
        for rid, tokens in result.sampled_token_ids.items():
            rows = result.logprobs.get(rid)
            logprobs = None if rows is None else make_logprob_dicts(rows, self.token_texts)
            outputs.append(self._append(self.requests[rid], tokens, now, logprobs))
        for seq, _ in scheduled:
            if seq.params.max_tokens == 0 and seq.num_computed_tokens >= seq.num_prompt_tokens:
                outputs.append(self._finish_scored(self.requests[seq.request_id], now))
            elif not seq.is_finished:
                self.block_manager.cache_full_blocks(seq)
        return outputs, chunks

    def _finish_scored(self, req: RequestState, now: float) -> RequestOutput:
        """Finish a request that scores its prompt without generating (``max_tokens=0``, with
        ``prompt_logprobs``) once the prompt is computed: reason "length", no output token (as
        vLLM finishes one), its full blocks cached before they are freed."""
        seq = req.seq
        self.block_manager.cache_full_blocks(seq)
        self.scheduler.finish(seq, SequenceStatus.FINISHED_LENGTH)
        self._forget_draft(seq)
        seq.times.finished_s = now
        delta = req.detokenizer.finish() if req.detokenizer is not None else ""
        return make_output(req, [], delta)

    def _record(self, start: float, end: float, composition, num_preempted: int, chunks, draft_s: float, lookups):
        """Append the step's ``StepRecord``: ``composition`` is (prefill tokens, prefill sequences,
        decode sequences), read before the step changed them; the rest is read now."""
        num_prefill_tokens, num_prefill_seqs, num_decode_seqs = composition
        self.step_records.append(
            StepRecord(
                start_s=start,
                duration_s=end - start,
                num_prefill_tokens=num_prefill_tokens,
                num_prefill_seqs=num_prefill_seqs,
                num_decode_seqs=num_decode_seqs,
                num_preempted=num_preempted,
                num_running=len(self.scheduler.running),
                num_waiting=len(self.scheduler.waiting),
                num_used_blocks=self.block_manager.num_used_blocks,
                chunks=chunks,
                num_evictions=self.block_manager.num_evictions,
                draft_s=draft_s,
                forward_s=self.runner.last_forward_s,
                comm_s=self.runner.last_comm_s,
                forward_path=self.runner.last_forward_path,
                prefix_cache_lookups=lookups,
            )
        )

    def _draft(self) -> float:
        """Speculative decoding: the drafter proposes tokens for the running sequences. Seconds it took."""
        if self.drafter is None:
            return 0.0
        start = self.clock()
        self._propose()
        synchronize(self.device)
        return self.clock() - start

    def _schedule(self, start: float):
        """The scheduler's plan for this step, and the prefix-cache lookups of the sequences it
        admits for the first time (``StepRecord.prefix_cache_lookups``); the drafts of preempted
        sequences are forgotten, and each newly scheduled sequence notes when it first ran."""
        plan = self.scheduler.schedule()
        for seq in plan.preempted:
            self._forget_draft(seq)
        lookups = []
        for seq, _ in plan.scheduled:
            if seq.times.first_scheduled_s is None:
                seq.times.first_scheduled_s = start
                if seq.params.prompt_logprobs is None:  # the others skip reading the cache (as vLLM's)
                    lookups.append((seq.num_prompt_tokens, seq.num_cached_tokens))
        return plan, lookups

    def _advance(self, scheduled: list[tuple[Sequence, int]], result: ModelRunnerOutput) -> list[tuple[int, int, int]]:
        """Move each scheduled sequence past the tokens whose KV the step wrote (with drafts: the
        newest token and the accepted ones; the rejected drafts' KV trimmed) and return the step's
        ``StepRecord.chunks``."""
        chunks = []
        self._verified = {}
        for seq, n in scheduled:
            tokens = result.sampled_token_ids.get(seq.request_id, [])
            # 1, or k + 1 (and the prompt positions of prompt log-probabilities); 0 mid-prompt
            chunks.append((n, seq.num_computed_tokens, result.num_logits_rows.get(seq.request_id, 0)))
            if seq.spec_token_ids:  # the newest token and the accepted drafts now have KV
                accepted = len(tokens) - 1
                self.spec_records.append((len(self.step_records), seq.request_id, len(seq.spec_token_ids), accepted))
                self._verified[seq.request_id] = len(self.spec_records) - 1
                seq.num_computed_tokens += 1 + accepted
                self.block_manager.trim(seq, seq.num_computed_tokens)  # drop the rejected drafts' KV
                seq.spec_token_ids = []
            else:
                seq.num_computed_tokens += n
        return chunks

    def _propose(self) -> None:
        """Ask the drafter for up to k tokens for every running sequence that is decoding, never
        more than its ``max_tokens`` or ``max_model_len`` leaves room for (k drafts emit k + 1)."""
        k = self.config.num_speculative_tokens
        decoding = [s for s in self.scheduler.running if s.output_token_ids and s.num_uncomputed_tokens == 1]
        room = [
            max(0, min(k, s.params.max_tokens - len(s.output_token_ids) - 1, self.max_model_len - s.num_tokens - 1))
            for s in decoding
        ]
        for seq, tokens in zip(decoding, self.drafter.propose(decoding, room)):
            seq.spec_token_ids = tokens

    def _forget_draft(self, seq: Sequence) -> None:
        if self.drafter is not None:
            self.drafter.free(seq.request_id)

    def _append(self, req: RequestState, token_ids: list[int], now: float, logprobs=None) -> RequestOutput:
        """Add a step's emitted tokens (and their ``logprobs`` dicts, if asked) to a request
        (``output_processor.append_tokens``) and finish it if it stops: only tokens it kept count
        as computed (drafts accepted past a stop are dropped, their log-probabilities with them),
        and its full blocks are cached before they are freed."""
        seq = req.seq
        kept, delta, status = append_tokens(req, token_ids, self.loaded.eos_token_ids, self.max_model_len, logprobs)
        seq.times.emissions.append((now, len(kept)))
        if status:
            self._count_emitted_drafts(seq.request_id, len(kept))
            seq.num_computed_tokens = min(seq.num_computed_tokens, seq.num_tokens - 1)
            self.block_manager.cache_full_blocks(seq)
            self.scheduler.finish(seq, status)
            self._forget_draft(seq)
            seq.times.finished_s = now
        return make_output(req, kept, delta)

    def _count_emitted_drafts(self, request_id: str, kept: int) -> None:
        """Count a finishing request's last verification over the tokens it emitted.

        The convention: acceptance over the tokens a request emits. A verification that ends the
        request (EOS, a stop token or string) emits ``kept`` tokens; the drafts accepted past them
        never reach the output (``append_tokens`` drops them, as vLLM's and llama.cpp's servers drop
        them from theirs), so a draft position past the end counts neither as proposed nor as
        accepted: the row becomes (min(proposed, kept), min(accepted, kept)). Draft positions
        within the output keep their verdicts, a rejected one included. Why: every figure is then
        about the output the user got, the acceptance rate over the draft positions it reached, and
        1 + accepted / verifications (the mean acceptance length, ``metrics.acceptance_metrics``)
        the tokens per step the user sees, but for a last verification that ends on an accepted
        draft (no target token follows it: one fewer); counting the dropped drafts would credit
        the draft with tokens nobody got.
        ``max_tokens`` and ``max_model_len`` never cut a run: ``_propose`` drafts no more than
        they leave room for."""
        i = self._verified.get(request_id)
        if i is not None:
            step, rid, proposed, accepted = self.spec_records[i]
            self.spec_records[i] = (step, rid, min(proposed, kept), min(accepted, kept))

    def output(self, request_id: str, new_token_ids: list[int] | None = None, delta: str = "") -> RequestOutput:
        """The current state of a request. Raises ``KeyError`` for an unknown id."""
        return make_output(self.requests[request_id], new_token_ids, delta)

    # -- conveniences ---------------------------------------------------------------------------

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


def _stable_seed(engine_seed: int, request_id: str) -> int:
    """A per-request seed that is the same in every process (Python's ``hash`` of a str is not)."""
    digest = hashlib.sha256(f"{engine_seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
