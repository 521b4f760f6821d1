"""The engine core: requests in, tokens out, one step at a time (vLLM's ``EngineCore``).

A step: the scheduler picks sequences and token counts, the model runner runs them through the
model and samples, and the core appends tokens, checks stop conditions, streams text and records
when everything happened: timestamps (``Sequence.times``) and step records (``StepRecord``), which
``measure`` turns into figures.

``EngineCore(config, model, tokenizer, eos_token_ids, num_blocks, max_model_len)`` is the plain
engine. ``minieng.LLMEngine`` builds one from an ``EngineConfig`` and attaches the features it asks
for at their seams: the runner's (``ModelRunner``), and ``speculator``, speculative decoding's
proposer, called before each schedule (``propose``) and when a sequence stops running (``release``).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from collections.abc import Callable

from minieng.config import EngineConfig, SamplingParams
from minieng.core.block_manager import BlockManager
from minieng.core.kv_cache import KVCache
from minieng.core.llama import LlamaForCausalLM
from minieng.core.model_runner import ModelRunner, ModelRunnerOutput
from minieng.core.outputs import (
    EMPTY_PROMPT,
    IncrementalDetokenizer,
    Prompt,
    RequestOutput,
    RequestState,
    StepRecord,
    append_tokens,
    check_text,
    make_output,
)
from minieng.core.sampling import KeyedRandom
from minieng.core.scheduler import PROMPT_ROWS_PER_STEP, Scheduler
from minieng.core.sequence import Sequence, SequenceStatus
from minieng.device import synchronize


class EngineCore:
    """The plain engine over a built ``model`` (a ``LlamaForCausalLM``).

    Args:
        config: the engine's knobs (the scheduler's, the block size, ``max_logprobs``, ``seed``);
            ``num_blocks`` and ``max_model_len`` below are what its sizes came to.
        model: the model, on its device and in its dtype (``model.loader.load_model``).
        tokenizer: a transformers tokenizer, or None (prompts are then token ids, outputs have no text).
        eos_token_ids: the ids that end a request (EOS, end of turn).
        num_blocks: the KV pool's blocks of ``config.block_size`` tokens.
        max_model_len: the longest sequence, prompt and output.
    Raises:
        ValueError: a pool too small for one sequence of ``max_model_len`` tokens.
    """

    def __init__(
        self, config: EngineConfig, model: LlamaForCausalLM, tokenizer, eos_token_ids, num_blocks, max_model_len
    ):
        if num_blocks * config.block_size < max_model_len:
            raise ValueError(
                f"a KV pool of {num_blocks} blocks x {config.block_size} tokens cannot hold one sequence of "
                f"max_model_len={max_model_len} tokens: give more blocks, or a smaller max_model_len"
            )
        self.config, self.model, self.model_config = config, model, model.config
        self.tokenizer, self.eos_token_ids, self.max_model_len = tokenizer, set(eos_token_ids), max_model_len
        weight = model.embed_tokens.weight  # in the compute dtype, on the engine's device
        self.device, self.dtype = weight.device, weight.dtype
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.kv_cache = KVCache.for_model(model, num_blocks, config.block_size)
        self.runner = ModelRunner(model, self.kv_cache, self.block_manager)
        self.speculator = None  # speculative decoding's proposer (``wings.speculative``), or None
        self.requests: dict[str, RequestState] = {}
        # The time source of every timestamp the engine records; a simulation of several devices
        # on one machine gives each engine a clock of its own. Durations are always real.
        self.clock: Callable[[], float] = time.perf_counter
        self.step_records: list[StepRecord] = []
        self._ids = itertools.count()

    def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass prompts as lists of token ids")
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None, arrival_s=None
    ) -> str:
        """Queue a request; it joins the running batch at a later step. Returns its id.

        ``prompt``: text (tokenized as is, special tokens included) or token ids; ``params``: how it
        samples and stops (default ``SamplingParams()``); ``request_id``: default, the next free
        number; ``arrival_s``: its ``clock()`` time (default: now), whence TTFT counts.
        Raises ``ValueError`` as ``check_request`` does, or for an id in use; nothing is queued then.
        """
        ids, params = self._check_request(prompt, params, request_id)
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

    def check_request(self, prompt: Prompt, params: SamplingParams | None = None) -> list[int]:
        """A request's token ids, or the ``ValueError`` ``add_request`` would raise: an empty prompt,
        text that is not valid Unicode, a prompt too long for ``max_model_len``, an id outside the
        vocabulary, params that are not a ``SamplingParams``, ``logprobs`` or ``prompt_logprobs``
        above ``max_logprobs`` (or from an engine without them), ``prompt_logprobs`` of a prompt over
        ``PROMPT_ROWS_PER_STEP`` + 1 tokens without chunked prefill. Changes nothing."""
        return self._check_request(prompt, params, None)[0]

    def _check_request(self, prompt, params, request_id) -> tuple[list[int], SamplingParams]:
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
        cap = self.config.max_logprobs if self.runner.logprobs is not None else None
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and cap is None:
                raise ValueError(f"{name}={k}: this engine computes no log-probabilities: use minieng.LLMEngine")
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
        chunked = self.config.enable_chunked_prefill
        if params.prompt_logprobs is not None and not chunked and rows > PROMPT_ROWS_PER_STEP:
            raise ValueError(
                f"prompt_logprobs over a prompt of {len(ids)} tokens needs chunked prefill "
                f"(enable_chunked_prefill=True), which scores {PROMPT_ROWS_PER_STEP} positions a step: "
                f"without it all {rows} rows of logits would be computed in one step, more than the "
                "memory profile counts. Enable chunked prefill, or shorten the prompt"
            )
        room = 0 if params.max_tokens == 0 else 1  # scoring only: no output token
        if len(ids) + room > self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; max_model_len={self.max_model_len} must hold it"
                + (" and at least one output token" if room else "")
                + ": shorten the prompt"
            )
        vocab = self.model_config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}); got {min(ids)}..{max(ids)}")
        if request_id is not None and request_id in self.requests:
            raise ValueError(f"request_id={request_id!r} is already in use")
        return ids, params

    def abort_request(self, request_id: str) -> None:
        req = self.requests[request_id]
        if not req.seq.is_finished:
            self._finish(req.seq, SequenceStatus.FINISHED_ABORTED, self.clock())

    def release_request(self, request_id: str) -> RequestOutput:
        """Forget a finished request and return its final output (a server calls this, so that
        memory stays flat). Raises ``ValueError`` for a request still running, ``KeyError`` for an
        unknown id."""
        if not self.requests[request_id].seq.is_finished:
            raise ValueError(f"request {request_id!r} is still running: abort_request it first")
        out = self.output(request_id)
        del self.requests[request_id]
        return out

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def idle_wait_s(self) -> float:
        """Seconds before a ``step`` could run anything: 0 now; while a static batch fills, the time
        left before its timeout (``math.inf``: none); ``math.inf`` with no unfinished request."""
        if not self.scheduler.has_unfinished():
            return math.inf
        return self.scheduler.batch_wait_s()

    def output(self, request_id: str, new_token_ids: list[int] | None = None, delta: str = "") -> RequestOutput:
        """The current state of a request. Raises ``KeyError`` for an unknown id."""
        return make_output(self.requests[request_id], new_token_ids, delta)

    def step(self) -> list[RequestOutput]:
        """Run one step: (propose speculative tokens,) schedule, execute (the model runner), process
        the tokens, record. Returns an output for every request that emitted tokens or finished."""
        start = self.clock()
        propose_s = self.speculator.propose(self) if self.speculator is not None else 0.0
        plan = self.scheduler.schedule()
        for seq in plan.preempted:
            self._release(seq)
        if not plan.scheduled:
            return []
        lookups = []  # prefix-cache lookups of the sequences admitted for the first time
        for seq, _ in plan.scheduled:
            if seq.times.first_scheduled_s is None:
                seq.times.first_scheduled_s = start
                if seq.params.prompt_logprobs is None:  # the others skip reading the cache (as vLLM's)
                    lookups.append((seq.num_prompt_tokens, seq.num_cached_tokens))
        # The plan's composition, read now: finishing a sequence below resets its state.
        composition = (plan.num_prefill_tokens, len(plan.scheduled) - plan.num_decode_seqs, plan.num_decode_seqs)
        result = self.runner.execute(plan.scheduled)
        synchronize(self.device)
        end = self.clock()
        chunks = self._advance(plan.scheduled, result)
        outputs = self._process(plan.scheduled, result, end)
        self._record(start, end, composition, len(plan.preempted), chunks, propose_s, lookups)
        return outputs

    def _advance(self, scheduled: list[tuple[Sequence, int]], result: ModelRunnerOutput):
        """Move each sequence past the tokens whose KV the step wrote (with k speculative tokens, the
        newest and those accepted: the rejected ones' KV trimmed). Returns ``StepRecord.chunks``."""
        chunks = []
        for seq, n in scheduled:
            tokens = result.sampled_token_ids.get(seq.request_id, [])
            chunks.append((n, seq.num_computed_tokens, result.num_logits_rows.get(seq.request_id, 0)))
            proposed, seq.spec_token_ids = seq.spec_token_ids, []
            rejected = len(proposed) - (len(tokens) - 1) if proposed else 0
            seq.num_computed_tokens += n - rejected
            if rejected:
                self.block_manager.trim(seq, seq.num_computed_tokens)
        return chunks

    def _process(self, scheduled: list[tuple[Sequence, int]], result: ModelRunnerOutput, now: float):
        """Keep the step's prompt log-probabilities, append the emitted tokens (finishing requests that
        stop, or that only score their prompt), cache the full blocks of those still running."""
        for rid, (first, dicts) in result.prompt_logprobs.items():
            seq = self.requests[rid].seq
            assert first == len(seq.prompt_logprobs), f"{rid}: prompt log-probabilities out of order"
            seq.prompt_logprobs.extend(dicts)
        outputs = []
        for rid, tokens in result.sampled_token_ids.items():
            req, logprobs = self.requests[rid], result.logprobs.get(rid)
            kept, delta, status = append_tokens(req, tokens, self.eos_token_ids, self.max_model_len, logprobs)
            req.seq.times.emissions.append((now, len(kept)))
            if status:  # tokens accepted past a stop were dropped: only the kept ones count as computed
                req.seq.num_computed_tokens = min(req.seq.num_computed_tokens, req.seq.num_tokens - 1)
                self._finish(req.seq, status, now, len(kept))
            outputs.append(make_output(req, kept, delta))
        for seq, _ in scheduled:
            if seq.params.max_tokens == 0 and seq.num_computed_tokens >= seq.num_prompt_tokens:
                req = self.requests[seq.request_id]  # scored its prompt: "length", no output token (as vLLM)
                self._finish(seq, SequenceStatus.FINISHED_LENGTH, now)
                outputs.append(make_output(req, [], req.detokenizer.finish() if req.detokenizer else ""))
            elif not seq.is_finished:
                self.block_manager.cache_full_blocks(seq)
        return outputs

    def _finish(self, seq: Sequence, status: SequenceStatus, now: float, num_kept: int | None = None) -> None:
        """Finish ``seq``: its full blocks cached before the scheduler frees them, and the
        speculator told (``num_kept``: the tokens its last step emitted; None for an abort)."""
        if status != SequenceStatus.FINISHED_ABORTED:
            self.block_manager.cache_full_blocks(seq)
        self.scheduler.finish(seq, status)
        seq.times.finished_s = now
        self._release(seq, num_kept)

    def _release(self, seq: Sequence, num_kept: int | None = None) -> None:
        """Tell the speculator that ``seq`` stopped running (preempted, finished or aborted)."""
        if self.speculator is not None:
            self.speculator.release(seq, num_kept)

    def _record(self, start, end, composition, num_preempted: int, chunks, propose_s: float, lookups) -> None:
        """Append the step's ``StepRecord``; ``composition`` was read before the step changed it."""
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
                draft_s=propose_s,
                forward_s=self.runner.last_forward_s,
                comm_s=self.runner.last_comm_s,
                forward_path=self.runner.last_forward_path,
                prefix_cache_lookups=lookups,
            )
        )


def _stable_seed(engine_seed: int, request_id: str) -> int:
    """A per-request seed that is the same in every process (Python's ``hash`` of a str is not)."""
    digest = hashlib.sha256(f"{engine_seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
