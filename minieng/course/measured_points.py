"""The reader's own timings, read back from the results folder and set beside a napkin floor.

The notebooks store their results through ``kit.cached`` (01's two phases, 02's roofline sweep,
03's batch-1 decode, context sweep and prefill batches, 05's batch sweep). ``measured_points`` reads
every TTFT and TPOT among them for a published shape; ``measured_rows`` picks, for a setting, the
stored TTFT and TPOT nearest in prompt and context, measured on the same device, and puts each
beside the floor at its own settings with the gap in one line (``gap_words``: what the floor leaves
out, kernel launches, attention's extra work, the host). Results measured on another device are
never compared with this one's floors.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path

from minieng.config import PUBLISHED_CHECKPOINTS, PUBLISHED_SHAPES, ModelConfig
from minieng.course.kit import results_dir
from minieng.measure.napkin import TORCH_DTYPE_NAMES, DeviceSpec, format_seconds, napkin_estimate
from minieng.measure.peaks import datasheet_peak
from minieng.measure.roofline import Bound, format_percent

# Notebook 01's batch-1 decode follows a 64-token prompt (its ``text_prompts(..., 64, 1)``).
NOTEBOOK_01_DECODE_PROMPT_TOKENS = 64


def shape_name(model_name: str | None) -> str | None:
    """The published shape a model's name stands for: a ``PUBLISHED_SHAPES`` name itself, or its
    checkpoint (the Hub id or its last part: the embedded "SmolLM2-135M-Instruct" is SmolLM2-135M's
    shape). None for anything else (a local folder, another model)."""
    if model_name in PUBLISHED_SHAPES:
        return model_name
    for shape, repo in PUBLISHED_CHECKPOINTS.items():
        if model_name in (repo, repo.split("/")[-1]):
            return shape
    return None


@dataclass(frozen=True)
class MeasuredPoint:
    """One timing a notebook stored: a prefill's TTFT (``phase`` "prefill", ``tokens`` the prompt)
    or a decode's TPOT ("decode", ``tokens`` the mean context during the timed steps), at
    ``batch_size``, in seconds, with where and when it was measured."""

    phase: str
    batch_size: int
    tokens: int
    seconds: float
    shape: str
    dtype: str
    notebook: str
    measured_at: str
    device_type: str
    device_name: str
    host: str


def _two_phases(params: dict, result: dict):
    for r in result["prefill"]:
        yield "prefill", 1, r["prompt_tokens"], r["ttft_s"]
    context = NOTEBOOK_01_DECODE_PROMPT_TOKENS + params["decode_tokens"] // 2
    yield "decode", 1, context, result["decode"]["tpot_s"]


def _roofline(params: dict, result: dict):
    for r in result["prefill"]:
        yield "prefill", 1, r["prompt_tokens"], r["seconds_per_step"]
    context = params["decode_prompt_tokens"] + params["decode_tokens"] // 2
    for r in result["decode"]:
        yield "decode", r["batch_size"], context, r["seconds_per_step"]


def _decode_b1(params: dict, result: dict):
    context = params["decode_prompt_tokens"] + result["num_steps"] // 2
    yield "decode", 1, context, result["seconds"] / result["num_steps"]


def _kv_context(params: dict, result: dict):
    for r in result["rows"]:
        yield "decode", params["batch"], r["context_tokens"] + params["steps"] // 2, r["tpot_s"]


def _prefill_batch(params: dict, result: dict):
    for r in result["rows"]:
        yield "prefill", r["batch_size"], params["prompt_tokens"], r["step_s"]


def _batch_sweep(params: dict, result: dict):
    context = params["prompt_tokens"] + params["output_tokens"] // 2
    for r in result["rows"]:
        yield "decode", r["batch_size"], context, r["tpot_s"]


# The cached results (``kit.cached``'s names) that hold a TTFT or a TPOT: name -> (notebook, reader).
READERS = {
    "two_phases": ("01", _two_phases),
    "roofline": ("02", _roofline),
    "decode_b1": ("03", _decode_b1),
    "kv_context": ("03", _kv_context),
    "prefill_batch": ("03", _prefill_batch),
    "batch_sweep": ("05", _batch_sweep),
}


def measured_points(directory: Path | None = None) -> list[MeasuredPoint]:
    """Every TTFT and TPOT the notebooks stored in the results folder (``kit.cached``'s: ``directory``,
    else ``MINIENG_RESULTS_DIR``, else ``results/``) for a published shape. A file of another format,
    cut short, or of a model without a published shape is skipped."""
    folder = results_dir(directory)
    points = []
    for name, (notebook, reader) in READERS.items():
        for path in sorted(folder.glob(f"{name}-*.json")):
            try:
                stored = json.loads(path.read_text())
                params, where = stored["params"], stored["environment"]
                shape = shape_name(params.get("model"))
                dtype = TORCH_DTYPE_NAMES.get(str(params.get("dtype", "")).removeprefix("torch."))
                if shape is None or dtype is None:
                    continue
                for phase, batch, tokens, seconds in reader(params, stored["result"]):
                    points.append(
                        MeasuredPoint(
                            phase,
                            int(batch),
                            int(tokens),
                            float(seconds),
                            shape,
                            dtype,
                            notebook,
                            stored.get("measured_at", ""),
                            where.get("device", ""),
                            where.get("device_name") or "",
                            where.get("host", ""),
                        )
                    )
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
    return points


def measured_on(point: MeasuredPoint, device: DeviceSpec, machine_type: str | None) -> bool:
    """Whether ``point`` was measured on ``device``: this machine (same host, same device type) for
    measured ceilings, a GPU whose name the datasheet table maps to ``device`` for a datasheet entry."""
    if device.source == "measured":
        return point.host == platform.node() and point.device_type == machine_type
    if point.device_type != "cuda":
        return False
    sheet = datasheet_peak(point.device_name)
    return sheet is not None and sheet.name == device.name


def nearest_point(
    points: list[MeasuredPoint],
    phase: str,
    shape: str,
    dtype: str,
    device: DeviceSpec,
    batch_size: int,
    tokens: int,
    machine_type: str | None = None,
) -> MeasuredPoint | None:
    """The stored point of ``phase`` for this shape, dtype, device and batch whose tokens (prompt or
    context) lie nearest ``tokens`` by ratio (the newest of equals); None when there is none."""
    fits = [
        p
        for p in points
        if p.phase == phase
        and p.shape == shape
        and p.dtype == dtype
        and p.batch_size == batch_size
        and measured_on(p, device, machine_type)
    ]
    if not fits:
        return None
    distance = {p: abs(math.log((p.tokens + 1) / (tokens + 1))) for p in fits}
    nearest = min(distance.values())
    # "YYYY-MM-DD HH:MM UTC" sorts as text: the newest of the nearest
    return max((p for p in fits if distance[p] == nearest), key=lambda p: p.measured_at)


def gap_words(point: MeasuredPoint, compute_floor_s: float, bandwidth_floor_s: float) -> str:
    """The measured time against the floor at its own settings, and what fills the gap, in one line.

    The share the floor explains is ``roofline.Bound``'s (max of MFU and MBU); under a quarter the
    step is overhead-bound: fixed costs per step that neither the FLOPs nor the bytes require.
    """
    bound = Bound(point.seconds, compute_floor_s, bandwidth_floor_s)
    ratio = point.seconds / bound.floor_s
    times = f"{ratio:.2f}x" if ratio < 10 else f"{ratio:,.0f}x"
    if ratio < 1:
        return f"{times} its floor, BELOW it: a ceiling measured low or a wrong count (SUSPECT)"
    if bound.limit == "overhead":
        cause = (
            "mostly fixed cost per step that the floor does not count: kernel launches, Python and the host "
            "between kernels"
        )
    elif point.phase == "decode":
        cause = (
            "the rest: many small kernels a step, each reading below a large copy's speed, attention gathering "
            "the KV cache, and the launches between them"
        )
    else:
        cause = (
            "the rest: products below the matmul ceiling at these shapes, attention's softmax and masking "
            "(outside the FLOP count), and the launches"
        )
    return f"{times} its floor (the floor explains {format_percent(100 * bound.explained)}): {cause}"


def measured_rows(
    points: list[MeasuredPoint],
    config: ModelConfig,
    shape: str,
    device: DeviceSpec,
    dtype: str,
    batch_size: int,
    prompt_tokens: int,
    context_tokens: int,
    machine_type: str | None = None,
) -> list[tuple[str, str]]:
    """(quantity, text) rows of the measured TTFT and TPOT nearest these settings, each with its floor
    at its own settings and ``gap_words``; one row saying none is stored when neither is."""
    rows = []
    for phase, tokens, what in (("prefill", prompt_tokens, "TTFT"), ("decode", context_tokens, "TPOT")):
        p = nearest_point(points, phase, shape, dtype, device, batch_size, tokens, machine_type)
        if p is None:
            continue
        prompt, context = (p.tokens, context_tokens) if phase == "prefill" else (prompt_tokens, p.tokens)
        at = napkin_estimate(config, device, dtype, p.batch_size, prompt, context)
        floors = (
            (at.ttft_compute_floor_s, at.ttft_bandwidth_floor_s)
            if phase == "prefill"
            else (at.tpot_compute_floor_s, at.tpot_bandwidth_floor_s)
        )
        setting = f"{p.tokens:,}-token prompts" if phase == "prefill" else f"context {p.tokens:,}"
        rows.append(
            (
                f"measured {what} (notebook {p.notebook})",
                f"{format_seconds(p.seconds)} at batch {p.batch_size}, {setting} ({p.measured_at}); "
                + gap_words(p, *floors),
            )
        )
    if not rows:
        rows.append(
            (
                "measured here",
                f"nothing stored for {shape} in {dtype} at batch {batch_size} on {device.name}: notebooks 01, 02, "
                "03 and 05 store their timings in the results folder",
            )
        )
    return rows
