"""The GPU path's predictions (issue 33), each decided by a measurement: CONFIRMED, REFUTED or UNTESTED.

A cold review of the CUDA path predicted what a GPU would do and the fixes it asked for were made and
proven on the CPU; what only a GPU can show is measured here, in one run (``make gpu-check
GPU_CHECK_ARGS="--sections pred"``). Every prediction has a bound and a figure read as
``figure <= bound`` (``verdicts``: ``PREDICTIONS``, ``decide``, ``untested``, ``pred_line``):
CONFIRMED when it holds, REFUTED when it does not, UNTESTED with the reason where this device cannot
decide (a CUDA-only measurement on a CPU). ``predictions`` runs the measurements in groups, each
under its own guard: one that raises leaves its predictions UNTESTED with the error, and the others
still run. The groups' measurements: ``sm75_refused`` (here), ``memory_peaks`` (the load peak,
notebook 10 under a T4's memory), ``path_checks`` (each decode path run strictly, with
``step_dispatch``'s ops and masks), ``step_dispatch`` (the host syncs of sampling), ``kernel_times``
(Triton against gather, the quantized linears), ``compiled_regions``.

Time on an H200 at full size (``smoke=False``), estimated, not measured (no GPU ran this yet):

- ``triton-sm75-refused``: the refusal read from ``attention.check_attention_backend`` given a
  capability, < 1 s (decided on any device);
- ``load-peak-bytes``: Llama-3-8B built in bf16 with dummy weights, the allocator's peak, ~5 s;
- the decode paths of the 135M shape (eager in bf16, CUDA graphs, ``compile=True``, Triton eager,
  Triton with graphs): ``ops-eager-bf16``, ``ops-graphed-bf16``, ``no-bool-mask``, ``kernels-*``
  (torch.profiler), ``strict-paths``, ``triton-graphs``, ``triton-no-midrun-compile``; ~60 s, most of
  it Inductor's compile;
- ``sampling-syncs``: one sampling step under ``torch.cuda.set_sync_debug_mode``, < 1 s;
- ``triton-vs-gather``: one layer's decode attention at five points on a random pool, ~15 s (Triton
  compiles a variant per shape);
- ``quant-*-linear`` and ``w8a8-ops``: one 4,096 x 14,336 linear per scheme at 1 and 16 rows, ~5 s;
- ``compiled-regions``: five small compiled engines in this process, ~60 s;
- ``nb10-t4``: notebook 10's engines (its model for a T4, fp16, its pools and experiments) under a
  14.5 GiB cap, ~45 s.

About 3 minutes in all, within the issue's 5. On a CPU in smoke mode (tiny shapes) the CPU-decidable
predictions take 30-70 s on 2 cores (measured), nearly all of it the C++ compiles of
``compiled-regions`` (less where Inductor's cache already holds them).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch

from .checkpoints import release
from .compiled_regions import compiled_regions
from .kernel_times import quant_linears, triton_vs_gather
from .memory_peaks import T4_MEMORY_CAP_GIB, load_peak, notebook10_engine_set, under_memory_cap
from .path_checks import decode_path_checks
from .step_dispatch import sampling_syncs
from .verdicts import PREDICTIONS, decide, untested
from minieng.wings.fast_paths import triton_attention
from minieng.wings.fast_paths.forward_paths import check_attention_backend

# -- the Triton backend's refusal below sm_80, read from the code path -------------------------------


def sm75_refused() -> list[dict]:
    """``attention.check_attention_backend`` asked for Triton on a CUDA device that reports sm_75,
    sm_80 and sm_90 (``torch.cuda.get_device_capability`` patched for the call): the figure counts
    the wrong decisions (sm_75 accepted, or sm_80/90 refused). The code path, decided on any device."""
    if not triton_attention.TRITON_AVAILABLE:
        return [untested("triton-sm75-refused", "triton is not installed: the refusal would be for that")]
    decisions = {}
    for capability in ((7, 5), (8, 0), (9, 0)):
        with mock.patch.object(torch.cuda, "get_device_capability", lambda device=None, c=capability: c):
            try:
                check_attention_backend("triton", 128, torch.device("cuda"))
                decisions[f"sm_{capability[0]}{capability[1]}"] = "accepted"
            except ValueError as e:
                decisions[f"sm_{capability[0]}{capability[1]}"] = f"refused: {e}"
    wrong = (not decisions["sm_75"].startswith("refused") or "sm_75" not in decisions["sm_75"]) + sum(
        decisions[k] != "accepted" for k in ("sm_80", "sm_90")
    )
    here = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    return [decide("triton-sm75-refused", wrong, "from the code path", {"decisions": decisions, "this_gpu": here})]


# -- the section ---------------------------------------------------------------------------------------


def predictions(
    path: Path,
    device: torch.device,
    smoke: bool,
    work: Path,
    load_format: str = "dummy",
    max_model_len: int = 1024,
    notebook10: Callable[[], object] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every prediction of ``PREDICTIONS`` decided on ``device``: the decode paths on the checkpoint
    at ``path`` (the 135M shape; ``TINY`` in smoke mode), small checkpoints made under ``work``.
    ``notebook10``: the call ``nb10-t4`` runs under the cap (default ``notebook10_engine_set``;
    CUDA only, and not in smoke mode). Returns ``{"records": [one per prediction, in
    ``PREDICTIONS``' order], "group_s": seconds per group, "wall_s"}``."""
    started = time.perf_counter()
    say = progress or (lambda _: None)
    cuda = device.type == "cuda"
    groups: dict[str, tuple[tuple[str, ...], Callable[[], list[dict]]]] = {
        "sm75": (("triton-sm75-refused",), sm75_refused),
        # first of the CUDA groups: nothing an earlier check left in the process counts against its cap
        "nb10": (("nb10-t4",), lambda: nb10(device, smoke, notebook10)),
        "load": (("load-peak-bytes",), lambda: load_peak(device, smoke)),
        "paths": (
            (
                "ops-eager-bf16",
                "ops-graphed-bf16",
                "no-bool-mask",
                "kernels-eager",
                "kernels-graph",
                "kernels-compiled",
                "kernels-triton",
                "strict-paths",
                "triton-graphs",
                "triton-no-midrun-compile",
            ),
            lambda: decode_path_checks(path, device, load_format, max_model_len),
        ),  # fmt: skip
        "sampling": (("sampling-syncs",), lambda: sampling_syncs(device)),
        "attention": (("triton-vs-gather",), lambda: triton_vs_gather(device, smoke)),
        "quant": (
            ("w8a8-ops", "quant-int8-linear", "quant-w8a8-linear", "quant-int4-linear"),
            lambda: quant_linears(device, smoke),
        ),
        "regions": (("compiled-regions",), lambda: compiled_regions(work, device)),
    }
    by_id: dict[str, dict] = {}
    group_s = {}
    for group, (ids, fn) in groups.items():
        say(f"pred {group}")
        start = time.perf_counter()
        try:
            for record in fn():
                by_id[record["id"]] = record
        except Exception as e:  # noqa: BLE001 (one group failing leaves its predictions UNTESTED, saying why)
            error = f"{type(e).__name__}: {str(e)[:300]}"
            say(traceback.format_exc())
            for pid in ids:
                by_id.setdefault(pid, untested(pid, f"error: {error}", {"traceback": traceback.format_exc()}))
        finally:
            release()
            if cuda:
                torch.cuda.set_per_process_memory_fraction(1.0, device)
        group_s[group] = time.perf_counter() - start
        for pid in ids:  # a group that forgot one of its predictions says so
            by_id.setdefault(pid, untested(pid, "not measured by its group"))
    return {
        "records": [by_id[pid] for pid in PREDICTIONS],
        "group_s": group_s,
        "wall_s": time.perf_counter() - started,
    }


def nb10(device: torch.device, smoke: bool, call: Callable[[], object] | None) -> list[dict]:
    """``nb10-t4`` where it can be decided: CUDA, full size."""
    if device.type != "cuda":
        return [untested("nb10-t4", "needs CUDA: a memory cap on the device")]
    if smoke:
        return [untested("nb10-t4", "smoke mode: notebook 10's engines are full size")]
    return [under_memory_cap(call or (lambda: notebook10_engine_set(device)), device, T4_MEMORY_CAP_GIB)]
