"""CUDA graphs for the decode step: the whole forward launched as one replay.

Why: a decode step of a small model is hundreds of tiny kernels, and launching them one by one
from Python costs more than running them. On an H200 an eager step took ~14 ms for a 135M, a
1.7B and a 7.4B model alike; the same forward captured in a CUDA graph replayed in 2.2 / 2.6 /
5.7 ms at batch 1 (docs/measurements.md). A graph replays fixed kernels on fixed addresses, so
everything that varies between steps must live in *static buffers* that the step overwrites
before the replay (as nano-vllm's and gpt-fast's capture do):

- ``input_ids``, ``positions``, ``slot_mapping``: [max batch x max query length];
- ``context_lens``: [max batch]; ``block_tables``: [max batch, max width in blocks], padded with
  the null block;
- ``logits``: [max batch x max query length, vocab] float32, the output every graph writes.

Shapes are fixed too, so graphs are captured for *buckets*, once, at start-up: batch sizes 1, 2,
4, 8, ... up to ``max_num_seqs`` (always included, so 12, 100 or 600 are covered), times block-table
widths 8, 16, 32, ... blocks up to ``max_model_len`` (attention gathers a bucket's whole width,
so a short context should not pay for the longest one), times the query lengths a decode step
can have: 1, and under speculative decoding 2 .. k + 1 (a verification step runs k + 1 tokens
per sequence). A step of ``n`` sequences whose widest block table has ``w`` blocks replays the
smallest bucket that holds both. The real sequences are followed by padding ones: token 0 at
position 0, writing their K/V into the scratch block (``KVCache.scratch_slot``), which no block
table holds, and attending only the null block's zeros, which nothing writes. So whatever a
padding row computes (a NaN, in fp16) never reaches a later step. A bucket whose gathered K/V would exceed
``max_gather_tokens`` is not captured; steps that need it, or a width beyond the largest bucket,
run eagerly.

Only decode steps are captured: prefill and mixed steps vary in token count and stay eager.
On a CPU (tests) ``capture=False`` keeps the buckets and static buffers and runs the forward
eagerly on them, so the bucketing and padding logic is tested without a GPU.
"""

from __future__ import annotations

import time

import torch

from minieng.config import EngineConfig
from minieng.wings.fast_paths.forward_paths import FastPathFailed
from minieng.core.attention import AttentionMetadata, block_table_tensor, decode_mask
from minieng.core.kv_cache import KVCache
from minieng.core.llama import LlamaForCausalLM
from minieng.units import cdiv

MIN_WIDTH_BLOCKS = 8


def capture_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... below ``max_num_seqs``, then ``max_num_seqs`` itself: every batch has a bucket."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs={max_num_seqs} must be >= 1")
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


def capture_widths(max_blocks: int, min_blocks: int = MIN_WIDTH_BLOCKS) -> list[int]:
    """Block-table widths ``min_blocks``, 2 x, 4 x, ... below ``max_blocks``, then ``max_blocks``."""
    if max_blocks < 1:
        raise ValueError(f"max_blocks={max_blocks} must be >= 1")
    widths, w = [], min_blocks
    while w < max_blocks:
        widths.append(w)
        w *= 2
    return widths + [max_blocks]


def smallest_at_least(sizes: list[int], n: int) -> int | None:
    """The smallest of the sorted ``sizes`` that is >= ``n``, or None."""
    return next((s for s in sizes if s >= n), None)


class DecodeGraphs:
    """Static decode buffers and one captured graph per (query length, batch, width) bucket.

    Args:
        model, kv_cache: what the graphs run; the cache's tensors must never be reallocated.
        max_num_seqs: the largest batch a decode step can have.
        max_model_len: the longest sequence, which sets the widest block table.
        max_gather_tokens: buckets whose batch x width x block_size exceeds it are not captured
            (but for the one-query buckets of ``attention_backend="triton"``, which gather nothing).
        query_lens: tokens per sequence of the decode steps to capture: (1,), or (1, 2, .., k + 1)
            under speculative decoding with k draft tokens.
        capture: False runs the forward eagerly on the static buffers (CPU tests).
    Attributes:
        capture_s: seconds the capture took at start-up; ``num_graphs``: buckets captured.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: KVCache,
        max_num_seqs: int,
        max_model_len: int,
        max_gather_tokens: int,
        query_lens: tuple[int, ...] = (1,),
        capture: bool = True,
        regions=None,
        attention_backend: str = "sdpa",
    ):
        self.model = model
        self.regions = regions  # compiled layer parts, captured inside the graphs
        self.attention_backend = attention_backend
        self.decode_attention = None  # one-query decodes' attention (``AttentionMetadata.decode_attention``)
        if attention_backend == "triton":
            from minieng.wings.fast_paths.triton_attention import decode_attention  # lazy: triton is optional

            self.decode_attention = decode_attention
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.batch_sizes = capture_batch_sizes(max_num_seqs)
        self.widths = capture_widths(cdiv(max_model_len, self.block_size))
        self.query_lens = sorted(set(query_lens))
        # A bucket's decodes gather batch x width x block_size keys a layer, within the budget; the
        # Triton kernel reads one query's keys in place and gathers nothing (a verification step's
        # k + 1 queries still gather: ``attention.paged_attention``).
        in_place = attention_backend == "triton"
        self.buckets = [
            (q, b, w)
            for q in self.query_lens
            for b in self.batch_sizes
            for w in self.widths
            if (in_place and q == 1) or b * w * self.block_size <= max_gather_tokens
        ]
        self.device = device = kv_cache.k.device
        self.rows, self.width = rows, width = self.batch_sizes[-1], self.widths[-1]
        self.tokens = tokens = rows * self.query_lens[-1]
        # Every input lives in one device buffer with a pinned host twin, so a step costs one
        # host-to-device copy: [input_ids | positions | slot_mapping] of ``tokens`` entries each,
        # [context_lens] of ``rows``, then the block tables [rows, width].
        size = 3 * tokens + rows + rows * width
        self._device_inputs = torch.empty(size, dtype=torch.long, device=device)
        self._host_inputs = torch.empty(size, dtype=torch.long, pin_memory=device.type == "cuda")
        (self.input_ids, self.positions, self.slot_mapping, self.context_lens, self.block_tables) = self._views(
            self._device_inputs
        )
        for buf, value in zip(
            self._views(self._device_inputs), (0, 0, kv_cache.scratch_slot, self.query_lens[-1], kv_cache.null_block)
        ):
            buf.fill_(value)  # what the warm-up and capture run on: padding sequences only
        self._host_inputs.copy_(self._device_inputs)
        self.logits_indices = torch.arange(tokens, device=device)
        # Every graph writes its logits here: one buffer, not one per bucket (a 128k vocabulary
        # at 256 rows is 128 MB of float32 logits).
        self.logits = torch.empty(tokens, model.config.vocab_size, dtype=torch.float32, device=device)
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.captured = capture
        self.capture_s = self._capture() if capture else 0.0

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    def _views(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """input_ids, positions, slot_mapping [tokens], context_lens [rows], block_tables [rows, width]."""
        t, r = self.tokens, self.rows
        return (
            flat[:t],
            flat[t : 2 * t],
            flat[2 * t : 3 * t],
            flat[3 * t : 3 * t + r],
            flat[3 * t + r :].view(r, self.width),
        )

    def _forward(self, q: int, b: int, w: int) -> torch.Tensor:
        """The forward of bucket (q, b, w) on the static buffers: logits [b * q, vocab]."""
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[: b * q],
            num_decodes=b,
            decode_block_tables=self.block_tables[:b, :w],
            decode_mask=None  # the Triton kernel masks one query by context length
            if self.decode_attention is not None and q == 1
            else decode_mask(self.context_lens[:b], w * self.block_size, q, self.kv_cache.kv.dtype),
            prefills=[],
            decode_query_len=q,
            decode_context_lens=self.context_lens[:b],
            decode_attention=self.decode_attention if q == 1 else None,
        )
        return self.model(
            self.input_ids[: b * q],
            self.positions[: b * q],
            self.kv_cache,
            meta,
            self.logits_indices[: b * q],
            self.regions,
        )

    @torch.inference_mode()
    def _capture(self) -> float:
        """Capture every bucket, largest first (later graphs reuse the first one's memory pool).

        Raises whatever the capture raises (out of memory, an op that cannot be captured); the
        engine then runs eagerly (``capture_decode_graphs``).
        """
        start = time.perf_counter()
        pool = None
        with torch.cuda.device(self.device):  # torch.cuda.graph captures on the current device
            for q, b, w in sorted(self.buckets, key=lambda k: (k[0] * k[1], k[2]), reverse=True):
                self._forward(q, b, w)  # warm-up: lazy initialisation (cuBLAS handles, kernels) outside capture
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.logits[: b * q].copy_(self._forward(q, b, w))
                pool = graph.pool()
                self.graphs[(q, b, w)] = graph
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def bucket(self, query_len: int, batch: int, width: int) -> tuple[int, int, int] | None:
        """The captured bucket for ``batch`` sequences of ``query_len`` tokens with block tables up
        to ``width`` blocks, or None."""
        b, w = smallest_at_least(self.batch_sizes, batch), smallest_at_least(self.widths, width)
        key = (query_len, b, w)
        return key if b is not None and w is not None and key in self.buckets else None

    def run(self, lay) -> torch.Tensor | None:
        """Logits [rows of ``lay``, vocab] of one decode step, or None when no bucket fits it (run eagerly).

        ``lay``: a ``model_runner.StepLayout`` with no chunks (every sequence runs
        ``lay.query_len`` tokens). The logits are a view of the static output: valid until the
        next replay.
        """
        q, n = lay.query_len, len(lay.decodes)
        key = self.bucket(q, n, max(len(table) for table, _ in lay.decodes))
        if key is None:
            return None
        _, b, w = key
        pad = (b - n) * q
        ids, pos, slots, lens, tables = self._views(self._host_inputs)
        ids[: b * q] = torch.tensor(lay.input_ids + [0] * pad)
        pos[: b * q] = torch.tensor(lay.positions + [0] * pad)
        slots[: b * q] = torch.tensor(lay.slot_mapping + [self.kv_cache.scratch_slot] * pad)
        # A padding sequence's context is its q tokens: each query sees at least one (null) key.
        lens[:b] = torch.tensor([c for _, c in lay.decodes] + [q] * (b - n))
        tables[:b, :w] = block_table_tensor([t for t, _ in lay.decodes] + [[]] * (b - n), w, self.kv_cache.null_block)
        # One copy: the token and row vectors whole, then the first b rows of the tables (what
        # bucket (q, b, w) reads; stale entries beyond it are never read). The host buffer is
        # rewritten only after the step synchronizes (the runner reads the logits), so
        # non_blocking is safe.
        used = 3 * self.tokens + self.rows + b * self.width
        self._device_inputs[:used].copy_(self._host_inputs[:used], non_blocking=True)
        if self.captured:
            self.graphs[key].replay()
            return self.logits[: n * q]
        return self._forward(q, b, w)[: n * q]


def capture_decode_graphs(
    config: EngineConfig,
    model: LlamaForCausalLM,
    kv_cache: KVCache,
    max_model_len: int,
    max_gather_tokens: int | None,
    query_lens: tuple[int, ...] | None = None,
    regions=None,
) -> DecodeGraphs | None:
    """CUDA graphs of the decode step over ``kv_cache``: None on a CPU, with ``enforce_eager``, or with
    tensor parallelism (collectives inside captured graphs are untested here). Raises
    ``forward_paths.FastPathFailed``, saying what to lower, when the capture fails (out of memory,
    an op the capture refuses, a Triton kernel that does not compile): the runner then decodes
    without graphs (``forward_paths.fall_back``).

    ``query_lens``: tokens per sequence of the captured steps; by default 1, and with speculative
    decoding every verification width 2 .. k + 1 (experiments lower k at run time).
    ``max_gather_tokens``: the decode's gather budget (``kv_sizing.gather_budget_tokens``): a
    bucket gathers batch x width x block_size tokens of K/V per layer (and holds them in the
    graphs' pool), so the scratch and the warm-up beside it fit the memory the KV sizing left out.
    """
    if kv_cache.k.device.type != "cuda" or config.enforce_eager or config.tensor_parallel_size > 1:
        return None
    if query_lens is None:
        query_lens = tuple(range(1, config.num_speculative_tokens + 2))
    try:
        return DecodeGraphs(
            model,
            kv_cache,
            config.max_num_seqs,
            max_model_len,
            max_gather_tokens,
            query_lens=query_lens,
            regions=regions,
            attention_backend=config.attention_backend,
        )
    except Exception as e:  # noqa: BLE001 (out of memory, an op the capture refuses, Triton's CompilationError)
        why = f"{type(e).__name__}: {str(e)[:300]}"
        raise FastPathFailed(
            "cuda_graph",
            why,
            f"CUDA graph capture failed ({why}); decode steps run eagerly. "
            "Lower gpu_memory_utilization or max_num_seqs, or pass enforce_eager=True.",
        ) from e
