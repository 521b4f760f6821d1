"""From a scheduled batch to sampled tokens: lay the step out, run the model, sample.

The runner decides nothing: the scheduler said which sequences run with how many tokens; the
runner lays them out (single-token rows first, then multi-token chunks), computes slots from
the block tables, runs one forward pass and samples one token for every sequence whose chunk
reached the end of its known tokens. A prefill chunk that stops mid-prompt produces no token.

A single-token row is attended the same way whether it is a decode or the last token of a
prompt: one query over its whole context. So a step made only of single-token rows is a
*decode* step (``decode``), and any step with a multi-token chunk a *prefill* (``prefill``, a
mixed step included). A step whose sequences all run the same small number n of tokens is laid
out as decodes of n queries each (speculative decoding's steps, n = k + 1).

The seams, None in the plain engine, set by ``minieng.engine.llm_engine`` for a feature that is on:
``fast``, a faster forward (``wings.fast_paths``); ``verify``, in place of sampling for a sequence
that carries k speculative tokens; ``logprobs``, a reader of the logits before they are sampled.
Tensor parallelism wraps ``run_layout``, so that every device runs each layout.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from minieng.core.attention import build_metadata
from minieng.core.block_manager import BlockManager
from minieng.core.kv_cache import KVCache
from minieng.core.llama import LlamaForCausalLM
from minieng.core.sampling import sample
from minieng.core.sequence import Sequence
from minieng.device import synchronize
from minieng.units import cdiv

# The most tokens per sequence a step may run and still be laid out as a decode step (k + 1 with
# k speculative tokens); longer uniform chunks are prefills, attended chunk by chunk.
MAX_DECODE_QUERY_LEN = 16
EAGER = "eager"  # the forward path of a step no fast path ran (``StepRecord.forward_path``)


@dataclass
class StepLayout:
    """A step laid out as plain lists (before any tensor is made).

    Rows: the decodes first (``decodes``, ``query_len`` rows each), then multi-token chunks
    (``chunks``). ``sampling``: per sequence that samples, ``(sequence, logits rows)``: 1, or
    k + 1 with k speculative tokens. ``logits_indices``: those rows in that order, then the rows
    of ``prompt_rows``: per request owed prompt log-probabilities, ``(sequence, first position,
    positions)``, the positions of its chunk whose logits score the next prompt token.
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
        """The layout without its sequences: plain lists, to send to another process."""
        return replace(self, sampling=[], prompt_rows=[])


@dataclass
class ModelRunnerOutput:
    """What one step produced, by request id (vLLM's ``ModelRunnerOutput``).

    ``sampled_token_ids``: the tokens each sampling request emits (one, or with speculative tokens
    those accepted and one more). ``logprobs``: per emitted token, a ``{token id: Logprob}`` dict, for the requests that
    asked. ``prompt_logprobs``: ``(first prompt token index, dicts)`` for requests owed them.
    ``num_logits_rows``: rows the LM head ran on, per request with any.
    """

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[dict]] = field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[int, list[dict]]] = field(default_factory=dict)
    num_logits_rows: dict[str, int] = field(default_factory=dict)


class NonFiniteLogitsError(RuntimeError):
    """The forward pass produced NaN or inf logits (an activation overflowed the dtype)."""


class ModelRunner:
    """Runs scheduled batches through ``model`` over ``kv_cache``.

    ``block_manager``: where the sequences' blocks and slots are (None on a process that runs the
    layouts another sends: ``run_layout``). ``max_gather_tokens``: the most keys an eager step's
    decodes gather per layer at once (wider batches are attended in groups); None: no limit.
    """

    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, block_manager: BlockManager | None):
        self.model, self.kv_cache, self.block_manager = model, kv_cache, block_manager
        self.device = kv_cache.kv.device
        self.max_gather_tokens: int | None = None
        self.min_decode_width = 1  # the narrowest decode block table, in blocks (a fast path may ask more)
        self.decode_attention: Callable | None = None  # attends one-query decodes in place of the gather
        self.fast: Callable | None = None  # (runner, layout) -> its logits by a fast path, or None: eager
        self.verify: Callable | None = None  # (sequence, logits [k + 1, vocab]) -> its emitted tokens
        self.logprobs: Callable | None = None  # (logits, layout, tokens, output): fills the output's
        self.last_forward_s = 0.0
        self.last_comm_s = 0.0  # of last_forward_s, the seconds spent in collectives between devices
        self.last_forward_path = EAGER

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
            else:  # a prefill chunk, or a decode with several tokens: several queries, causal
                out.chunks.append((n, seq.block_table, end))
            # The chunk reaches the newest token: sample after it (unless it only scores its prompt).
            if end >= seq.num_tokens and seq.params.max_tokens > 0:
                rows = end - seq.num_tokens + 1  # 1, or k + 1 with k speculative tokens
                out.logits_indices.extend(range(len(out.input_ids) - rows, len(out.input_ids)))
                out.sampling.append((seq, rows))
            if owed := seq.owed_prompt_positions(start, end):  # their logits score prompt tokens p + 1
                prompt_indices.extend(range(first_row + owed.start - start, first_row + owed.stop - start))
                out.prompt_rows.append((seq, owed.start, len(owed)))
        out.logits_indices.extend(prompt_indices)
        return out

    def tensors(self, lay: StepLayout):
        """input_ids and positions [rows] int64, the ``AttentionMetadata``, logits_indices [rows asked]."""
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
            self.min_decode_width,
            self.kv_cache.kv.dtype,
            self.decode_attention,
        )
        ids = torch.tensor(lay.input_ids, dtype=torch.long, device=dev)
        positions = torch.tensor(lay.positions, dtype=torch.long, device=dev)
        return ids, positions, meta, torch.tensor(lay.logits_indices, dtype=torch.long, device=dev)

    def execute(self, scheduled: list[tuple[Sequence, int]]) -> ModelRunnerOutput:
        """Run one step: the tokens each sampling sequence emits, by request id, and the
        log-probabilities the requests asked for. Raises ``NonFiniteLogitsError`` for NaN or inf logits."""
        start = time.perf_counter()
        lay = self.layout(scheduled)
        logits = self.run_layout(lay, self.block_manager.take_fresh_blocks())  # every device runs it (parallel)
        synchronize(self.device)
        self.last_forward_s = time.perf_counter() - start  # the model alone: the rest is bookkeeping
        check_finite(logits, self.model)
        tokens = self.sample(logits, lay.sampling)
        result = ModelRunnerOutput(sampled_token_ids=tokens)
        for seq, rows in lay.sampling:
            result.num_logits_rows[seq.request_id] = rows
        for seq, _, count in lay.prompt_rows:
            result.num_logits_rows[seq.request_id] = result.num_logits_rows.get(seq.request_id, 0) + count
        if self.logprobs is not None:
            self.logprobs(logits, lay, tokens, result)
        return result

    def run_layout(self, lay: StepLayout, fresh_blocks: list[int]) -> torch.Tensor:
        """Zero ``fresh_blocks`` (allocated since the last step), then run ``lay``: by a fast path
        where one fits it (``fast``), else as a ``decode`` or, with a multi-token chunk, a
        ``prefill``. Returns the logits [rows asked, vocab] float32."""
        self.kv_cache.zero_blocks(fresh_blocks)
        if self.fast is not None and (logits := self.fast(self, lay)) is not None:
            return logits
        return self.prefill(lay) if lay.chunks else self.decode(lay)

    def decode(self, lay: StepLayout) -> torch.Tensor:
        """Single-token rows (or k + 1 each, with speculative tokens): attended together, each over its
        whole context, from one gather of their blocks. The same forward as ``prefill``: only the
        layout differs, and with it the ``AttentionMetadata`` (``attention.paged_attention``)."""
        input_ids, positions, meta, logits_indices = self.tensors(lay)
        self.last_forward_path = EAGER
        return self.model(input_ids, positions, self.kv_cache, meta, logits_indices)

    def prefill(self, lay: StepLayout) -> torch.Tensor:
        """Prompt chunks (and decodes beside them, a mixed step): each chunk attends its cached
        context and itself, causally."""
        input_ids, positions, meta, logits_indices = self.tensors(lay)
        self.last_forward_path = EAGER
        return self.model(input_ids, positions, self.kv_cache, meta, logits_indices)

    def sample(self, logits: torch.Tensor, sampling: list[tuple[Sequence, int]]) -> dict[str, list[int]]:
        """The tokens each sampling sequence emits, by request id: one sampled token, or, for a
        sequence with k speculative tokens (k + 1 rows), what ``verify`` accepts."""
        firsts = list(itertools.accumulate((rows for _, rows in sampling), initial=0))  # each one's first row
        plain = [(first, seq) for first, (seq, rows) in zip(firsts, sampling) if rows == 1]
        out: dict[str, list[int]] = {}
        if plain:
            rows = torch.tensor([first for first, _ in plain], device=logits.device)
            seqs = [seq for _, seq in plain]
            tokens = sample(
                logits[rows], [s.params for s in seqs], [s.rng for s in seqs], [len(s.output_token_ids) for s in seqs]
            )
            out.update({seq.request_id: [tok] for seq, tok in zip(seqs, tokens)})
        for first, (seq, rows) in zip(firsts, sampling):
            if rows > 1:
                out[seq.request_id] = self.verify(seq, logits[first : first + rows])
        return out


def profile_step(
    num_tokens: int, longest: int, block_size: int
) -> tuple[list[int], list[tuple[int, list[int], int]], list[int], int]:
    """The layout of a profile step of ``num_tokens`` prompt tokens: sequences no longer than
    ``longest`` (the RoPE table; a token budget may exceed ``max_model_len``), each in its own blocks.

    Returns ``(slot_mapping, chunks, positions, num_blocks)``, with ``chunks`` as
    ``attention.build_metadata`` takes them.
    """
    chunks, slots, positions, first = [], [], [], 0
    for start in range(0, num_tokens, longest):
        n = min(longest, num_tokens - start)
        table = list(range(first, first + cdiv(n, block_size)))
        chunks.append((n, table, n))
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(n))
        positions.extend(range(n))
        first += len(table)
    return slots, chunks, positions, first


def throwaway_forward(
    model, input_ids: torch.Tensor, logits_indices: torch.Tensor, block_size: int = 16, regions=None
) -> tuple[torch.Tensor, int]:
    """One forward of ``input_ids`` [n] as fresh prompts (each no longer than the model's RoPE
    table, in blocks of its own: ``profile_step``) over a KV pool made for this call and dropped
    after it (``regions``: as ``LlamaForCausalLM.forward``'s). Returns the logits at
    ``logits_indices`` [rows, vocab] float32 and the pool's bytes."""
    device = input_ids.device
    slots, chunks, positions, num_blocks = profile_step(input_ids.numel(), model.rope.max_position, block_size)
    cache = KVCache.for_model(model, num_blocks, block_size)
    meta = build_metadata(slots, [], chunks, block_size, cache.null_block, device)
    logits = model(input_ids, torch.tensor(positions, device=device), cache, meta, logits_indices, regions)
    return logits, cache.nbytes


def check_finite(logits: torch.Tensor, model: LlamaForCausalLM) -> None:
    """Raise ``NonFiniteLogitsError`` when ``logits`` hold NaN or inf, saying what to change."""
    if bool(torch.isfinite(logits).all()):
        return
    dtype = next(model.parameters()).dtype
    hint = (
        " float16's largest value is 65,504, and some models' activations exceed it: "
        "use dtype='bfloat16' where the GPU has it, or 'float32'."
        if dtype == torch.float16
        else " Check the weights (load_format, checkpoint)."
    )
    raise NonFiniteLogitsError(f"the model produced non-finite logits in {str(dtype).removeprefix('torch.')}." + hint)
