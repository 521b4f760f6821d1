"""Hand a prefilled request from one engine to another: its KV blocks and its state.

This is the mechanism of disaggregated serving (Splitwise, Patel et al. 2024; DistServe, Zhong et
al. 2024): a prefill engine runs a request's prompt and samples its first token, then the
request leaves it, K/V included, and joins a decode engine's running batch, which goes on from
the second token without computing the prompt again. Here both engines live in one process and
the hand-off is a tensor copy between their KV pools; how long a real link would take is the
business of ``lab.disagg_simulation``, not of this module.

- ``export_prefilled``: in the source engine, a request whose prompt is computed and whose first
  token is out leaves the scheduler; its blocks go back to the source pool (the full ones stay in
  its prefix cache, for later prompts that share them) and a copy of their K/V travels in a
  ``KVHandoff`` with the request's state (tokens, sampling generator, detokenizer, timestamps).
- ``admit_prefilled``: the destination engine takes blocks for the request (reusing, through its
  own prefix cache, full blocks it already holds with the same tokens: those are shared, not
  copied), writes the K/V into the others, and adds the request to its running batch with
  ``num_computed_tokens`` = the prompt. ``can_admit`` says beforehand whether it fits.

Both engines must run the same model with the same ``block_size`` and dtype (the caller's duty
for the weights; shapes are checked). Speculative decoding is refused: a drafter keeps KV of
its own, which this does not move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from minieng.config import ModelConfig
from minieng.core.kv_cache import KVCache
from minieng.core.sequence import Sequence, SequenceStatus
from minieng.units import cdiv

if TYPE_CHECKING:
    from minieng.engine.llm_engine import LLMEngine


@dataclass
class KVHandoff:
    """A request in transit between engines.

    Attributes:
        request: the engine's record of the request (its ``Sequence`` as ``request.seq``, and its
            detokenizer): it moves as is, so timestamps and sampled tokens carry on.
        k, v: the K/V of its blocks, each [layers, blocks, block_size, kv_heads, head_dim], on the
            source's device; slots past ``num_computed_tokens`` in the last block hold zeros.
        num_computed_tokens: tokens whose K/V are in ``k``/``v`` (the prompt: every token but the
            newest, sampled one).
        model_config: the source's model shape, checked against the destination's.
        kv_bytes: the K/V of ``num_computed_tokens`` tokens, in bytes (what a link would carry).
    """

    request: Any
    k: torch.Tensor
    v: torch.Tensor
    num_computed_tokens: int
    model_config: ModelConfig
    kv_bytes: int

    @property
    def seq(self) -> Sequence:
        return self.request.seq

    @property
    def request_id(self) -> str:
        return self.request.seq.request_id

    @property
    def block_size(self) -> int:
        return self.k.shape[2]


def is_prefilled(seq: Sequence) -> bool:
    """Whether ``seq`` is ready to hand off: running, prompt computed, first token sampled, and
    nothing else (no draft tokens)."""
    return (
        seq.status is SequenceStatus.RUNNING
        and bool(seq.output_token_ids)
        and seq.num_computed_tokens == seq.num_tokens - 1
        and not seq.spec_token_ids
    )


def export_prefilled(engine: LLMEngine, request_id: str) -> KVHandoff:
    """Take a prefilled request out of ``engine``, with a copy of its K/V.

    Afterwards ``engine`` no longer knows the request (it is not in ``engine.requests``), its
    blocks are free in ``engine``'s pool, and the full ones remain in its prefix cache.
    Raises:
        KeyError: an unknown request id.
        ValueError: a request that is not a finished prefill (``is_prefilled``), or an engine
            with speculative decoding.
    """
    _refuse_kv_elsewhere(engine)
    req = engine.requests[request_id]
    seq = req.seq
    if not is_prefilled(seq):
        raise ValueError(
            f"request {request_id!r} is not a finished prefill ({seq}): hand a request off "
            "after the step that samples its first token"
        )
    n = seq.num_computed_tokens
    k, v = read_blocks(engine.kv_cache, seq.block_table[: cdiv(n, engine.block_manager.block_size)])
    engine.scheduler.detach(seq)  # blocks back to the pool; this resets num_computed_tokens
    seq.status = SequenceStatus.WAITING  # in transit
    del engine.requests[request_id]
    return KVHandoff(req, k, v, n, engine.model_config, n * engine.model_config.kv_bytes_per_token(k.dtype.itemsize))


def can_admit(engine: LLMEngine, handoff: KVHandoff) -> bool:
    """Whether ``engine`` can take ``handoff`` now: a place in its running batch
    (``Scheduler.can_join_running``) and enough free blocks, counting prefix-cache hits. Changes nothing."""
    if not engine.scheduler.can_join_running():
        return False
    bm, seq = engine.block_manager, handoff.seq
    hits = bm.match_prefix(seq)
    return bm.can_allocate(seq, handoff.num_computed_tokens - len(hits) * bm.block_size, hits)


def admit_prefilled(engine: LLMEngine, handoff: KVHandoff) -> str:
    """Place ``handoff`` in ``engine``: blocks, K/V, and a place in the running batch. Returns its id.

    Full blocks already in ``engine``'s prefix cache with the same tokens are shared (their ref
    count rises); the rest are allocated and overwritten with the hand-off's K/V. The request
    decodes from ``engine``'s next step.
    Raises:
        ValueError: another model shape, block size or dtype; a request id already in use; a
            sequence too long for ``engine.max_model_len``; an engine with speculative decoding.
        RuntimeError: no room now (``can_admit`` is False): no blocks or no place in the batch.
    """
    _refuse_kv_elsewhere(engine)
    seq, bm = handoff.seq, engine.block_manager
    if handoff.model_config != engine.model_config:
        raise ValueError("the hand-off comes from another model shape: both engines must run the same model")
    if handoff.block_size != bm.block_size or handoff.k.dtype != engine.kv_cache.k.dtype:
        raise ValueError(
            f"the hand-off has block_size={handoff.block_size} and {handoff.k.dtype}; this engine "
            f"has block_size={bm.block_size} and {engine.kv_cache.k.dtype}: configure them alike"
        )
    if seq.request_id in engine.requests:
        raise ValueError(f"request_id={seq.request_id!r} is already in use in this engine")
    if seq.num_tokens >= engine.max_model_len:
        raise ValueError(
            f"request {seq.request_id!r} has {seq.num_tokens} tokens; this engine's "
            f"max_model_len={engine.max_model_len} leaves no room to decode"
        )
    if not can_admit(engine, handoff):
        raise RuntimeError(
            f"no room for request {seq.request_id!r} now ({bm.num_free_blocks} free blocks, "
            f"{len(engine.scheduler.running)} running): check can_admit and retry after a step"
        )
    hits = bm.match_prefix(seq)
    bm.take_prefix(seq, hits)
    bm.allocate(seq, handoff.num_computed_tokens - seq.num_computed_tokens)
    # Blocks just allocated are zeroed by the runner before the next forward: do it now, then write.
    engine.kv_cache.zero_blocks(bm.take_fresh_blocks())
    write_blocks(engine.kv_cache, seq.block_table[len(hits) :], handoff.k[:, len(hits) :], handoff.v[:, len(hits) :])
    seq.num_computed_tokens = handoff.num_computed_tokens
    bm.cache_full_blocks(seq)
    engine.requests[seq.request_id] = handoff.request
    engine.scheduler.join_running(seq)
    return seq.request_id


def _refuse_kv_elsewhere(engine: LLMEngine) -> None:
    """Refuse the engines whose KV is not all in ``engine.kv_cache``: a drafter's, or other ranks'."""
    if engine.workers is not None:
        raise ValueError(
            "KV hand-off with tensor parallelism is not supported (the other ranks' KV heads would "
            "stay behind): use engines with tensor_parallel_size=1"
        )
    if engine.drafter is not None:
        raise ValueError(
            "KV hand-off with speculative decoding is not supported (the drafter's KV would "
            "stay behind): use engines with num_speculative_tokens=0"
        )


def read_blocks(cache: KVCache, blocks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of the K and V of ``cache``'s ``blocks``, every layer: each [layers, len(blocks), block_size,
    kv_heads, head_dim]."""
    index = torch.tensor(blocks, dtype=torch.long, device=cache.k.device)
    return cache.k.index_select(1, index), cache.v.index_select(1, index)


def write_blocks(cache: KVCache, blocks: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
    """Overwrite ``blocks`` with ``k`` and ``v`` as ``read_blocks`` returns them (from any
    device, of the pool's dtype). Raises ``ValueError`` for another shape or dtype."""
    shape = (cache.k.shape[0], len(blocks), *cache.k.shape[2:])
    for name, t in (("k", k), ("v", v)):
        if tuple(t.shape) != shape or t.dtype != cache.k.dtype:
            raise ValueError(
                f"{name} is {tuple(t.shape)} {t.dtype}; this pool takes {shape} {cache.k.dtype} "
                "(same model, block_size and dtype)"
            )
    index = torch.tensor(blocks, dtype=torch.long, device=cache.k.device)
    cache.k.index_copy_(1, index, k.to(cache.k.device))
    cache.v.index_copy_(1, index, v.to(cache.v.device))
