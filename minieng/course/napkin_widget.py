"""The napkin-math calculator as a panel, with the reader's own measurements on top of its floors.

``napkin()`` is the one call a notebook makes: a panel of a model (the published shapes of
``config.PUBLISHED_SHAPES``), a device (the datasheet table of ``measure.peaks.DATASHEET`` with its
memory, and "this machine": the ceilings ``measure.ceilings.machine_ceilings`` measured), a dtype,
sliders for the batch, the prompt and the context, and a price per device-hour. It redraws at once
on every change (the arithmetic takes microseconds: no Run button). Every figure is
``measure.napkin.napkin_estimate``'s; this module only reads the results folder and draws.

The measured point: for the model, dtype, device and batch on the panel, the reader's stored TTFT
and TPOT nearest in prompt and context, beside the floor at their own settings with the gap in one
line (``measured_points``).

Without a kernel (a script, CI's plain Python) ``napkin()`` prints the same table; in smoke mode it
prints it as well as returning the panel, so a headless run records the numbers.
"""

from __future__ import annotations

import functools
import html
import math
from pathlib import Path

from minieng.config import PUBLISHED_SHAPES, ModelConfig, published_config
from minieng.course.kit import dropdown, in_kernel, int_slider
from minieng.course.measured_points import measured_points, measured_rows, shape_name
from minieng.measure.harness import smoke_mode
from minieng.measure.napkin import (
    NAPKIN_DTYPES,
    DeviceSpec,
    NapkinEstimate,
    datasheet_devices,
    this_machine_device,
    napkin_estimate,
)
from minieng.measure.token_cost import EXAMPLE_PRICE_PER_DEVICE_HOUR  # labelled as an example wherever shown

THIS_MACHINE = "this machine"
DEFAULT_SHAPE = "SmolLM2-135M"  # the embedded default model's shape
PRICE_EXAMPLE_LABEL = "an example: type your price"
MAX_BATCH = 1024


@functools.cache
def shape_config(name: str) -> ModelConfig:
    """``config.published_config(name)``, built once per process (transformers' config class is slow)."""
    return published_config(name)


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
        if in_kernel()
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
