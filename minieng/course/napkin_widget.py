"""The napkin-math calculator as a panel, with the reader's own measurements on top of its floors.

``napkin()`` is the one call a notebook makes: a panel of a model (the published shapes of
``config.PUBLISHED_SHAPES``), a device (the datasheet table of ``measure.peaks.DATASHEET`` with its
memory, and "this machine": the ceilings ``measure.ceilings.machine_ceilings`` measured), a dtype,
sliders for the batch, the prompt and the context, and a price per device-hour. It redraws at once
on every change (the arithmetic takes microseconds: no Run button). Every figure is
``measure.napkin.napkin_estimate``'s; this module only reads the results folder and draws.

The measured point: the notebooks store their results through ``kit.cached`` (01's two phases,
02's roofline sweep, 03's context sweep and prefill batches, 05's batch sweep). For the model,
dtype, device and batch on the panel, the stored TTFT and TPOT nearest in prompt and context are
shown beside the floor at their own settings, and the gap between them in one line: what the floor
leaves out (kernel launches, attention's extra work, the host). Results measured on another device
are not compared with this one's floors.

Without a kernel (a script, CI's plain Python) ``napkin()`` prints the same table; in smoke mode it
prints it as well as returning the panel, so a headless run records the numbers.
"""

from __future__ import annotations

import functools
import html
import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path

from minieng.config import PUBLISHED_CHECKPOINTS, PUBLISHED_SHAPES, ModelConfig, published_config
from minieng.course.kit import _results_dir, dropdown, int_slider
from minieng.measure.harness import smoke_mode
from minieng.measure.napkin import (
    NAPKIN_DTYPES,
    TORCH_DTYPE_NAMES,
    DeviceSpec,
    NapkinEstimate,
    datasheet_devices,
    format_seconds,
    measured_device,
    napkin_estimate,
)
from minieng.measure.peaks import datasheet_peak
from minieng.measure.roofline import Bound, format_percent
from minieng.measure.token_cost import EXAMPLE_PRICE_PER_DEVICE_HOUR  # labelled as an example wherever shown

THIS_MACHINE = "this machine"
DEFAULT_SHAPE = "SmolLM2-135M"  # the embedded default model's shape
PRICE_EXAMPLE_LABEL = "an example: type your price"
MAX_BATCH = 1024
# Notebook 01's batch-1 decode follows a 64-token prompt (its ``text_prompts(..., 64, 1)``).
NOTEBOOK_01_DECODE_PROMPT_TOKENS = 64


@functools.cache
def shape_config(name: str) -> ModelConfig:
    """``config.published_config(name)``, built once per process (transformers' config class is slow)."""
    return published_config(name)


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


def this_machine_device(ceilings) -> DeviceSpec | None:
    """This machine as a ``DeviceSpec``: its ``ceilings`` (a ``ceilings.Ceilings``, from
    ``machine_ceilings``) and the memory of their device (a GPU's total, or the host's RAM; None
    where the OS does not say)."""
    import torch  # lazy: the panel's other parts need no torch

    from minieng.device import host_memory_bytes

    device = torch.device(ceilings.device)
    if device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        memory = host_memory_bytes()[0] or 0
    if not memory:
        return None
    return measured_device(ceilings.peak, memory, ceilings.dtype)


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
    folder = _results_dir(directory)
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


def _price(text: str) -> float | None:
    """The price box's number, or None for anything that is not a finite price >= 0."""
    try:
        value = float(text.strip().lstrip("$"))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _table_html(title: str, rows: list[tuple[str, str]]) -> str:
    cells = "".join(
        f"<tr><td style='padding-right:1em;vertical-align:top'><b>{html.escape(k)}</b></td>"
        f"<td>{html.escape(v)}</td></tr>"
        for k, v in rows
    )
    return f"<div><p><b>{html.escape(title)}</b></p><table>{cells}</table></div>"


def _devices(this_machine: DeviceSpec | None) -> dict[str, DeviceSpec]:
    found = {THIS_MACHINE: this_machine} if this_machine else {}
    return found | {d.name: d for d in datasheet_devices()}


def napkin_table(
    model: str = DEFAULT_SHAPE,
    device: str = THIS_MACHINE,
    dtype: str | None = None,
    batch_size: int = 1,
    prompt_tokens: int = 512,
    context_tokens: int = 1024,
    price_per_device_hour: float | None = EXAMPLE_PRICE_PER_DEVICE_HOUR,
    this_machine: DeviceSpec | None = None,
    machine_type: str | None = None,
    results_dir: Path | None = None,
    price_is_example: bool | None = None,
) -> tuple[NapkinEstimate, list[tuple[str, str]], str]:
    """The panel's content for one setting: the ``NapkinEstimate``, its rows with the measured ones
    after them, and the title. ``device``: "this machine" or a datasheet name; ``dtype`` None: the
    device's own; ``price_is_example``: label the price as an example (None: when it equals
    ``token_cost.EXAMPLE_PRICE_PER_DEVICE_HOUR``). Raises ``ValueError`` for an unknown shape or device."""
    devices = _devices(this_machine)
    if model not in PUBLISHED_SHAPES or device not in devices:
        raise ValueError(
            f"model={model!r} or device={device!r} unknown: use {list(PUBLISHED_SHAPES)} and {list(devices)}"
        )
    spec = devices[device]
    dtype = dtype or spec.native_dtype()
    cfg = shape_config(model)
    est = napkin_estimate(cfg, spec, dtype, batch_size, prompt_tokens, context_tokens, price_per_device_hour, model)
    if price_is_example is None:
        price_is_example = price_per_device_hour == EXAMPLE_PRICE_PER_DEVICE_HOUR
    label = PRICE_EXAMPLE_LABEL if price_is_example else ""
    measured = measured_rows(
        measured_points(results_dir), cfg, model, spec, dtype, batch_size, prompt_tokens, context_tokens, machine_type
    )
    title = (
        f"Napkin math: {model} in {dtype} on {spec.name} (floors computed from the peaks; measured rows from your runs)"
    )
    return est, est.rows(label) + measured, title


def napkin_panel(
    model: str = DEFAULT_SHAPE,
    device: str = THIS_MACHINE,
    dtype: str | None = None,
    batch_size: int = 1,
    prompt_tokens: int = 512,
    context_tokens: int = 1024,
    this_machine: DeviceSpec | None = None,
    machine_type: str | None = None,
    results_dir: Path | None = None,
):
    """The calculator as an ipywidgets ``VBox``: the controls, then an ``HTML`` table redrawn on every
    change (``napkin_table``), drawn once at build time. ``panel.controls`` holds the controls by
    name (model, device, dtype, batch_size, prompt_tokens, context_tokens, price) and
    ``panel.table`` the ``HTML`` widget, so a test can move a slider and read the new figures."""
    import ipywidgets as w  # lazy: the notebooks extra's

    devices = _devices(this_machine)
    if device not in devices:
        device = next(iter(devices))
    start_dtype = dtype or devices[device].native_dtype()
    longest = shape_config(model).max_position_embeddings
    default_price = f"{EXAMPLE_PRICE_PER_DEVICE_HOUR:.2f}"
    controls = {
        "model": dropdown("model", list(PUBLISHED_SHAPES), model),
        "device": dropdown("device", list(devices), device),
        "dtype": dropdown("dtype", list(NAPKIN_DTYPES), start_dtype),
        "batch_size": int_slider("batch", batch_size, 1, MAX_BATCH),
        "prompt_tokens": int_slider("prompt tokens", min(prompt_tokens, longest), 1, longest),
        "context_tokens": int_slider("context tokens", min(context_tokens, longest), 0, longest),
        "price": w.Text(
            value=default_price,
            description="$ per device-hour",
            placeholder="your price per device-hour",
            continuous_update=False,
            style={"description_width": "initial"},
        ),
    }
    note = w.HTML(
        f"<i>$ per device-hour: {EXAMPLE_PRICE_PER_DEVICE_HOUR:.2f} is {PRICE_EXAMPLE_LABEL}, not a quote.</i>"
    )
    table = w.HTML()
    drawing = {"on": False}

    def draw(_=None):
        if drawing["on"]:
            return
        c = {name: control.value for name, control in controls.items()}
        price = _price(c["price"])
        _, rows, title = napkin_table(
            c["model"],
            c["device"],
            c["dtype"],
            c["batch_size"],
            c["prompt_tokens"],
            c["context_tokens"],
            price,
            this_machine,
            machine_type,
            results_dir,
            price_is_example=c["price"] == default_price,  # the box as built: the example, untouched
        )
        if price is None and c["price"].strip():
            rows.append(("price", f"{c['price']!r} is not a price: type a number (per device-hour)"))
        table.value = _table_html(title, rows)

    def model_changed(change):
        longest = shape_config(change["new"]).max_position_embeddings
        drawing["on"] = True  # the sliders' clamping must not draw half-updated settings
        try:
            for name in ("prompt_tokens", "context_tokens"):
                slider = controls[name]
                slider.value = min(slider.value, longest)
                slider.max = longest
        finally:
            drawing["on"] = False
        draw()

    def device_changed(change):
        spec = devices[change["new"]]
        if not spec.covers(controls["dtype"].value):
            drawing["on"] = True
            try:
                controls["dtype"].value = spec.native_dtype()
            finally:
                drawing["on"] = False
        draw()

    controls["model"].observe(model_changed, names="value")
    controls["device"].observe(device_changed, names="value")
    for name in ("dtype", "batch_size", "prompt_tokens", "context_tokens", "price"):
        controls[name].observe(draw, names="value")
    panel = w.VBox([*controls.values(), note, table])
    panel.controls, panel.table = controls, table
    draw()
    return panel


def _in_kernel() -> bool:
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def napkin(
    model: str | None = None,
    device: str = THIS_MACHINE,
    dtype: str | None = None,
    batch_size: int = 1,
    prompt_tokens: int = 512,
    context_tokens: int = 1024,
    ceilings=None,
    results_dir: Path | None = None,
):
    """The napkin-math calculator, in one call from any notebook (module docstring).

    Args:
        model: a published shape, or a lesson model's name (``course_model(...).name``: the embedded
            "SmolLM2-135M-Instruct" is SmolLM2-135M's shape); None or a model without a published
            shape: SmolLM2-135M.
        device: "this machine" or a ``measure.peaks.DATASHEET`` name ("H100 SXM").
        dtype: a ``measure.napkin.NAPKIN_DTYPES`` name; None: the device's own.
        batch_size, prompt_tokens, context_tokens: the sliders' starting values.
        ceilings: this machine's ``ceilings.Ceilings`` (a notebook's ``machine_ceilings()``); None
            reads them from their cache (or measures them, a few seconds).
        results_dir: where the notebooks' results are (default: ``kit.cached``'s folder).
    Returns:
        in a Jupyter kernel, the panel (``napkin_panel``); elsewhere None, after printing the table.
        In smoke mode the table is printed in a kernel too, so a headless run records its numbers.
    """
    import torch  # lazy: only "this machine" needs it

    shape = shape_name(model) or DEFAULT_SHAPE
    if model is not None and shape_name(model) is None:
        print(f"({model} has no published shape: the calculator starts on {DEFAULT_SHAPE})")
    if ceilings is None:
        from minieng.measure.ceilings import machine_ceilings

        try:
            ceilings = machine_ceilings(noise=False)
        except RuntimeError as e:
            print(f"(this machine left out of the calculator: {e})")
    machine = this_machine_device(ceilings) if ceilings is not None else None
    machine_type = torch.device(ceilings.device).type if ceilings is not None else None
    if machine is None and device == THIS_MACHINE:
        device = "H100 SXM"
    panel = (
        napkin_panel(
            shape, device, dtype, batch_size, prompt_tokens, context_tokens, machine, machine_type, results_dir
        )
        if _in_kernel()
        else None
    )
    if panel is None or smoke_mode():
        est, rows, title = napkin_table(
            shape,
            device,
            dtype,
            batch_size,
            prompt_tokens,
            context_tokens,
            EXAMPLE_PRICE_PER_DEVICE_HOUR,
            machine,
            machine_type,
            results_dir,
        )
        width = max(len(k) for k, _ in rows)
        print("\n".join([title] + [f"  {k:<{width}}  {v}" for k, v in rows]))
    return panel
