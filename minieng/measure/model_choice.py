"""Which model a lesson should measure on a device: one whose decode step is mostly reading bytes.

The course teaches that batch-1 decode is bound by memory bandwidth. That is true of a model only
when reading its bytes takes most of a step. A first-order model of a decode step:

    step_s = fixed_s + bytes / bandwidth

where ``bytes`` is what the step reads (``flops_bytes.decode_work``: the weights, and the KV cache of
its context) and ``fixed_s`` what it pays whatever its size: kernel launches, host work, small
ops. ``fixed_s`` grows with the layers (each layer launches the same handful of ops), so it is
kept per layer, measured on the device with the embedded model (``fixed_cost_per_layer_s``).

``choose_model`` takes the smallest published shape (``LESSON_SHAPES``: ``config.PUBLISHED_SHAPES`` but the
drafts) whose bytes take at least ``DOMINANCE`` times its fixed cost (then reading bytes is at least
75% of the step, and MBU can reach 75%) and whose weights fit in ``MEMORY_FRACTION`` of the device's free
memory, leaving the rest to the lesson's KV pools, quantized copies and ceiling buffers. On a
CPU the embedded SmolLM2-135M already qualifies (its 0.5 GB of fp32 weights are most of a
step); on a GPU its 0.27 GB of bf16 take a few hundredths of a millisecond, far under the
step's fixed cost, and a lesson on it would teach overhead, not bandwidth.

Pure arithmetic: no torch, no device. ``lab.course_model`` measures and calls it.
"""

from __future__ import annotations

from dataclasses import dataclass

from minieng.config import DRAFT_ONLY_SHAPES, PUBLISHED_SHAPES, ModelConfig, published_config
from minieng.measure.flops_bytes import decode_work

DOMINANCE = 3.0  # bytes / bandwidth >= 3 x fixed cost: reading bytes is >= 75% of the step
MEMORY_FRACTION = 0.4  # of the free device memory, for the weights
CONTEXT_TOKENS = 128  # the context of the batch-1 decode step the choice predicts
LESSON_SHAPES = tuple(n for n in PUBLISHED_SHAPES if n not in DRAFT_ONLY_SHAPES)  # what the choice takes from


@dataclass(frozen=True)
class ModelChoice:
    """A shape chosen for a device, with the prediction that chose it.

    Attributes:
        name: its ``PUBLISHED_SHAPES`` name.
        config: its ``ModelConfig``.
        dtype_bytes: bytes per weight and KV element (2: bf16/fp16; 4: fp32).
        decode_bytes: a batch-1 decode step's bytes at ``CONTEXT_TOKENS`` of context.
        weight_bytes: its weights' bytes.
        tpot_floor_s: ``decode_bytes`` / bandwidth: the step's time if reading bytes were all of it.
        fixed_cost_s: the predicted fixed cost of its step (per layer x layers).
        bytes_dominate: ``tpot_floor_s >= DOMINANCE * fixed_cost_s``; False when no shape that
            fits qualifies (then the largest that fits was chosen, and a lesson must say so).
    """

    name: str
    config: ModelConfig
    dtype_bytes: int
    decode_bytes: float
    weight_bytes: float
    tpot_floor_s: float
    fixed_cost_s: float
    bytes_dominate: bool

    @property
    def bytes_share(self) -> float:
        """The predicted share of a batch-1 decode step spent reading bytes: floor / (floor + fixed)."""
        return self.tpot_floor_s / (self.tpot_floor_s + self.fixed_cost_s)

    def reason(self) -> str:
        """Why this shape, in a sentence with its figures."""
        figures = (
            f"a batch-1 decode step reads {self.decode_bytes / 1e9:.2f} GB: {self.tpot_floor_s * 1e3:.2f} ms at the "
            f"bandwidth, against a predicted fixed cost of {self.fixed_cost_s * 1e3:.2f} ms per step"
        )
        if self.bytes_dominate:
            return f"{figures}, so reading bytes is about {100 * self.bytes_share:.0f}% of the step"
        return (
            f"{figures}: no shape that fits this device reads enough for the bytes to dominate (the largest that "
            f"fits reads {100 * self.bytes_share:.0f}% of its step), so its decode is partly overhead-bound"
        )


def predict(
    name: str, bandwidth_bytes_per_s: float, dtype_bytes: int, fixed_cost_per_layer_s: float, config=None
) -> ModelChoice:
    """The prediction for one published shape (``config`` overrides the table's, for tests)."""
    cfg = config or published_config(name)
    work = decode_work(cfg, 1, CONTEXT_TOKENS, dtype_bytes)
    floor_s = work.total_bytes / bandwidth_bytes_per_s
    fixed_s = fixed_cost_per_layer_s * cfg.num_hidden_layers
    return ModelChoice(
        name=name,
        config=cfg,
        dtype_bytes=dtype_bytes,
        decode_bytes=work.total_bytes,
        weight_bytes=float(work.weight_bytes),
        tpot_floor_s=floor_s,
        fixed_cost_s=fixed_s,
        bytes_dominate=floor_s >= DOMINANCE * fixed_s,
    )


def choose_model(
    bandwidth_bytes_per_s: float,
    free_memory_bytes: float,
    dtype_bytes: int,
    fixed_cost_per_layer_s: float,
    candidates: list[str] | None = None,
) -> ModelChoice:
    """The smallest shape (by decode bytes) whose bytes dominate its step and whose weights fit
    in ``MEMORY_FRACTION`` of ``free_memory_bytes``; if none dominates, the largest that fits.

    Args:
        bandwidth_bytes_per_s: the device's memory bandwidth (measured, or the datasheet's).
        free_memory_bytes: the device memory free for the lesson.
        dtype_bytes: the dtype the engine will run in (2 on a GPU).
        fixed_cost_per_layer_s: a decode step's fixed cost per layer (``fixed_cost_per_layer_s``).
        candidates: ``PUBLISHED_SHAPES`` names to choose from (default: ``LESSON_SHAPES``, all of them but
            the drafts, ``config.DRAFT_ONLY_SHAPES``).
    Raises:
        ValueError: a non-positive bandwidth or memory, a negative fixed cost, an unknown name,
            or no candidate whose weights fit (free some memory, or name a smaller model).
    """
    if bandwidth_bytes_per_s <= 0 or free_memory_bytes <= 0 or fixed_cost_per_layer_s < 0:
        raise ValueError(
            f"bandwidth_bytes_per_s={bandwidth_bytes_per_s}, free_memory_bytes={free_memory_bytes} must be > 0 "
            f"and fixed_cost_per_layer_s={fixed_cost_per_layer_s} >= 0"
        )
    names = list(LESSON_SHAPES) if candidates is None else candidates
    preds = sorted(
        (predict(n, bandwidth_bytes_per_s, dtype_bytes, fixed_cost_per_layer_s) for n in names),
        key=lambda c: c.decode_bytes,
    )
    fits = [c for c in preds if c.weight_bytes <= MEMORY_FRACTION * free_memory_bytes]
    if not fits:
        smallest = preds[0]
        raise ValueError(
            f"no model fits: the smallest, {smallest.name}, has {smallest.weight_bytes / 1e9:.2f} GB of weights and "
            f"{MEMORY_FRACTION:.0%} of the {free_memory_bytes / 1e9:.2f} GB free is "
            f"{MEMORY_FRACTION * free_memory_bytes / 1e9:.2f} GB: free device memory, or name a model (MODEL=...)"
        )
    return next((c for c in fits if c.bytes_dominate), fits[-1])


def fixed_cost_per_layer_s(
    decode_step_s: float, model_config: ModelConfig, dtype_bytes: int, bandwidth_bytes_per_s: float
) -> float:
    """A decode step's fixed cost per layer, from one measured batch-1 step of ``model_config``:
    (step - bytes / bandwidth) / layers, never below 0 (a step faster than its bytes' floor
    means a floor measured low, not a negative cost)."""
    floor_s = decode_work(model_config, 1, CONTEXT_TOKENS, dtype_bytes).total_bytes / bandwidth_bytes_per_s
    return max(0.0, decode_step_s - floor_s) / model_config.num_hidden_layers
