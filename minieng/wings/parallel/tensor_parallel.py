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
the compute). The group is formed by ``workers``. With ``size == 1`` every collective is the
identity and nothing of ``torch.distributed`` is touched.

The split is a transform of a built model, as gpt-fast's ``apply_tp``: the core's Llama knows
nothing of ranks. ``RankShard.apply`` cuts the whole model (built on the meta device, before any
storage) down to rank r's share, swaps the embedding and the LM head for vocabulary-parallel ones
and hooks an all-reduce after each row-parallel product; the loader reads the rank's slices of
the checkpoint (``checkpoint_slice``) and hands the model back once loaded (``RankShard.loaded``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from minieng.config import ModelConfig
from minieng.core.llama import LlamaForCausalLM, linear
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


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, stop)`` of the embedding: ids outside them look up zeros, and an all-reduce
    adds the ranks' rows up, so every token's row comes from the one rank that holds it."""

    def __init__(self, start: int, stop: int, hidden_size: int, tp: TensorParallel):
        super().__init__()
        self.start, self.stop, self.tp = start, stop, tp
        self.weight = nn.Parameter(torch.empty(stop - start, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        outside = (input_ids < self.start) | (input_ids >= self.stop)
        x = F.embedding((input_ids - self.start).masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill_(outside[:, None], 0))


class VocabParallelLMHead(nn.Module):
    """Rows ``[start, stop)`` of the LM head: each rank's logits of its shard, padded to ``rows``
    columns (the shards gather in equal parts), gathered side by side and cut to the vocabulary."""

    def __init__(self, start: int, stop: int, rows: int, hidden_size: int, vocab_size: int, tp: TensorParallel):
        super().__init__()
        self.rows, self.vocab_size, self.tp = rows, vocab_size, tp
        self.weight = nn.Parameter(torch.empty(stop - start, hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = linear(x, self.weight)
        logits = F.pad(logits, (0, self.rows - logits.shape[-1]))
        return self.tp.all_gather_last(logits)[:, : self.vocab_size]


def _resize(layer: nn.Module, out_features: int | None = None, in_features: int | None = None) -> None:
    """Give a linear layer (on the meta device) a weight (and bias) of a share's shape."""
    out_features = out_features or layer.weight.shape[0]
    in_features = in_features or layer.weight.shape[1]
    layer.weight = nn.Parameter(torch.empty(out_features, in_features))
    if layer.bias is not None and layer.bias.shape[0] != out_features:
        layer.bias = nn.Parameter(torch.empty(out_features))


class RankShard:
    """Rank ``tp.rank``'s share of a model, Megatron's split (this module's docstring), applied to
    a built model by ``apply`` and read from a checkpoint through ``checkpoint_slice``. The split
    is the model's last transform: its all-reduces are forward hooks on the row-parallel layers,
    which a later swap of those layers would drop (``quantization`` refuses to)."""

    def __init__(self, tp: TensorParallel):
        self.tp = tp

    def apply(self, model: LlamaForCausalLM) -> None:
        """Cut ``model`` (the whole model, on the meta device) to this rank's share, in place:
        ``model.local_config`` is the shape its layers then hold, ``model.tp`` its group."""
        config, tp = model.config, self.tp
        self.model_config = config
        local = shard_config(config, tp.size, tp.rank)
        q, kv = local.num_attention_heads * local.head_dim, local.num_key_value_heads * local.head_dim
        all_reduce = lambda module, inputs, out: tp.all_reduce(out)  # noqa: E731 (a forward hook)
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            _resize(attn.qkv_proj, out_features=q + 2 * kv)
            _resize(attn.o_proj, in_features=q)  # row-parallel: partial sums, added by the all-reduce
            attn.num_heads, attn.num_kv_heads, attn.q_size, attn.kv_size = (
                local.num_attention_heads,
                local.num_key_value_heads,
                q,
                kv,
            )
            _resize(mlp.gate_up_proj, out_features=2 * local.intermediate_size)
            _resize(mlp.down_proj, in_features=local.intermediate_size)
            mlp.intermediate_size = local.intermediate_size
            attn.o_proj.register_forward_hook(all_reduce)
            mlp.down_proj.register_forward_hook(all_reduce)
        start, stop, rows = vocab_shard(config.vocab_size, tp.rank, tp.size)
        model.embed_tokens = VocabParallelEmbedding(start, stop, config.hidden_size, tp)
        model.lm_head = VocabParallelLMHead(start, stop, rows, config.hidden_size, config.vocab_size, tp)
        model.tie_weights()
        model.rope.num_qk_heads = local.num_attention_heads + local.num_key_value_heads
        model.rope.num_v_heads = local.num_key_value_heads
        model.local_config, model.tp = local, tp

    def checkpoint_slice(self, name: str) -> tuple[int, int, int] | None:
        """The part of checkpoint tensor ``name`` this rank reads (``checkpoint_slice``)."""
        return checkpoint_slice(name, self.model_config, self.tp) if self.tp.size > 1 else None

    def loaded(self, model: LlamaForCausalLM) -> None:
        """After the weights are in: a row-parallel product's bias is rank 0's alone (the all-reduce
        adds it once), so the other ranks zero theirs."""
        for name, param in model.named_parameters():
            if zeroes_bias(name, self.tp):
                param.data.zero_()
