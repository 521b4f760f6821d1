"""Tensor parallelism: Megatron-LM's split of a Llama layer over ``p`` ranks (Shoeybi et al. 2019, section 3).

Each rank holds a share of every layer and reads only that share each step:

- attention by KV heads, each with its group of query heads: rank r keeps a contiguous range of
  KV heads and their query heads in ``qkv_proj`` (a column-parallel product: its outputs are
  split), and the matching input columns of ``o_proj`` (row-parallel: its inputs are split, so
  its output is a partial sum);
- the MLP by intermediate columns: rows of ``gate_up_proj``, the matching columns of
  ``down_proj`` (a partial sum again);
- the embedding and the LM head by vocabulary (as vLLM does): rank r holds rows
  ``[r V', (r+1) V')`` of the matrix, ``V' = ceil(V / p)`` (the last rank's tail padded with zeros).

Shares are as even as whole heads allow (``split``: the first ``n mod p`` ranks hold one more).
vLLM requires p to divide the head counts; minieng does not, because its default model has 9
query heads and 3 KV heads: at p = 2, rank 0 holds 2 KV heads (6 query heads) and rank 1 holds 1
(3), and the attention work is split 2:1 while the MLP splits evenly. p may not exceed the KV
heads (a rank would hold no head).

So a layer ends each half in an all-reduce (the partial sums added on every rank), the embedding
in one more (each token's row comes from the one rank that holds it), and the logits in an
all-gather of the vocabulary shards: ``2 x layers + 2`` collectives per step. Norms and RoPE are
replicated; each rank's KV pool holds its own KV heads. A bias of a row-parallel product is added
by rank 0 alone (the others load it as zeros), so the sum counts it once.

``TensorParallel`` is one rank's view: its rank, the group's size, its process group, and the
collectives, timed (``comm_s``: seconds this rank spent in them, which the measurement splits from
the compute). The group is formed by ``engine.workers``. With ``size == 1`` every collective is the
identity and nothing of ``torch.distributed`` is touched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from minieng.config import ModelConfig
from minieng.units import cdiv


@dataclass
class TensorParallel:
    """One rank of a tensor-parallel group.

    Attributes:
        rank, size: this rank and how many there are (``size == 1``: no parallelism).
        group: the ``torch.distributed`` process group of the ranks (``workers.join_group``); None
            for one.
        comm_s: seconds spent in collectives since the last ``reset``, this rank's wall clock. On
            CUDA each collective is synchronized so that the time covers the transfer, which costs
            the step the overlap of its launches: the price of measuring it.
        num_collectives: collectives since the last ``reset``.
    """

    rank: int = 0
    size: int = 1
    group: object = field(default=None, repr=False)
    comm_s: float = 0.0
    num_collectives: int = 0
    store: object = field(default=None, repr=False)  # the group's TCP store, kept alive with it

    def release(self) -> None:
        """Let the group and its store go (``workers.Workers.close``); no collective runs after."""
        if self.group is not None and hasattr(self.group, "shutdown"):
            self.group.shutdown()
        self.group = self.store = None

    def sync(self, device: torch.device) -> None:
        """Wait until every rank gets here: an all-reduce of one element on ``device`` (a barrier on
        a NCCL group would guess the GPU from the rank)."""
        self.group.allreduce([torch.zeros(1, device=device)]).wait()

    def reset(self) -> None:
        self.comm_s, self.num_collectives = 0.0, 0

    def _timed(self, x: torch.Tensor, work) -> None:
        start = time.perf_counter()
        work().wait()
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        self.comm_s += time.perf_counter() - start
        self.num_collectives += 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the ranks, in place (every rank gets the sum). The identity for one rank."""
        if self.size > 1:
            self._timed(x, lambda: self.group.allreduce([x]))
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """The ranks' ``x`` [n, m] side by side: [n, size * m], rank 0's columns first."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._timed(x, lambda: self.group.allgather([parts], [x]))
        return torch.cat(parts, dim=-1)

    def time_all_reduce(
        self, sizes_bytes: list[int], repeats: int, device: torch.device, dtype: torch.dtype
    ) -> list[list[float]]:
        """Seconds of each of ``repeats`` all-reduces of each of ``sizes_bytes`` (messages of
        ``dtype``, timed after 3 untimed, each started together after a barrier), this rank's
        clock: one list of samples per size. Every rank of the group must call it with the same
        arguments (``workers.Workers.time_all_reduce`` has them do so)."""
        samples = []
        for nbytes in sizes_bytes:
            x = torch.ones(max(1, nbytes // dtype.itemsize), dtype=dtype, device=device)
            times = []
            for i in range(3 + repeats):
                self.sync(device)  # every rank starts together: the time is the collective's
                start = time.perf_counter()
                self.group.allreduce([x]).wait()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if i >= 3:
                    times.append(time.perf_counter() - start)
            samples.append(times)
        return samples


def split(total: int, size: int, rank: int) -> tuple[int, int]:
    """``[start, stop)``: rank ``rank``'s contiguous share of ``total`` items over ``size`` ranks,
    as even as whole items allow (the first ``total % size`` ranks hold one more)."""
    base, extra = divmod(total, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def check_tensor_parallel(model_config: ModelConfig, size: int) -> None:
    """Raise ``ValueError`` unless each of ``size`` ranks can hold at least one KV head (with its
    query heads) and one MLP column."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size={size}: must be >= 1")
    for name in ("num_key_value_heads", "intermediate_size"):
        value = getattr(model_config, name)
        if size > value:
            raise ValueError(
                f"tensor_parallel_size={size} exceeds the model's {name}={value}: every rank must hold at "
                f"least one; use tensor_parallel_size <= {value}"
            )


def shard_config(model_config: ModelConfig, size: int, rank: int = 0) -> ModelConfig:
    """The shape rank ``rank`` of ``size`` holds: its KV heads with their query heads, and its MLP
    columns (the vocabulary is split by the embedding itself, ``vocab_shard``). Rank 0 holds the
    largest share. ``model_config`` itself for one rank."""
    if size == 1:
        return model_config
    check_tensor_parallel(model_config, size)
    group = model_config.num_attention_heads // model_config.num_key_value_heads
    kv_start, kv_stop = split(model_config.num_key_value_heads, size, rank)
    mlp_start, mlp_stop = split(model_config.intermediate_size, size, rank)
    return replace(
        model_config,
        num_attention_heads=(kv_stop - kv_start) * group,
        num_key_value_heads=kv_stop - kv_start,
        intermediate_size=mlp_stop - mlp_start,
    )


def vocab_shard(vocab_size: int, rank: int, size: int) -> tuple[int, int, int]:
    """``(start, stop, rows)``: the token ids ``[start, stop)`` rank ``rank`` holds, and the rows
    its shard has (``ceil(vocab / size)`` on every rank, so the logits gather in equal parts: the
    last shard is padded to it)."""
    rows = cdiv(vocab_size, size)
    start = min(rank * rows, vocab_size)
    return start, min(start + rows, vocab_size), rows


# Checkpoint tensors split along their outputs (dim 0) by heads or columns, and along their inputs
# (dim 1) for the row-parallel products: the suffix of a Hugging Face name -> (dim, what splits).
_SPLITS = {
    "q_proj": (0, "q"),
    "k_proj": (0, "kv"),
    "v_proj": (0, "kv"),
    "o_proj": (1, "q"),
    "gate_proj": (0, "mlp"),
    "up_proj": (0, "mlp"),
    "down_proj": (1, "mlp"),
    "embed_tokens": (0, "vocab"),
    "lm_head": (0, "vocab"),
}


def checkpoint_slice(name: str, model_config: ModelConfig, tp: TensorParallel) -> tuple[int, int, int] | None:
    """The part of checkpoint tensor ``name`` that rank ``tp.rank`` loads: ``(dim, start, stop)``,
    or None for a tensor every rank loads whole (norms). ``model_config`` is the whole model's.

    A row-parallel product's bias (``o_proj.bias``, ``down_proj.bias``) is not split: rank 0
    loads it and the others zero it (``zeroes_bias``).
    """
    if tp.size == 1:
        return None
    parts = name.split(".")
    proj, leaf = parts[-2], parts[-1]
    if proj not in _SPLITS or (leaf == "bias" and _SPLITS[proj][0] == 1):
        return None
    dim, what = _SPLITS[proj]
    if what == "vocab":
        start, stop, _ = vocab_shard(model_config.vocab_size, tp.rank, tp.size)
        return dim, start, stop
    if what == "mlp":
        return (dim, *split(model_config.intermediate_size, tp.size, tp.rank))
    kv_start, kv_stop = split(model_config.num_key_value_heads, tp.size, tp.rank)
    per_kv_head = model_config.head_dim * (
        model_config.num_attention_heads // model_config.num_key_value_heads if what == "q" else 1
    )
    return dim, kv_start * per_kv_head, kv_stop * per_kv_head


def zeroes_bias(name: str, tp: TensorParallel) -> bool:
    """Whether rank ``tp.rank`` loads (or draws) ``name`` as zeros: a row-parallel product's bias
    (split along its inputs, dim 1) off rank 0."""
    parts = name.split(".")
    return tp.rank > 0 and parts[-1] == "bias" and len(parts) > 1 and _SPLITS.get(parts[-2], (0,))[0] == 1
