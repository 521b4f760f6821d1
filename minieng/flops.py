"""FLOPs and bytes of a step, from first principles, and what they become: MFU, MBU, the roofline.

A step is described as the engine records it (``StepRecord.chunks``): per scheduled sequence,
``(num_new_tokens, num_context_tokens, computes_logits)``. Everything here is arithmetic on
``ModelConfig`` shapes: no tensors, no device, no timing. The measured seconds and the peaks
(datasheet or measured ceiling: ``hardware``) come from the caller.

FLOPs (2 per multiply-add; DESIGN.md section 5):
- Linear layers: 2 * N per new token (Kaplan et al. 2020, table 1: C_forward ~ 2N), where N is
  the layers' matmul parameters (``ModelConfig.num_matmul_params`` less the LM head). The
  embedding lookup is a gather, free. Biases, norms, RoPE, SiLU and residual adds are
  elementwise, O(hidden) per token against O(hidden^2): not counted (nor by FlopCounterMode).
- LM head: 2 * hidden * vocab per row whose logits are computed (a tied head is a matmul too).
- Attention, per layer and new token attending c keys (itself included): 4 * num_heads *
  head_dim * c: 2 * num_heads * head_dim * c for QK^T and as much for PV (Hoffmann et al. 2022,
  appendix F; Kaplan's table 1 counts the QK^T half only). Query heads, not KV heads: GQA shares
  K/V, not the dot products. Token i (0-based) of a chunk after C cached tokens attends C + i + 1
  keys; summed over the chunk: 4 * H * D * (T * C + T * (T + 1) / 2). This is the useful, causal
  work: a dense kernel that computes the masked upper triangle and throws it away does more.

Bytes: the least traffic a step must move to and from memory (intermediate activations are
assumed to stay on chip and are not counted, which only matters for compute-bound prefill):
- weight_bytes: every layer weight (matmul weights and norm vectors) read once per step, in
  ``dtype_bytes``, or for quantized matmul weights the bytes their kernels read, scales
  included (``MatmulBytes``, from ``quantization.matmul_bytes``). The embedding table is
  *not* read whole: a lookup reads one row per new token. The LM head matrix is read once,
  and only in a step that computes logits (a mid-prompt prefill chunk skips it); when tied, it
  is the embedding table read whole, counted once for the head plus the looked-up rows.
  Biases (Qwen2's q/k/v: < 0.01% of the weights) are not counted.
- kv_read_bytes: per sequence, the K/V of every key it attends, read once:
  kv_bytes_per_token * (num_context_tokens + num_new_tokens). The new tokens' K/V count as read:
  the attention reads them back from the cache after writing them (``model.Attention`` writes,
  then ``paged_attention`` gathers the whole context), as paged kernels such as vLLM's do. For a
  decode that is one token in C + 1; for a fresh prefill it is all the KV traffic there is.
- kv_write_bytes: kv_bytes_per_token * num_new_tokens (K and V, every layer, GQA-aware).

What bounds a measured step (``roofline_bound``): the arithmetic or the memory traffic when one
of them accounts for at least a quarter of the time (MFU or MBU >= 25%), else overhead, which is
what a small model shows on a large GPU: a floor of microseconds under a step of milliseconds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from .config import ModelConfig


@dataclass(frozen=True)
class MatmulBytes:
    """Bytes of the matrix products' weights, read once per step: ``layers`` (every decoder
    layer's q/k/v, o, gate/up and down) and ``lm_head`` (read only in a step that computes
    logits). For quantized weights, the integer codes and their scales."""

    layers: float
    lm_head: float


@dataclass(frozen=True)
class StepWork:
    """FLOPs and bytes of one step (or, summed with ``+``/``sum``, of many).

    The totals and the intensity are derived in ``__post_init__``, so a sum recomputes the
    intensity from summed FLOPs and bytes (it does not add intensities). An empty step has
    intensity 0.
    """

    matmul_flops: float = 0
    attention_flops: float = 0
    lm_head_flops: float = 0
    weight_bytes: float = 0
    kv_read_bytes: float = 0
    kv_write_bytes: float = 0
    total_flops: float = field(init=False)
    total_bytes: float = field(init=False)
    arithmetic_intensity_flop_per_byte: float = field(init=False)

    def __post_init__(self) -> None:
        flops = self.matmul_flops + self.attention_flops + self.lm_head_flops
        nbytes = self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes
        object.__setattr__(self, "total_flops", flops)
        object.__setattr__(self, "total_bytes", nbytes)
        object.__setattr__(self, "arithmetic_intensity_flop_per_byte", flops / nbytes if nbytes else 0.0)

    def __add__(self, other: StepWork) -> StepWork:
        if not isinstance(other, StepWork):
            return NotImplemented
        return StepWork(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.init})

    def __radd__(self, other) -> StepWork:
        return self if other == 0 else self.__add__(other)  # so that sum(works) starts from 0


def step_work(model_config: ModelConfig, chunks: Iterable[tuple[int, int, bool | int]],
              dtype_bytes: float, kv_dtype_bytes: float | None = None,
              matmul_bytes: MatmulBytes | None = None) -> StepWork:
    """FLOPs and bytes of one step.

    Args:
        chunks: per scheduled sequence ``(num_new_tokens, num_context_tokens, computes_logits)``
            as in ``StepRecord.chunks``: tokens run this step, tokens already in the KV cache
            before them, and whether the LM head ran (True = one row; an int gives the number of
            rows, e.g. k + 1 when a target model verifies k draft tokens).
        dtype_bytes: bytes per weight element (4 fp32, 2 bf16/fp16, 0.5 for 4-bit weights).
        kv_dtype_bytes: bytes per KV-cache element; defaults to ``dtype_bytes``.
        matmul_bytes: the matrix products' weight bytes when they are not ``dtype_bytes`` per
            parameter (quantized: ``quantization.matmul_bytes``); the embedding rows and norms
            stay at ``dtype_bytes``.
    Raises:
        ValueError: a chunk with no new tokens, a negative context, or more logits rows than
            new tokens; a non-positive dtype size.
    """
    cfg = model_config
    kv_dtype_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    if dtype_bytes <= 0 or kv_dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes={dtype_bytes}, kv_dtype_bytes={kv_dtype_bytes}: both must be > 0")
    head_params = cfg.hidden_size * cfg.vocab_size
    layer_params = cfg.num_matmul_params - head_params  # every decoder layer's matmul weights
    kv_per_token = cfg.kv_bytes_per_token(kv_dtype_bytes)  # 2 * layers * num_kv_heads * head_dim * bytes
    attn_per_key = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
    new_tokens = logits_rows = context_keys = attended_keys = 0
    for num_new, num_context, computes_logits in chunks:
        rows = int(computes_logits)
        if num_new < 1 or num_context < 0 or not 0 <= rows <= num_new:
            raise ValueError(f"chunk (num_new_tokens={num_new}, num_context_tokens={num_context}, "
                             f"computes_logits={computes_logits}) is invalid: need num_new_tokens >= 1, "
                             "num_context_tokens >= 0 and 0 <= logits rows <= num_new_tokens")
        new_tokens += num_new
        logits_rows += rows
        context_keys += num_context + num_new  # keys read from the cache, new ones included
        attended_keys += num_new * num_context + num_new * (num_new + 1) // 2  # causal sum
    norm_params = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size
    if matmul_bytes is None:
        matmul_bytes = MatmulBytes(layer_params * dtype_bytes, head_params * dtype_bytes)
    weight_bytes = ((norm_params + new_tokens * cfg.hidden_size) * dtype_bytes + matmul_bytes.layers
                    + (matmul_bytes.lm_head if logits_rows else 0))
    return StepWork(
        matmul_flops=2 * layer_params * new_tokens,
        attention_flops=attn_per_key * attended_keys,
        lm_head_flops=2 * head_params * logits_rows,
        weight_bytes=weight_bytes,
        kv_read_bytes=kv_per_token * context_keys,
        kv_write_bytes=kv_per_token * new_tokens,
    )


def prefill_work(model_config: ModelConfig, prompt_tokens: int, dtype_bytes: float,
                 num_cached_tokens: int = 0, matmul_bytes: MatmulBytes | None = None) -> StepWork:
    """One sequence's whole prefill in one step: ``prompt_tokens - num_cached_tokens`` new tokens
    after ``num_cached_tokens`` (a prefix-cache hit), logits for the last position only."""
    return step_work(model_config, [(prompt_tokens - num_cached_tokens, num_cached_tokens, True)], dtype_bytes,
                     matmul_bytes=matmul_bytes)


def masked_attention_flops(model_config: ModelConfig, chunks: Iterable[tuple[int, int, bool | int]]) -> int:
    """What a dense attention kernel computes beyond ``step_work``'s causal count on a step's chunks.

    A kernel handed a chunk of T new tokens and its C cached keys computes the whole T x (C + T)
    score rectangle (and PV product), then masks the T (T - 1) / 2 query-key pairs above the
    diagonal: 4 * num_heads * head_dim FLOPs each, per layer. That is how torch's FlopCounterMode
    counts SDPA, and what eager attention (explicit matmuls, then a mask) does. A decode chunk
    (T = 1) masks nothing here; a kernel's padding of the keys (to whole blocks, or a batch's
    longest sequence) is not counted either.
    """
    cfg = model_config
    pairs = sum(n * (n - 1) // 2 for n, _, _ in chunks)
    return 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * pairs


def decode_work(model_config: ModelConfig, batch_size: int, context_len: int, dtype_bytes: float,
                matmul_bytes: MatmulBytes | None = None) -> StepWork:
    """One decode step of ``batch_size`` sequences, each with ``context_len`` tokens already in the
    KV cache: one new token each (attending ``context_len + 1`` keys), logits for each."""
    return step_work(model_config, [(1, context_len, True)] * batch_size, dtype_bytes, matmul_bytes=matmul_bytes)


def attention_crossover_tokens(model_config: ModelConfig) -> int:
    """The shortest prompt whose prefill (one step, nothing cached) does at least as many attention
    FLOPs as linear-layer FLOPs.

    With L layers, H query heads of dim D and N matmul parameters in the layers (LM head excluded:
    a prefill runs it for one row only), ``step_work`` counts 2 N n for the linear layers and
    4 L H D n (n + 1) / 2 for causal attention, so they meet at n + 1 = N / (L H D): a property
    of the shape alone (no dtype, no device). SmolLM2-135M: about 6,100 tokens; Llama-3-8B: about
    53,000, past its 8,192-token context.
    """
    cfg = model_config
    layer_params = cfg.num_matmul_params - cfg.hidden_size * cfg.vocab_size
    per_key = cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim
    return max(1, math.ceil(layer_params / per_key - 1))


def decode_ridge_batch(model_config: ModelConfig, context_len: int, dtype_bytes: float, ridge: float) -> int | None:
    """The smallest decode batch whose arithmetic intensity reaches ``ridge`` (FLOP/byte): where a
    decode step of sequences with ``context_len`` cached tokens each turns compute-bound.

    A step's FLOPs and bytes grow linearly with the batch, flops = b f and bytes = W + b k (W: the
    weights, read once for the batch; k: each sequence's KV and embedding row), so the intensity
    b f / (W + b k) rises towards f / k and never beyond it. Returns None when f / k <= ridge:
    each sequence brings too many bytes of its own (its KV cache) for its FLOPs, and no batch
    turns the step compute-bound (long contexts, or a GPU's high ridge). Raises ``ValueError``
    for ``ridge`` <= 0.
    """
    if ridge <= 0:
        raise ValueError(f"ridge={ridge} FLOP/byte must be > 0")
    one, two = (decode_work(model_config, b, context_len, dtype_bytes) for b in (1, 2))
    f = one.total_flops
    k = two.total_bytes - one.total_bytes
    w = one.total_bytes - k
    if f <= ridge * k:
        return None
    return max(1, math.ceil(ridge * w / (f - ridge * k) - 1e-9))


# -- achieved vs peak ---------------------------------------------------------------------------

def format_percent(percent: float | None) -> str:
    """A utilization percentage as text, precise enough to tell 0.03% from 0.3%.

    ``percent`` is already in percent (43.0 for 43%; ``Utilization.percent``, the ``*_percent``
    keys). Below 10%: two significant digits ("0.030%", "0.30%", "4.6%"); from 10%: one decimal
    ("43.2%", "112.0%"). 0 is "0%", None (N/A) is "N/A", never 0. A fixed "{:.1f}%" prints a
    batch-1 decode's MFU on a GPU (~0.03%) as "0.0%", which reads as idle.
    """
    if percent is None:
        return "N/A"
    if percent == 0:
        return "0%"
    if not math.isfinite(percent):
        return f"{percent}%"
    size = abs(percent)
    if size >= 9.95:  # would round to 10: one decimal from here on
        return f"{percent:.1f}%"
    decimals = 1 - math.floor(math.log10(size))  # two significant digits
    if round(size, decimals) >= 10 ** (1 - decimals + 1):  # 0.0996 -> "0.10", keep two digits
        decimals -= 1
    return f"{percent:.{decimals}f}%"


class SuspectFigureWarning(UserWarning):
    """A utilization above 100%: the work count or the peak is wrong, not the hardware magic."""


@dataclass(frozen=True)
class Utilization:
    """A fraction of a peak, flagged when it cannot be true.

    ``fraction`` is achieved / peak (0.43 = 43%). ``suspect`` is True when it exceeds 1: the FLOP
    or byte count is too high, the time too short (an unsynchronized GPU), or the peak too low
    (a measured ceiling below what the step reached). ``str()`` then says SUSPECT beside the
    number, and building it emits a ``SuspectFigureWarning``, so it is never shown as a fact.
    """

    name: str
    fraction: float
    suspect: bool

    @property
    def percent(self) -> float:
        return 100 * self.fraction

    def __float__(self) -> float:
        return self.fraction

    def __str__(self) -> str:
        flag = " (SUSPECT: above the peak; check the count, the timing and which peak)" if self.suspect else ""
        return f"{self.name} {format_percent(self.percent)}{flag}"


def _utilization(name: str, amount: float, seconds: float, peak_per_s: float) -> Utilization:
    if seconds <= 0 or peak_per_s <= 0 or amount < 0:
        raise ValueError(f"{name}: need amount >= 0, seconds > 0 and peak > 0; "
                         f"got {amount}, {seconds} s, peak {peak_per_s}/s")
    fraction = amount / seconds / peak_per_s
    suspect = fraction > 1.0
    if suspect:
        warnings.warn(f"{name} = {format_percent(100 * fraction)} exceeds 100%: a wrong count or peak",
                      SuspectFigureWarning, stacklevel=3)
    return Utilization(name, fraction, suspect)


def mfu(flops: float, seconds: float, peak_flops: float) -> Utilization:
    """Model FLOPs utilization: (flops / seconds) / peak_flops, peak in FLOP/s (dense, of the
    dtype; say whether datasheet or measured). Raises ``ValueError`` for seconds or peak <= 0."""
    return _utilization("MFU", flops, seconds, peak_flops)


def mbu(bytes: float, seconds: float, peak_bytes_per_s: float) -> Utilization:
    """Model bandwidth utilization: (bytes / seconds) / peak_bytes_per_s. Raises ``ValueError``
    for seconds or peak <= 0."""
    return _utilization("MBU", bytes, seconds, peak_bytes_per_s)


# -- roofline (Williams, Waterman & Patterson 2009) ---------------------------------------------

def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """Roofline: attainable FLOP/s = min(peak_flops, intensity * bandwidth); intensity in
    FLOP/byte, peak in FLOP/s, bandwidth in bytes/s."""
    return min(peak_flops, intensity * bandwidth)


def ridge_point(peak: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the roofline turns flat: peak FLOP/s / bandwidth bytes/s.
    Below it a step is memory-bound, above it compute-bound."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth={bandwidth} bytes/s must be > 0")
    return peak / bandwidth


def tpot_floor_s(bytes_per_step: float, bandwidth: float) -> float:
    """Decode floor: no step can beat its bytes / bandwidth (bytes/s). For decode the bytes are
    the weights (params * bytes per param) plus the KV read: ``StepWork.total_bytes``."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth={bandwidth} bytes/s must be > 0")
    return bytes_per_step / bandwidth


def prefill_floor_s(flops: float, peak_flops: float) -> float:
    """Prefill floor: FLOPs / peak FLOP/s (compute-bound: the bytes hide under the math)."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops={peak_flops} FLOP/s must be > 0")
    return flops / peak_flops


# A roofline floor under a quarter of the measured time: overhead, not physics. A 135M model's
# steps on a large GPU explain 0.5-5% of their time; a 2-core CPU's batch-1 decode moves its bytes
# at 30-70% of a large copy's speed, and is memory-bound.
OVERHEAD_BOUND_BELOW = 0.25


@dataclass(frozen=True)
class Bound:
    """What limits a measured step (or phase): the arithmetic, the memory traffic, or neither.

    ``compute_floor_s`` = FLOPs / peak FLOP/s and ``memory_floor_s`` = bytes / bandwidth are the
    least time the step could take on a machine of that peak; the roofline's floor is the larger.
    ``explained`` = floor / measured time: the share of the time the FLOPs or the bytes account
    for, which is max(MFU, MBU). ``limit`` is "compute" or "memory" (the larger floor) when the
    floor explains at least ``OVERHEAD_BOUND_BELOW`` of the time, else "overhead": most of the
    time went to something neither the arithmetic nor the bytes require,
    such as kernel launches, Python and the host between kernels, or kernels running far below
    the peak. A small model on a large GPU is overhead-bound: its floor is microseconds, its step
    milliseconds.
    """

    seconds: float
    compute_floor_s: float
    memory_floor_s: float

    @property
    def floor_s(self) -> float:
        return max(self.compute_floor_s, self.memory_floor_s)

    @property
    def explained(self) -> float:
        return self.floor_s / self.seconds

    @property
    def limit(self) -> str:
        if self.explained < OVERHEAD_BOUND_BELOW:
            return "overhead"
        return "compute" if self.compute_floor_s >= self.memory_floor_s else "memory"

    def words(self) -> str:
        """One sentence: what bounds the time, with the share the roofline explains."""
        share = format_percent(100 * self.explained)
        side = "FLOPs at the peak" if self.compute_floor_s >= self.memory_floor_s else "bytes at the bandwidth"
        if self.limit == "overhead":
            return (f"limited by overhead: the {side} would take {_ms(self.floor_s)} of the {_ms(self.seconds)} "
                    f"measured ({share}); the rest is fixed per-step cost (launches, Python, the host) or "
                    "kernels far below the peak")
        return f"{self.limit}-bound: the {side} account for {share} of the {_ms(self.seconds)} measured"


def _ms(seconds: float) -> str:
    ms = 1e3 * seconds
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def roofline_bound(flops: float, nbytes: float, seconds: float, peak_flops: float, bandwidth: float) -> Bound:
    """``Bound`` of ``flops`` and ``nbytes`` done in ``seconds`` on a machine of ``peak_flops`` FLOP/s
    and ``bandwidth`` bytes/s. Raises ``ValueError`` for a non-positive time, peak or bandwidth."""
    if seconds <= 0 or peak_flops <= 0 or bandwidth <= 0:
        raise ValueError(f"need seconds, peak_flops and bandwidth > 0; got {seconds}, {peak_flops}, {bandwidth}")
    return Bound(seconds, flops / peak_flops, nbytes / bandwidth)


def phase_utilization(model_config: ModelConfig, dtype_bytes: float, steps, peaks,
                      matmul_bytes: MatmulBytes | None = None) -> dict:
    """FLOPs and bytes of recorded steps (``StepRecord``s) over their measured time: MFU and MBU.

    ``matmul_bytes``: a quantized engine's weight bytes (``LLMEngine.matmul_bytes``), as in
    ``step_work``.
    ``peaks``: ``hardware.Peak``s; one entry per peak, keyed by its source ("measured",
    "datasheet"), with MFU, MBU, what bounds the time (``roofline_bound``: ``limit``,
    ``explained_percent`` and ``bound``, a sentence). A figure over 100% carries ``suspect: True`` (a
    wrong count or ceiling) instead of being reported as fact. Returns a JSON-serializable dict.
    """
    seconds = sum(s.duration_s for s in steps)
    if not steps or seconds <= 0:
        raise ValueError("phase_utilization needs at least one step with a positive duration")
    work = sum(step_work(model_config, s.chunks, dtype_bytes, matmul_bytes=matmul_bytes) for s in steps)
    out = {"num_steps": len(steps), "flops": work.total_flops, "bytes": work.total_bytes, "seconds": seconds,
           "arithmetic_intensity_flop_per_byte": work.arithmetic_intensity_flop_per_byte,
           "achieved_tflops": work.total_flops / seconds / 1e12, "achieved_gbps": work.total_bytes / seconds / 1e9}
    for peak in peaks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SuspectFigureWarning)  # the flag travels in the result
            f = mfu(work.total_flops, seconds, peak.peak_tflops * 1e12)
            b = mbu(work.total_bytes, seconds, peak.bandwidth_gbps * 1e9)
        bound = roofline_bound(work.total_flops, work.total_bytes, seconds, peak.peak_tflops * 1e12,
                               peak.bandwidth_gbps * 1e9)
        out[peak.source] = {"mfu_percent": f.percent, "mbu_percent": b.percent, "suspect": f.suspect or b.suspect,
                            "limit": bound.limit, "explained_percent": 100 * bound.explained, "bound": bound.words()}
    return out
