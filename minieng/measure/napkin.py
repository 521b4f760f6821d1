"""Napkin math: what a model shape costs on a device, from its peaks alone, before anything is measured.

Given a published shape (``config.PUBLISHED_SHAPES``), a device (a datasheet's dense peak, bandwidth
and memory, or this machine's measured ceilings), a dtype, a batch, a prompt and a context length,
``napkin_estimate`` returns what the roofline allows: the weights' and the KV cache's bytes, how
many tokens of KV the memory holds beside the weights (the memory a program can use: nvidia-smi's
total, less the CUDA context, of which the weights and KV get 90% as in the engine;
``peaks.DeviceSpec.budget_bytes``), the TTFT and TPOT floors (the compute floor
and the bandwidth floor, the larger binding), the decode batch where the step turns compute-bound,
and the tokens per second and the cost per million tokens at those floors. Measurements sit above
these floors, never below; how far above is what the notebooks measure.

The method is kipply's "Transformer inference arithmetic" (kipp.ly, 2022): a step's time is at
least its FLOPs over the peak FLOP/s and at least its bytes over the bandwidth. Every count is the
house's (docs/architecture.md, FLOPs and bytes; ``flops_bytes.step_work``): 2 FLOPs per
multiply-add, 2 x N_matmul per new token plus the LM head where logits are needed, attention
4 x heads x head_dim per key attended per layer; bytes are every weight read once, each sequence's
KV read, the new tokens' KV written. The weights' resident bytes are ``model.weight_bytes``'s, the
KV per token ``ModelConfig.kv_bytes_per_token``'s, the ridge batch ``flops_bytes.decode_ridge_batch``'s.

Pure arithmetic on shapes and peaks: no tensor, no timing. ``course.napkin_widget`` draws it and puts
the reader's measured point beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minieng.config import ModelConfig
from minieng.measure.flops_bytes import decode_ridge_batch, decode_work, step_work
from minieng.measure.peaks import (
    MEMORY_UTILIZATION,
    NAPKIN_DTYPES,
    TORCH_DTYPE_NAMES,
    DeviceSpec,
    datasheet_devices,
    measured_device,
    this_machine_device,
)
from minieng.measure.roofline import prefill_floor_s, tpot_floor_s
from minieng.measure.token_cost import cost_per_million_tokens
from minieng.wings.quantization.quantization import DEFAULT_GROUP_SIZE, matmul_bytes
from minieng.model.weight_bytes import MatmulBytes, weight_bytes
from minieng.units import GIB

# The devices and dtypes the calculator knows live beside the peaks (``peaks.DeviceSpec``); the faces
# import them from here too.
__all__ = [
    "GPTQ_AWQ_GROUP_SIZE",
    "NAPKIN_DTYPES",
    "TORCH_DTYPE_NAMES",
    "DeviceSpec",
    "NapkinEstimate",
    "cost_per_mtok",
    "datasheet_devices",
    "format_seconds",
    "int4_note",
    "measured_device",
    "napkin_estimate",
    "this_machine_device",
]

GPTQ_AWQ_GROUP_SIZE = 128  # the group size GPTQ and AWQ checkpoints are usually quantized with


def cost_per_mtok(tok_s: float, price_per_device_hour: float | None) -> float | None:
    """``token_cost.cost_per_million_tokens`` (price / (tok/s x 3600 s) x 1e6, in the price's currency),
    or None when no price is given or no tokens flow."""
    if price_per_device_hour is None or tok_s <= 0:
        return None
    return cost_per_million_tokens(tok_s, price_per_device_hour)


@dataclass(frozen=True)
class NapkinEstimate:
    """The floors of one setting (``napkin_estimate``). Times in seconds, bytes in bytes, costs in the
    currency of ``price_per_device_hour`` per million tokens.

    Attributes:
        weights_bytes: the resident weights (``model.weight_bytes``: every parameter, a tied head once).
        kv_bytes_per_token: one token's K and V over every layer (``ModelConfig.kv_bytes_per_token``).
        kv_bytes: the batch's KV cache at this context: batch x context x ``kv_bytes_per_token``.
        memory_budget_bytes: what the weights and the KV may take (``DeviceSpec.budget_bytes``: 90% of
            the memory after the CUDA context; the rest holds activations and the allocator's slack).
        kv_capacity_tokens: tokens of KV the budget holds after the weights (0 when the weights do
            not fit).
        fits: the weights and the batch's KV together fit the budget.
        ttft_*: one prefill step of ``batch_size`` prompts of ``prompt_tokens``, nothing cached:
            ``compute_floor_s`` = FLOPs / peak, ``bandwidth_floor_s`` = bytes / bandwidth, ``floor_s``
            the larger, ``bound`` "compute" or "memory" (which one binds).
        tpot_*: likewise for one decode step of ``batch_size`` sequences with ``context_tokens`` of
            KV each.
        decode_ridge_batch: the smallest decode batch at this context whose step reaches the ridge
            point (``flops_bytes.decode_ridge_batch``); None when none does (the KV reads per
            sequence keep the intensity below the ridge). ``ridge_batch_fits``: its KV fits beside
            the weights (None without a ridge batch).
        prefill_tok_s_at_floor / decode_tok_s_at_floor: prompt tokens / TTFT floor and batch / TPOT
            floor; ``decode_tok_s_at_ridge_batch``: the ridge batch over its own TPOT floor.
        *_cost_per_mtok: ``cost_per_mtok`` of those rates (None without a price).
        notes: what the reader must know to read the figures (weights that do not fit, a peak
            that is not the dtype's, a context past the model's).
    """

    model: str
    device: str
    device_source: str
    dtype: str
    batch_size: int
    prompt_tokens: int
    context_tokens: int
    memory_bytes: float
    memory_budget_bytes: float
    peak_tflops: float
    bandwidth_gbps: float
    weights_bytes: float
    kv_bytes_per_token: float
    kv_bytes: float
    kv_capacity_tokens: int
    fits: bool
    ttft_compute_floor_s: float
    ttft_bandwidth_floor_s: float
    tpot_compute_floor_s: float
    tpot_bandwidth_floor_s: float
    ridge_flop_per_byte: float
    decode_ridge_batch: int | None
    ridge_batch_fits: bool | None
    decode_tok_s_at_ridge_batch: float | None
    price_per_device_hour: float | None
    notes: tuple[str, ...] = field(default=())
    memory_source: str = ""  # where memory_bytes comes from (``DeviceSpec.memory_source``)

    @property
    def ttft_floor_s(self) -> float:
        return max(self.ttft_compute_floor_s, self.ttft_bandwidth_floor_s)

    @property
    def ttft_bound(self) -> str:
        return "compute" if self.ttft_compute_floor_s >= self.ttft_bandwidth_floor_s else "memory"

    @property
    def tpot_floor_s(self) -> float:
        return max(self.tpot_compute_floor_s, self.tpot_bandwidth_floor_s)

    @property
    def tpot_bound(self) -> str:
        return "compute" if self.tpot_compute_floor_s >= self.tpot_bandwidth_floor_s else "memory"

    @property
    def prefill_tok_s_at_floor(self) -> float:
        return self.batch_size * self.prompt_tokens / self.ttft_floor_s

    @property
    def decode_tok_s_at_floor(self) -> float:
        return self.batch_size / self.tpot_floor_s

    @property
    def prefill_cost_per_mtok(self) -> float | None:
        return cost_per_mtok(self.prefill_tok_s_at_floor, self.price_per_device_hour)

    @property
    def decode_cost_per_mtok(self) -> float | None:
        return cost_per_mtok(self.decode_tok_s_at_floor, self.price_per_device_hour)

    @property
    def decode_cost_per_mtok_at_ridge_batch(self) -> float | None:
        tok_s = self.decode_tok_s_at_ridge_batch
        return None if tok_s is None else cost_per_mtok(tok_s, self.price_per_device_hour)

    def rows(self, price_label: str = "") -> list[tuple[str, str]]:
        """The estimate as (quantity, value) rows of text, in the order a reader reads them.
        ``price_label``: a word after the price ("an example: type yours")."""
        b, c, p = self.batch_size, self.context_tokens, self.prompt_tokens
        capacity = self.kv_capacity_tokens
        seqs = f" = {capacity // c:,} sequences of {c:,}" if c else ""
        if self.decode_ridge_batch is None:
            ridge = f"never at context {c:,}: each sequence's KV reads keep the FLOP per byte below the ridge"
        else:
            fit = "fits" if self.ridge_batch_fits else "does NOT fit the memory"
            ridge = (
                f"batch {self.decode_ridge_batch:,} at context {c:,} ({fit}): "
                f"{self.decode_tok_s_at_ridge_batch:,.0f} tok/s at its floor"
            )
        rows = [
            (
                "device",
                f"{self.device}: {_rate(self.peak_tflops)} TFLOP/s, {_rate(self.bandwidth_gbps)} GB/s "
                f"({self.device_source}), {self.memory_bytes / GIB:,.1f} GiB ({self.memory_source})",
            ),
            (
                "memory for weights and KV",
                f"{self.memory_budget_bytes / GIB:,.1f} GiB: {MEMORY_UTILIZATION:.0%} of what the CUDA context leaves "
                "(the rest: activations, the allocator's slack)",
            ),
            ("weights", f"{_gb(self.weights_bytes)} ({self.dtype})"),
            ("KV per token", f"{self.kv_bytes_per_token / 1024:,.1f} KiB"),
            (
                f"KV of {b} x {c:,} tokens",
                _gb(self.kv_bytes) + ("" if self.fits else "  (with the weights: does NOT fit)"),
            ),
            ("KV capacity after the weights", f"{capacity:,} tokens{seqs}"),
            (
                f"TTFT floor ({b} x {p:,}-token prompt)",
                _floor(self.ttft_floor_s, self.ttft_bound, self.ttft_compute_floor_s, self.ttft_bandwidth_floor_s),
            ),
            (
                f"TPOT floor (batch {b}, context {c:,})",
                _floor(self.tpot_floor_s, self.tpot_bound, self.tpot_compute_floor_s, self.tpot_bandwidth_floor_s),
            ),
            ("ridge point", f"{self.ridge_flop_per_byte:,.0f} FLOP/byte"),
            ("decode turns compute-bound at", ridge),
            (
                "tok/s at the floors",
                f"prefill {_rate(self.prefill_tok_s_at_floor)}, decode {_rate(self.decode_tok_s_at_floor)} (batch {b})",
            ),
        ]
        if self.price_per_device_hour is None:
            rows.append(("$/Mtok at the floors", "give a price per device-hour"))
        else:
            at_ridge = self.decode_cost_per_mtok_at_ridge_batch
            rows.append(
                (
                    f"$/Mtok at ${self.price_per_device_hour:g}/device-hour{' (' + price_label + ')' if price_label else ''}",
                    f"prefill {_money(self.prefill_cost_per_mtok)}, decode {_money(self.decode_cost_per_mtok)} (batch {b})"
                    + ("" if at_ridge is None else f", {_money(at_ridge)} at the ridge batch"),
                )
            )
        return rows + [("note", n) for n in self.notes]

    def lines(self, price_label: str = "") -> list[str]:
        """``rows`` as aligned text lines (what a run without a display prints)."""
        rows = self.rows(price_label)
        width = max(len(k) for k, _ in rows)
        head = f"napkin math: {self.model}, {self.dtype}, on {self.device} [computed floors, not measurements]"
        return [head] + [f"  {k:<{width}}  {v}" for k, v in rows]


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.3g} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:,.3g} MB"


def format_seconds(seconds: float) -> str:
    """A duration with a unit a reader takes in at a glance: s, ms or µs, three significant digits."""
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def _floor(floor_s: float, bound: str, compute_s: float, bandwidth_s: float) -> str:
    return (
        f"{format_seconds(floor_s)}, {bound}-bound (compute {format_seconds(compute_s)}, "
        f"bandwidth {format_seconds(bandwidth_s)})"
    )


def _money(value: float | None) -> str:
    if value is None:
        return "N/A"
    return f"${value:.3g}" if value < 1 else f"${value:,.2f}"


def int4_note(cfg: ModelConfig, dtype_bytes: float, weights: float) -> str:
    """What "int4" is here (minieng's scheme, ``weights`` its resident bytes), beside what a GPTQ or
    AWQ checkpoint of the same model holds: groups of ``GPTQ_AWQ_GROUP_SIZE``, the LM head left in 16
    bits (tied to the embedding, it is the embedding). Their zeros are packed in 4 bits; counted here
    at 16, as minieng's (1.2% of a byte a weight more)."""
    layers = matmul_bytes(cfg, "int4", GPTQ_AWQ_GROUP_SIZE, dtype_bytes).layers
    head = 0 if cfg.tie_word_embeddings else matmul_bytes(cfg, None, 1, dtype_bytes).lm_head
    theirs = weight_bytes(cfg, dtype_bytes, MatmulBytes(layers, head))
    return (
        f"int4 is minieng's scheme: 4-bit weights in groups of {DEFAULT_GROUP_SIZE}, a 16-bit scale and zero "
        f"each, the LM head quantized too ({_gb(weights)}); a GPTQ or AWQ checkpoint (groups of "
        f"{GPTQ_AWQ_GROUP_SIZE}, the LM head in 16 bits) holds {_gb(theirs)}"
    )


def napkin_estimate(
    model_config: ModelConfig,
    device: DeviceSpec,
    dtype: str,
    batch_size: int,
    prompt_tokens: int,
    context_tokens: int,
    price_per_device_hour: float | None = None,
    model_name: str = "",
) -> NapkinEstimate:
    """The floors of ``model_config`` on ``device`` (module docstring; ``NapkinEstimate`` names each).

    Args:
        dtype: a ``NAPKIN_DTYPES`` name ("bf16", "fp16", "fp32", "int8 weights, bf16 KV", ...).
        batch_size: sequences prefilled together and decoding together.
        prompt_tokens: each prompt's length, for the TTFT floor (one step, nothing cached).
        context_tokens: tokens already in each sequence's KV cache at the decode step timed by the
            TPOT floor, and the context of the KV capacity and the ridge batch.
        price_per_device_hour: the price of an hour of the device, the reader's (None: no costs).
        model_name: its name, for the text.
    Raises:
        ValueError: an unknown dtype, a batch or prompt under 1, a negative context, a negative
            price, or a device without a positive peak, bandwidth and memory.
    """
    if dtype not in NAPKIN_DTYPES:
        raise ValueError(f"dtype={dtype!r}: use one of {', '.join(NAPKIN_DTYPES)}")
    if batch_size < 1 or prompt_tokens < 1 or context_tokens < 0:
        raise ValueError(
            f"batch_size={batch_size}, prompt_tokens={prompt_tokens} must be >= 1 and context_tokens={context_tokens} >= 0"
        )
    if price_per_device_hour is not None and (price_per_device_hour < 0 or not math.isfinite(price_per_device_hour)):
        raise ValueError(f"price_per_device_hour={price_per_device_hour} must be a finite price >= 0 (or None)")
    if device.peak_tflops <= 0 or device.bandwidth_gbps <= 0 or device.budget_bytes <= 0:
        raise ValueError(f"{device.name}: peak, bandwidth and memory (past the CUDA context) must be > 0, got {device}")
    cfg = model_config
    dtype_bytes, scheme = NAPKIN_DTYPES[dtype]
    products = matmul_bytes(cfg, scheme, DEFAULT_GROUP_SIZE, dtype_bytes) if scheme else None
    peak, bandwidth = device.peak_tflops * 1e12, device.bandwidth_gbps * 1e9
    ridge = device.ridge_flop_per_byte
    # Both phases get both of the roofline's floors: FLOPs / peak (``prefill_floor_s``) and bytes /
    # bandwidth (``tpot_floor_s``); the larger binds.

    weights = weight_bytes(cfg, dtype_bytes, products)
    kv_per_token = cfg.kv_bytes_per_token(dtype_bytes)
    kv = kv_per_token * batch_size * context_tokens
    room = device.budget_bytes - weights
    capacity = max(0, int(room // kv_per_token))

    prefill = step_work(cfg, [(prompt_tokens, 0, 1)] * batch_size, dtype_bytes, matmul_bytes=products)
    decode = decode_work(cfg, batch_size, context_tokens, dtype_bytes, products)
    ridge_batch = decode_ridge_batch(cfg, context_tokens, dtype_bytes, ridge, products)
    ridge_tok_s = ridge_fits = None
    if ridge_batch is not None:
        at_ridge = decode_work(cfg, ridge_batch, context_tokens, dtype_bytes, products)
        ridge_step_s = max(prefill_floor_s(at_ridge.total_flops, peak), tpot_floor_s(at_ridge.total_bytes, bandwidth))
        ridge_tok_s = ridge_batch / ridge_step_s
        ridge_fits = ridge_batch * context_tokens * kv_per_token <= room

    notes = []
    if room < 0:
        notes.append(
            f"the weights ({_gb(weights)}) do not fit the {device.budget_bytes / GIB:,.1f} GiB that {device.name} "
            f"leaves for weights and KV ({device.memory_bytes / GIB:,.1f} GiB in all): split the "
            "model over devices (tensor parallelism) or quantize it; the floors assume they fit"
        )
    elif kv > room:
        notes.append(
            f"the batch's KV ({_gb(kv)}) does not fit beside the weights: the memory holds {capacity:,} tokens of KV"
        )
    if not device.covers(dtype):
        notes.append(
            f"{device.name}'s peak is for {device.peak_dtype}, not {dtype}: the compute floors are not this dtype's "
            f"(its own dtype: {device.native_dtype()})"
        )
    if scheme == "int4":
        notes.append(int4_note(cfg, dtype_bytes, weights))
    if max(prompt_tokens, context_tokens + 1) > cfg.max_position_embeddings:
        notes.append(f"past the model's context of {cfg.max_position_embeddings:,} tokens")
    return NapkinEstimate(
        model=model_name,
        device=device.name,
        device_source=device.source,
        dtype=dtype,
        batch_size=batch_size,
        prompt_tokens=prompt_tokens,
        context_tokens=context_tokens,
        memory_bytes=device.memory_bytes,
        memory_budget_bytes=device.budget_bytes,
        peak_tflops=device.peak_tflops,
        bandwidth_gbps=device.bandwidth_gbps,
        weights_bytes=weights,
        kv_bytes_per_token=kv_per_token,
        kv_bytes=kv,
        kv_capacity_tokens=capacity,
        fits=room >= kv,
        ttft_compute_floor_s=prefill_floor_s(prefill.total_flops, peak),
        ttft_bandwidth_floor_s=tpot_floor_s(prefill.total_bytes, bandwidth),
        tpot_compute_floor_s=prefill_floor_s(decode.total_flops, peak),
        tpot_bandwidth_floor_s=tpot_floor_s(decode.total_bytes, bandwidth),
        ridge_flop_per_byte=ridge,
        decode_ridge_batch=ridge_batch,
        ridge_batch_fits=ridge_fits,
        decode_tok_s_at_ridge_batch=ridge_tok_s,
        price_per_device_hour=price_per_device_hour,
        notes=tuple(notes),
        memory_source=device.memory_source,
    )
