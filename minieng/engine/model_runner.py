"""From a scheduled batch to sampled tokens: builds the step's tensors, runs the model, samples.

The runner decides nothing: the scheduler said which sequences run with how many tokens; the
runner lays them out (single-token rows first, then multi-token chunks), computes slots from
the block tables, runs one forward pass and samples one token for every sequence whose chunk
reached the end of its known tokens. A prefill chunk that stops mid-prompt produces no token. A
decode that carries k draft tokens gets logits at all k + 1 positions and emits what
verification accepts. Log-probabilities are read from those same float32 rows, on every forward
path alike (``execute``, ``engine/logprobs.py``); a request asking for its prompt's adds the rows
of the prompt positions it is still owed, after the sampling rows (``StepLayout.prompt_rows``).

A single-token row is attended the same way whether it is a decode or the last token of a
prompt: one query over its whole context, itself included. So every step made only of
single-token rows is a *decode step*, and on CUDA it replays a captured graph
(``cuda_graph.DecodeGraphs``) instead of launching each kernel from Python. The same holds for a
step whose sequences all run the same small number n of tokens, which is what speculative
decoding's verification steps are (n = k + 1): they are laid out as decodes of n queries each,
attended together. Prefill and mixed steps run eagerly. With ``compile=True`` on a CPU, decode
steps of one query per sequence run the whole compiled step (``compilation.run_decode``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from minieng.config import EngineConfig
from minieng.device import synchronize
from minieng.engine.block_manager import BlockManager
from minieng.engine.compilation import (
    EAGER,
    MIN_DECODE_WIDTH,
    CompiledParts,
    compile_model,
    fits_decode_step,
    run_decode,
)
from minieng.engine.cuda_graph import capture_decode_graphs
from minieng.engine.forward_paths import COMPILED_REGIONS, COMPILED_STEP, CUDA_GRAPH, fall_back
from minieng.engine.forward_paths import EAGER as EAGER_PATH
from minieng.engine.kv_sizing import gather_budget_tokens
from minieng.engine.logprobs import RowLogprobs, gather_logprobs
from minieng.engine.sampling import probabilities, sample
from minieng.engine.sequence import Sequence
from minieng.engine.verification import verify_coupled, verify_greedy
from minieng.model.attention import build_metadata
from minieng.model.kv_cache import KVCache
from minieng.model.llama import LlamaForCausalLM

# The most tokens per sequence a step may run and still be laid out as a decode step (speculative
# verification runs k + 1); longer uniform chunks are prefills, attended chunk by chunk.
MAX_DECODE_QUERY_LEN = 16


@dataclass
class StepLayout:
    """A step laid out as plain lists (before any tensor is made).

    Rows: the decodes first (``decodes``, ``query_len`` rows each: 1, or the n of a step whose
    every sequence runs n tokens), then multi-token chunks (``chunks``). ``sampling`` lists, per
    sequence that samples, ``(sequence, number of logits rows)``: 1, or k + 1 for a decode
    verifying k drafts; ``logits_indices`` are those rows, in that order, then the rows of
    ``prompt_rows``: per request still owed prompt log-probabilities,
    ``(sequence, first position, number of positions)``, the positions of its chunk whose logits
    give a prompt token's log-probability (only requests that asked: the others' prompt positions
    run no LM head, as before).
    """

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slot_mapping: list[int] = field(default_factory=list)
    decodes: list[tuple[list[int], int]] = field(default_factory=list)  # (block_table, context_len)
    chunks: list[tuple[int, list[int], int]] = field(default_factory=list)  # (q_len, block_table, context_len)
    logits_indices: list[int] = field(default_factory=list)
    sampling: list[tuple[Sequence, int]] = field(default_factory=list)
    prompt_rows: list[tuple[Sequence, int, int]] = field(default_factory=list)
    query_len: int = 1

    @property
    def plain(self) -> StepLayout:
        """The layout without its sequences: the plain lists a tensor-parallel worker runs."""
        return replace(self, sampling=[], prompt_rows=[])


@dataclass
class ModelRunnerOutput:
    """What one step produced, by request id (vLLM's ``ModelRunnerOutput``).

    ``sampled_token_ids``: the tokens each sampling request emits (one, or the accepted drafts
    and one more). ``logprobs``: for the requests that asked (``SamplingParams.logprobs``), one
    ``RowLogprobs`` per emitted token, in order. ``prompt_logprobs``: for the requests owed
    prompt log-probabilities, ``(first prompt token index, rows)``: the rows of prompt tokens
    ``first .. first + len(rows) - 1``. ``num_logits_rows``: rows the LM head ran on, per request
    with any.
    """

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[RowLogprobs]] = field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[int, list[RowLogprobs]]] = field(default_factory=dict)
    num_logits_rows: dict[str, int] = field(default_factory=dict)


class NonFiniteLogitsError(RuntimeError):
    """The forward pass produced NaN or inf logits (an activation overflowed the dtype)."""


def allocate_kv_cache(model: LlamaForCausalLM, num_blocks: int, config: EngineConfig) -> KVCache:
    """This rank's KV pool for ``model``: ``num_blocks`` blocks of ``config.block_size`` tokens in
    the model's dtype, on its device, in the shape of this rank's share (``model.local_config``).
    With ``attention_backend="triton"`` the decode kernels' variants are compiled on it now
    (``triton_attention.warm_up``), not in a run's first steps or inside a graph capture. Every
    rank's runner allocates its pool here (``ModelRunner.build``, ``workers``' ranks)."""
    param = next(model.parameters())
    kv_cache = KVCache(model.local_config, num_blocks, config.block_size, param.dtype, param.device)
    if config.attention_backend == "triton":
        from minieng.model.triton_attention import warm_up  # lazy: triton is optional

        warm_up(kv_cache.layers[0].blocks, model.local_config.num_attention_heads, kv_cache.null_block)
    return kv_cache


class ModelRunner:
    """Runs scheduled batches through ``model`` over ``kv_cache``.

    ``ModelRunner.build`` makes one with everything it owns (its KV pool, compiled parts, CUDA
    graphs, gather budget, the other ranks' pools); the constructor takes them ready-made.
    ``graphs``: a ``cuda_graph.DecodeGraphs`` that decode steps replay, or None (always eager).
    ``max_gather_tokens``: the most keys an eager step's decodes gather per layer at once
    (``kv_sizing.gather_budget_tokens``; wider batches are attended in groups); None: no limit.
    ``compiled``: what ``compile=True`` built (``compilation.CompiledParts``), or ``EAGER``.
    ``workers``: the other ranks of a tensor-parallel model (``workers.Workers``): each step's
    layout goes to them before this rank runs it, so all run it in lockstep. A worker's own
    runner has no block manager: it runs the layouts it is sent (``run_layout``).
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: KVCache,
        block_manager: BlockManager | None,
        graphs=None,
        max_gather_tokens: int | None = None,
        compiled: CompiledParts = EAGER,
        attention_backend: str = "sdpa",
        workers=None,
    ):
        self.model = model
        self.workers = workers
        self.regions = compiled.regions  # the layers' compiled parts (engine.compilation), or None: eager
        self.compiled_decode = compiled.decode  # the compiled CPU decode step, or None
        self.compile_s = compiled.compile_s  # seconds compiling took at start-up, or None: eager
        self.attention_backend = attention_backend  # the decodes' attention: "sdpa" or "triton"
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.device = kv_cache.kv.device
        self.graphs = graphs
        self.max_gather_tokens = max_gather_tokens
        self.last_forward_s = 0.0
        self.last_comm_s = 0.0  # of last_forward_s, this rank's time in tensor-parallel collectives
        self.last_forward_path = EAGER_PATH  # how the last forward ran (forward_paths.FORWARD_PATHS)
        self.dropped_paths: dict[str, str] = {}  # fast paths that failed to build: path -> why

    @classmethod
    def build(
        cls,
        config: EngineConfig,
        model: LlamaForCausalLM,
        num_blocks: int,
        block_manager: BlockManager,
        max_model_len: int,
        workers=None,
        compile: bool | None = None,
        query_lens: tuple[int, ...] | None = None,
    ) -> ModelRunner:
        """A runner of ``model`` with what it owns, built in the order each needs the last:

        1. its KV pool: ``num_blocks`` blocks of ``config.block_size`` tokens in ``model``'s dtype,
           on its device, in the shape of this rank's share (``model.local_config``); with
           ``attention_backend="triton"``, the decode kernels' variants compiled on it
           (``triton_attention.warm_up``: a run then compiles none);
        2. the decodes' gather budget (``kv_sizing.gather_budget_tokens``), and the other ranks'
           pools of as many blocks (``workers.Workers.allocate_kv``: the block manager's blocks are
           every rank's);
        3. with ``compile`` (default ``config.compile``) the compiled parts
           (``compilation.compile_model``; the seconds it took in ``compile_s``);
        4. on CUDA, the decode step's graphs for ``query_lens`` (``cuda_graph.capture_decode_graphs``).

        A fast path that fails to build (3, 4) leaves the slower one, with a warning and its reason
        in ``dropped_paths``; with ``config.strict_forward_paths`` it raises
        (``forward_paths.fall_back``).
        """
        kv_cache = allocate_kv_cache(model, num_blocks, config)
        gather_tokens = gather_budget_tokens(kv_cache)
        if workers is not None:
            workers.allocate_kv(num_blocks, gather_tokens)
        strict, dropped = config.strict_forward_paths, {}
        compiled = EAGER
        if config.compile if compile is None else compile:
            compiled = fall_back(lambda: compile_model(model, kv_cache), EAGER, strict, dropped)
        graphs = fall_back(
            lambda: capture_decode_graphs(
                config, model, kv_cache, max_model_len, gather_tokens, query_lens, compiled.regions
            ),
            None,
            strict,
            dropped,
        )
        runner = cls(model, kv_cache, block_manager, graphs, gather_tokens, compiled, config.attention_backend, workers)
        runner.dropped_paths = dropped
        return runner

    def layout(self, scheduled: list[tuple[Sequence, int]]) -> StepLayout:
        """Lay out a step. ``scheduled``: (sequence, new tokens) in any order."""
        out = StepLayout()
        if scheduled and len({n for _, n in scheduled}) == 1 and scheduled[0][1] <= MAX_DECODE_QUERY_LEN:
            out.query_len = scheduled[0][1]
        ordered = [item for item in scheduled if item[1] == out.query_len] + [
            item for item in scheduled if item[1] != out.query_len
        ]
        prompt_indices: list[int] = []  # rows for prompt log-probabilities, after the sampling rows
        for seq, n in ordered:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            first_row = len(out.input_ids)
            known = seq.token_ids(start, end)
            out.input_ids.extend(known + seq.spec_token_ids[: n - len(known)])
            out.positions.extend(range(start, end))
            out.slot_mapping.extend(self.block_manager.slot_mapping(seq, start, end))
            if n == out.query_len:
                out.decodes.append((seq.block_table, end))
            else:  # a prefill chunk, or a decode verifying drafts: several queries, causal
                out.chunks.append((n, seq.block_table, end))
            # The chunk reaches the newest token: sample after it (a request scoring its prompt
            # with max_tokens=0 samples nothing).
            if end >= seq.num_tokens and seq.params.max_tokens > 0:
                rows = end - seq.num_tokens + 1  # 1, or k + 1 when verifying k drafts
                out.logits_indices.extend(range(len(out.input_ids) - rows, len(out.input_ids)))
                out.sampling.append((seq, rows))
            if owed := seq.owed_prompt_positions(start, end):  # their logits score prompt tokens p + 1
                prompt_indices.extend(range(first_row + owed.start - start, first_row + owed.stop - start))
                out.prompt_rows.append((seq, owed.start, len(owed)))
        out.logits_indices.extend(prompt_indices)
        return out

    def prepare(self, scheduled: list[tuple[Sequence, int]]):
        """Lay out a step as tensors for an eager forward; zero the blocks allocated since the last step.

        Returns input_ids, positions, metadata, logits_indices, and ``StepLayout.sampling``.
        """
        self.kv_cache.zero_blocks(self.block_manager.take_fresh_blocks())
        return self._tensors(self.layout(scheduled))

    def _tensors(self, lay: StepLayout):
        dev = self.device
        meta = build_metadata(
            lay.slot_mapping,
            lay.decodes,
            lay.chunks,
            self.kv_cache.block_size,
            self.kv_cache.null_block,
            dev,
            lay.query_len,
            self.max_gather_tokens,
            self.attention_backend,
            MIN_DECODE_WIDTH if self.compiled_decode is not None else 1,
            self.kv_cache.kv.dtype,
        )
        return (
            torch.tensor(lay.input_ids, dtype=torch.long, device=dev),
            torch.tensor(lay.positions, dtype=torch.long, device=dev),
            meta,
            torch.tensor(lay.logits_indices, dtype=torch.long, device=dev),
            lay.sampling,
        )

    def forward(self, scheduled: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, list[tuple[Sequence, int]]]:
        """One forward pass: logits [rows that sample, vocab] float32 and ``StepLayout.sampling``
        (the rows of ``StepLayout.prompt_rows``, if any, follow the sampling rows).

        A decode step runs ``decode``, any other ``prefill`` (``run_layout``).
        Raises ``NonFiniteLogitsError`` when the logits hold NaN or inf.
        """
        logits, lay = self.forward_layout(scheduled)
        return logits, lay.sampling

    def forward_layout(self, scheduled: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, StepLayout]:
        """``forward``, returning the whole ``StepLayout`` the logits rows follow."""
        fresh = self.block_manager.take_fresh_blocks()
        lay = self.layout(scheduled)
        if self.workers is None:
            return self._check(self.run_layout(lay, fresh)), lay
        self.workers.step(lay.plain, fresh)  # plain lists: what a worker runs
        try:
            logits = self.run_layout(lay, fresh)
        except BaseException as e:  # the ranks are out of step now: name a dead worker, close them all
            self.workers.abandon(e)
        return self._check(logits), lay

    def run_layout(self, lay: StepLayout, fresh_blocks: list[int]) -> torch.Tensor:
        """Zero ``fresh_blocks`` (allocated since the last step), then run ``lay``: a step of
        single-token rows (or of k + 1 rows each, verifying drafts) is a ``decode``; any step with
        a multi-token chunk is a ``prefill`` (a mixed step included). Returns the logits
        [rows that sample, vocab]."""
        self.kv_cache.zero_blocks(fresh_blocks)
        return self.prefill(lay) if lay.chunks else self.decode(lay)

    def decode(self, lay: StepLayout) -> torch.Tensor:
        """A decode step, by the fastest of its three forwards that fits it: a CUDA graph's replay
        (``cuda_graph.DecodeGraphs.run``), the compiled CPU decode step (``compilation.run_decode``,
        when ``compilation.fits_decode_step``), else the model's eager forward."""
        if self.graphs is not None:
            logits = self.graphs.run(lay)
            if logits is not None:
                self.last_forward_path = CUDA_GRAPH
                return sampled_rows(logits, lay)
        input_ids, positions, meta, logits_indices, _ = self._tensors(lay)
        if self.compiled_decode is not None and fits_decode_step(meta):
            self.last_forward_path = COMPILED_STEP
            return sampled_rows(
                run_decode(self.compiled_decode, self.model, self.kv_cache, input_ids, positions, meta), lay
            )
        return self._eager(input_ids, positions, meta, logits_indices)

    def prefill(self, lay: StepLayout) -> torch.Tensor:
        """A step with prompt chunks (decodes beside them, in a mixed step): the model's forward,
        eager, its layers' compiled regions with ``compile=True``."""
        input_ids, positions, meta, logits_indices, _ = self._tensors(lay)
        return self._eager(input_ids, positions, meta, logits_indices)

    def _eager(self, input_ids, positions, meta, logits_indices) -> torch.Tensor:
        """The model's forward: its layers' compiled regions with ``compile=True``, else eager."""
        self.last_forward_path = EAGER_PATH if self.regions is None else COMPILED_REGIONS
        return self.model(input_ids, positions, self.kv_cache, meta, logits_indices, self.regions)

    @property
    def last_step_graphed(self) -> bool:
        """Whether the last forward replayed a CUDA graph."""
        return self.last_forward_path == CUDA_GRAPH

    def _check(self, logits: torch.Tensor) -> torch.Tensor:
        if not bool(torch.isfinite(logits).all()):
            dtype = next(self.model.parameters()).dtype
            hint = (
                " float16's largest value is 65,504, and some models' activations exceed it: "
                "use dtype='bfloat16' where the GPU has it, or 'float32'."
                if dtype == torch.float16
                else " Check the weights (load_format, checkpoint)."
            )
            raise NonFiniteLogitsError(
                f"the model produced non-finite logits in {str(dtype).removeprefix('torch.')}." + hint
            )
        return logits

    def execute(self, scheduled: list[tuple[Sequence, int]]) -> ModelRunnerOutput:
        """Run one step: the tokens each sampling sequence emits, by request id (one token, or, for
        a decode with drafts, the accepted drafts and one more: ``verification.py``), and the
        log-probabilities the requests asked for (``logprobs``: every path's logits rows go
        through the same ``_logprobs``)."""
        tp = self.model.tp
        start, comm_before = time.perf_counter(), tp.comm_s
        logits, lay = self.forward_layout(scheduled)
        synchronize(self.device)
        self.last_forward_s = time.perf_counter() - start  # the model alone: the rest is bookkeeping
        self.last_comm_s = tp.comm_s - comm_before
        tokens = self._sample(logits, lay.sampling)
        result = ModelRunnerOutput(sampled_token_ids=tokens)
        for seq, rows in lay.sampling:
            result.num_logits_rows[seq.request_id] = rows
        for seq, _, count in lay.prompt_rows:
            result.num_logits_rows[seq.request_id] = result.num_logits_rows.get(seq.request_id, 0) + count
        self._logprobs(logits, lay, tokens, result)
        return result

    def _logprobs(
        self, logits: torch.Tensor, lay: StepLayout, tokens: dict[str, list[int]], result: ModelRunnerOutput
    ) -> None:
        """Fill ``result.logprobs`` and ``result.prompt_logprobs`` from ``logits`` [sampling rows,
        then prompt rows, vocab], in one ``gather_logprobs`` over the rows asked for. An emitted
        token's is read at the row that predicted it: with drafts, accepted draft i's at the
        target's row i and the last token's at the row after the last accepted draft."""
        rows, targets, tops, owners = [], [], [], []
        row = 0
        for seq, num_rows in lay.sampling:
            k = seq.params.logprobs
            if k is not None:
                emitted = tokens[seq.request_id]
                rows.extend(range(row, row + len(emitted)))
                targets.extend(emitted)
                tops.extend([k] * len(emitted))
                owners.append((seq, len(emitted), None))
            row += num_rows
        for seq, first, count in lay.prompt_rows:
            rows.extend(range(row, row + count))
            targets.extend(seq.prompt_token_ids[first + 1 : first + 1 + count])
            tops.extend([seq.params.prompt_logprobs] * count)
            owners.append((seq, count, first + 1))
            row += count
        if not rows:
            return
        index = torch.tensor(rows, dtype=torch.long, device=logits.device)
        gathered = gather_logprobs(logits[index], targets, tops)
        at = 0
        for seq, count, first_prompt_token in owners:
            if first_prompt_token is None:
                result.logprobs[seq.request_id] = gathered[at : at + count]
            else:
                result.prompt_logprobs[seq.request_id] = (first_prompt_token, gathered[at : at + count])
            at += count

    def _sample(self, logits: torch.Tensor, sampling: list[tuple[Sequence, int]]) -> dict[str, list[int]]:
        """The tokens each sampling sequence emits, by request id."""
        plain = [(i, seq) for i, (seq, rows) in enumerate(sampling) if rows == 1]
        out: dict[str, list[int]] = {}
        if plain:
            rows = torch.tensor([self._row(sampling, i) for i, _ in plain], device=logits.device)
            tokens = sample(
                logits[rows],
                [s.params for _, s in plain],
                [s.rng for _, s in plain],
                [len(s.output_token_ids) for _, s in plain],
            )
            out.update({seq.request_id: [tok] for (_, seq), tok in zip(plain, tokens)})
        for i, (seq, rows) in enumerate(sampling):
            if rows > 1:
                first = self._row(sampling, i)
                out[seq.request_id] = verify(seq, logits[first : first + rows])
        return out

    @staticmethod
    def _row(sampling: list[tuple[Sequence, int]], i: int) -> int:
        """The first logits row of the ``i``-th sampling sequence."""
        return sum(rows for _, rows in sampling[:i])


def sampled_rows(logits: torch.Tensor, lay: StepLayout) -> torch.Tensor:
    """The rows of ``logits`` [every row of ``lay``, vocab] that ``lay.logits_indices`` asks for
    (the sampling rows, then those of prompt log-probabilities): all of them, or fewer when a
    single-token row is a prompt chunk that stops mid-prompt."""
    if lay.logits_indices == list(range(len(lay.input_ids))):
        return logits
    return logits[torch.tensor(lay.logits_indices, dtype=torch.long, device=logits.device)]


def verify(seq: Sequence, logits: torch.Tensor) -> list[int]:
    """Check ``seq``'s draft tokens against the target's ``logits`` [k + 1, vocab]: greedy, or
    coupled with the request's keyed noise (``verification.py`` says why not the rejection rule)."""
    drafts = seq.spec_token_ids
    if seq.params.greedy:
        return verify_greedy(drafts, logits)
    first = len(seq.output_token_ids)  # the output position the first draft stands at
    noise = torch.stack([seq.rng.exponentials(first + i, logits.shape[-1]) for i in range(len(drafts) + 1)])
    return verify_coupled(drafts, probabilities(logits, seq.params), noise)
