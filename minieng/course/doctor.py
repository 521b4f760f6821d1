"""``python -m minieng doctor``: a workshop preflight on the learner's machine, before the first notebook.

It checks, in order, what a lesson needs and says what to fix where a check fails:

- device: the device and dtype the engines will pick (``peaks.check_environment``), and on Colab
  whether a GPU runtime was chosen;
- ceilings: this machine's matmul and copy ceilings (``ceilings.machine_ceilings``: the cached ones,
  else measured now, seconds), which every MFU/MBU and the GPU's model choice read;
- memory: the free memory (torch's on a GPU; the host's available RAM, from /proc/meminfo, on a CPU)
  against what the model the notebooks choose needs (``lab.course_model``): its weights and the largest
  KV pool a notebook gives it (``KV_POOL_GIB``);
- weights: whether the model's weights can be had: the embedded GGUF installed, the chosen checkpoint
  in the local Hugging Face cache or downloads allowed (without them a lesson times random weights of
  its shape: real timings, noise for text);
- widgets: whether ipywidgets imports (the panels), and its version;
- core path: the core path's reading and running time on this machine (``course_path.core_path_times``).

A check is "ok", "warn" (the course runs, with what is worth knowing) or "FAIL" (a lesson would
stop): ``doctor()`` exits non-zero when one fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

import torch

from minieng.config import DEFAULT_MODEL_NAME, PUBLISHED_CHECKPOINTS, published_config
from minieng.course.kit import on_colab
from minieng.course.measured_points import shape_name
from minieng.device import host_memory_bytes
from minieng.lab.model_for_device import MODEL_ENV, course_model, downloads_allowed
from minieng.measure.ceilings import machine_ceilings
from minieng.measure.peaks import check_environment
from minieng.model.loader import DEFAULT_INSTALL, default_gguf_path
from minieng.model.weight_bytes import weight_bytes
from minieng.package_data import notebooks_path
from minieng.units import GIB

KV_POOL_GIB = 2  # the largest KV pool a notebook gives its engine (02's and 03's KV_CACHE_GIB)
STATUSES = ("ok", "warn", "FAIL")


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``status`` one of ``STATUSES``, what was found, and what to do (``fix``)."""

    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class Machine:
    """What the checks found so far, for the checks after them."""

    device: str = "cpu"
    dtype: str = "float32"
    bandwidth_gbps: float | None = None
    model: str = DEFAULT_MODEL_NAME
    notes: list[str] = field(default_factory=list)


def colab_runtime() -> bool:
    """On Colab: in its kernel (``google.colab`` imported) or in a command it runs (``COLAB_RELEASE_TAG`` set)."""
    return on_colab() or "COLAB_RELEASE_TAG" in os.environ


def free_bytes(device: str) -> int | None:
    """Memory free now: the GPU's (``torch.cuda.mem_get_info``) or the host's available RAM; None if unknown."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return host_memory_bytes()[1]


def widgets_version() -> str:
    """ipywidgets' version, once it imports (raises ImportError where it does not)."""
    import ipywidgets  # noqa: F401  (the import is the check)

    try:
        return version("ipywidgets")
    except PackageNotFoundError:
        return "unknown version"


def cached_checkpoint(hub_id: str) -> bool:
    """Whether the local Hugging Face cache holds ``hub_id``'s weights (never the network)."""
    from huggingface_hub import snapshot_download  # lazy: only a checkpoint needs the Hub client

    try:
        path = snapshot_download(hub_id, local_files_only=True)
    except Exception:  # not cached, or a cache it cannot read
        return False
    return any(name.endswith(".safetensors") for name in os.listdir(path))


def check_device(m: Machine) -> Check:
    env = check_environment()
    m.device, m.dtype = env.device, env.dtype.removeprefix("torch.")
    detail = f"{env.device} ({env.device_name}), {m.dtype}: {env.dtype_reason}"
    if colab_runtime() and not env.device.startswith("cuda"):
        return Check("device", "warn", detail, "no GPU in this runtime: Runtime > Change runtime type > T4 GPU")
    return Check("device", "ok", detail)


def check_ceilings(m: Machine) -> Check:
    try:
        c = machine_ceilings(m.device, noise=False)
    except RuntimeError as e:
        return Check("ceilings", "FAIL", "could not be measured", str(e))
    m.bandwidth_gbps = c.peak.bandwidth_gbps
    when = f"cached, measured {c.measured_at}" if getattr(c, "from_cache", False) else "measured now"
    return Check(
        "ceilings", "ok", f"matmul {c.peak.peak_tflops:.3g} TFLOP/s, copy {c.peak.bandwidth_gbps:.3g} GB/s ({when})"
    )


def check_memory(m: Machine) -> Check:
    probe = None  # on a GPU, the notebooks keep the engine that timed the choice: counted as taken
    if os.environ.get(MODEL_ENV):
        m.model, why = os.environ[MODEL_ENV], f"named by ${MODEL_ENV}"
    elif m.device.startswith("cuda"):  # the notebooks' own choice: it times the embedded model, downloads nothing
        with _offline():
            probe = course_model(bandwidth_gbps=m.bandwidth_gbps, device=m.device)
        m.model, why = probe.name, "what the notebooks choose for this GPU"
    else:
        m.model, why = DEFAULT_MODEL_NAME, "the embedded model, on a CPU"
    shape, free = shape_name(m.model), free_bytes(m.device)
    del probe
    if shape is None or free is None:
        unknown = "its size" if shape is None else "the free memory"
        return Check("memory", "warn", f"{m.model} ({why}): {unknown} unknown here, so not checked")
    weights = weight_bytes(published_config(shape), getattr(torch, m.dtype).itemsize)
    need = weights + KV_POOL_GIB * GIB
    where = "of the GPU (the CUDA context already taken)" if m.device.startswith("cuda") else "of RAM"
    detail = (
        f"{m.model} ({why}): weights {weights / GIB:.2f} GiB + a {KV_POOL_GIB} GiB KV pool = {need / GIB:.2f} GiB; "
        f"{free / GIB:.2f} GiB {where} free"
    )
    if need > free:
        return Check(
            "memory",
            "FAIL",
            detail,
            f"free {(need - free) / GIB:.2f} GiB more: close other notebooks and programs (on Colab: Runtime > "
            "Restart session), or run a smaller model (MINIENG_MODEL=SmolLM2-135M)",
        )
    return Check("memory", "ok", detail)


def check_weights(m: Machine) -> Check:
    try:
        gguf = default_gguf_path()
    except ValueError:
        return Check("weights", "FAIL", f"the embedded {DEFAULT_MODEL_NAME} is not installed", DEFAULT_INSTALL)
    embedded = f"embedded {DEFAULT_MODEL_NAME}: {gguf.stat().st_size / 1e6:.0f} MB GGUF installed"
    hub_id = PUBLISHED_CHECKPOINTS.get(shape_name(m.model) or "")
    if m.model == DEFAULT_MODEL_NAME or hub_id is None:
        return Check("weights", "ok", embedded)
    if cached_checkpoint(hub_id):
        return Check("weights", "ok", f"{embedded}; {hub_id} in the local Hugging Face cache")
    if downloads_allowed() or colab_runtime():
        return Check("weights", "ok", f"{embedded}; {hub_id} downloads from the Hub once (HF_HOME caches it)")
    return Check(
        "weights",
        "warn",
        f"{embedded}; {hub_id} is neither cached nor allowed to download: the lessons would time random "
        "weights of its shape (real timings, meaningless text)",
        f"allow downloads (HF_HUB_OFFLINE=0) or fetch it beforehand (hf download {hub_id})",
    )


def check_widgets(m: Machine) -> Check:
    try:
        found = widgets_version()
    except ImportError:
        return Check(
            "widgets", "FAIL", "ipywidgets does not import: the panels would not render",
            "pip install 'minieng[notebooks]' (in a checkout: pip install -e '.[notebooks]')",
        )  # fmt: skip
    return Check("widgets", "ok", f"ipywidgets {found}")


def check_core_path(m: Machine) -> Check:
    try:
        from minieng.course.course_path import core_path_times, minutes
    except ImportError as e:
        return Check("core path", "warn", f"not estimated: {e}")
    times = core_path_times(notebooks_path())
    reading = "?" if times["reading_s"] is None else minutes(times["reading_s"])
    if times["fits"] is None:
        return Check(
            "core path", "warn", f"reading {reading}; running not yet measured on this machine for "
            + ", ".join(times["missing"]),
            "time it once in full mode: python -m minieng course (make course)",
        )  # fmt: skip
    detail = f"reading {reading} + running {minutes(times['run_s'])} = {minutes(times['total_s'])}"
    if not times["fits"]:
        return Check(
            "core path", "warn", detail + f": over {minutes(times['budget_s'])}",
            "run the core path in smoke mode (MINIENG_SMOKE=1), or on a GPU",
        )  # fmt: skip
    return Check("core path", "ok", detail + f", within {minutes(times['budget_s'])}")


CHECKS = (check_device, check_ceilings, check_memory, check_weights, check_widgets, check_core_path)


class _offline:
    """``HF_HUB_OFFLINE=1`` for a block: the model choice then names its checkpoint without fetching it."""

    def __enter__(self):
        self.before = os.environ.get("HF_HUB_OFFLINE")
        os.environ["HF_HUB_OFFLINE"] = "1"

    def __exit__(self, *_):
        if self.before is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = self.before


def run_checks(checks=None) -> list[Check]:
    """Every check in order (default ``CHECKS``); one that raises is a FAIL that says what it raised."""
    machine, found = Machine(), []
    for check in checks or CHECKS:
        name = check.__name__.removeprefix("check_").replace("_", " ")
        try:
            found.append(check(machine))
        except Exception as e:  # a preflight reports what broke, and goes on
            found.append(Check(name, "FAIL", f"{type(e).__name__}: {e}", "see the error above"))
    return found


def report(checks: list[Check]) -> list[str]:
    """The checks as text lines, a fix under each check that has one, and the verdict."""
    lines = ["minieng doctor: a workshop preflight on this machine"]
    for c in checks:
        lines.append(f"  {c.status:<5} {c.name:<10} {c.detail}")
        if c.fix:
            lines.append(f"        {'fix' if c.status == 'FAIL' else 'hint'}: {c.fix}")
    failed = [c.name for c in checks if c.status == "FAIL"]
    if failed:
        lines.append(f"{len(failed)} check(s) failed ({', '.join(failed)}): fix them, then run this again.")
    else:
        lines.append("Ready for the workshop" + (" (see the hints above)." if any(c.fix for c in checks) else "."))
    return lines


def doctor(checks=None) -> int:
    """Run the checks, print ``report``, and return the exit status: 1 when a check failed, else 0."""
    found = run_checks(checks)
    print("\n".join(report(found)))
    return 1 if any(c.status == "FAIL" for c in found) else 0
