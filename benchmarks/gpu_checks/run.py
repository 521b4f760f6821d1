"""The GPU check in one call: the ceilings, the checkpoints, every section, the targets.

Each section runs on its own: one that raises leaves ``{"error", "traceback"}`` in its place and
the others still run, so a failure never hides the figures around it.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from .checkpoints import DUMMY_WEIGHTS, FULL, SHAPES, SMOKE, TINY, make_checkpoint
from .decode_paths import decode_paths
from .features import prefix_cache, quantization, speculative, tensor_parallel
from .parity import parity
from .predictions import predictions
from .speed import nvml_during_decode, shape_speed
from .targets import targets
from minieng.measure.harness import fingerprint
from minieng.measure.peaks import datasheet_peak, measure_ceilings

# The sections, in the order they run: parity with transformers, each shape's phases, the decode
# paths, the prefix cache, speculative decoding, NVML during decode (CUDA only), quantization,
# tensor parallelism, and issue 33's predictions (``predictions``: ``--sections pred`` runs them alone).
SECTIONS = ("parity", "speed", "paths", "prefix", "spec", "nvml", "quant", "tp", "pred")
RESULT_KEYS = {
    "prefix": "prefix_cache",
    "spec": "speculative",
    "quant": "quantization",
    "tp": "tensor_parallel",
    "pred": "predictions",
}


def pick_device(name: str = "auto") -> torch.device:
    """``"auto"``: CUDA where torch sees a GPU, else the CPU; any other name as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_gpu_check(
    device: torch.device,
    smoke: bool = False,
    sections: Iterable[str] = SECTIONS,
    extra: dict[str, Callable[[], object]] | None = None,
    progress: Callable[[str], None] = _stderr,
) -> dict:
    """Run ``sections`` (a subset of ``SECTIONS``) on ``device`` and read the targets.

    Random-weight checkpoints of ``SHAPES`` (``TINY`` for each with ``smoke=True``, at ``SMOKE``
    sizes, in seconds: the code runs, the figures mean nothing) are made in a temporary folder when
    a section first needs one, and removed afterwards. ``extra``: further sections by result key,
    run after the others under the same guard (the script adds the course's notebooks here: the lab
    never imports the course).
    ``progress`` gets one line per section (elapsed seconds, name) and any traceback.

    Returns a JSON-serializable dict: ``smoke``, ``peaks`` (measured, then the datasheet's on a
    known GPU), ``parity``, ``speed`` (one entry per shape), ``paths``, ``prefix_cache``,
    ``speculative``, ``nvml``, ``quantization``, ``tensor_parallel``, ``predictions``
    (``predictions.predictions``: one record per prediction) (None when not run), the keys
    of ``extra``, ``targets``, ``environment`` (the harness fingerprint) and ``wall_s``.
    """
    sizes = SMOKE if smoke else FULL
    shapes = {name: TINY for name in SHAPES} if smoke else SHAPES
    chosen = set(sections)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    started = time.perf_counter()
    measured, _, _ = measure_ceilings(device, dtype)
    sheet = datasheet_peak(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    peaks = [measured] + ([sheet] if sheet else [])
    result: dict = {"smoke": smoke, "peaks": [pk.to_dict() for pk in peaks]}

    def section(key: str, fn: Callable[[], object]) -> None:
        name = key.split(":")[0]
        if name not in chosen:
            return
        progress(f"[{time.perf_counter() - started:6.1f} s] {key}")
        try:
            value = fn()
        except Exception as e:  # one failing section must not hide the others' figures
            value = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            progress(value["traceback"])
        if ":" in key:
            result.setdefault(name, []).append(value)
        else:
            result[key] = value

    with tempfile.TemporaryDirectory(prefix="minieng-gpu-check-", ignore_cleanup_errors=True) as work:
        made: dict[str, Path] = {}

        def ckpt(name: str) -> Path:  # made on first use: a section run alone makes only what it reads
            if name not in made:
                made[name] = make_checkpoint(
                    Path(work) / name, shapes[name], sizes.max_position, device, weights=name not in DUMMY_WEIGHTS
                )
            return made[name]

        fmt = "dummy" if smoke else "auto"  # smoke: tiny dummy weights; full: the checkpoints' weights
        section("parity", lambda: parity(ckpt("smollm2-135m"), device, sizes))
        for name in shapes:
            shape_format = "dummy" if name in DUMMY_WEIGHTS or smoke else "auto"
            section(f"speed:{name}", lambda n=name, f=shape_format: shape_speed(n, ckpt(n), device, peaks, sizes, f))
        section("paths", lambda: decode_paths(ckpt("smollm2-1.7b"), device, peaks, sizes, fmt))
        section("prefix", lambda: prefix_cache(ckpt("smollm2-1.7b"), device, sizes, fmt))
        section("spec", lambda: speculative(ckpt("smollm2-1.7b"), ckpt("smollm2-135m"), device, sizes))
        if device.type == "cuda":
            section("nvml", lambda: nvml_during_decode(ckpt("smollm2-1.7b"), device, peaks, sizes, fmt))
        section("quant", lambda: quantization(ckpt("smollm2-1.7b"), device, peaks, sizes, fmt))
        section("tp", lambda: tensor_parallel(ckpt("smollm2-1.7b"), device, sizes, fmt))
        section(
            "pred",
            lambda: predictions(
                ckpt("smollm2-135m"),
                device,
                smoke,
                Path(work) / "pred",
                fmt,
                min(1024, sizes.max_position),
                progress=progress,
            ),
        )
        for key, fn in (extra or {}).items():
            chosen.add(key)
            section(key, fn)
    for short, long in RESULT_KEYS.items():
        result[long] = result.pop(short, None)
    result["targets"] = targets(result)
    result["environment"] = fingerprint(device, dtype)
    result["wall_s"] = time.perf_counter() - started
    return result
