"""The GPU path's predictions (issue 33), each decided by a measurement: CONFIRMED, REFUTED or UNTESTED.

A cold review of the CUDA path predicted what a GPU would do and the fixes it asked for were made and
proven on the CPU; what only a GPU can show is measured here, in one run (``make gpu-check
GPU_CHECK_ARGS="--sections pred"``). Every prediction has a bound (``PREDICTIONS``, with the issue's figure it
comes from) and a figure read as ``figure <= bound``: CONFIRMED when it holds, REFUTED when it does
not, UNTESTED with the reason where this device cannot decide (a CUDA-only measurement on a CPU).
Each group of measurements runs under its own guard: one that raises leaves its predictions UNTESTED
with the error, and the others still run.

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

import gc
import time
import traceback
import warnings
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from minieng.config import SamplingParams, published_config
from minieng.device import dtype_choice
from minieng.engine.cuda_graph import DecodeGraphs, capture_batch_sizes, capture_widths
from minieng.engine.forward_paths import COMPILED_REGIONS, COMPILED_STEP, CUDA_GRAPH, EAGER, FastPathFailed, fall_back
from minieng.engine.llm_engine import LLMEngine
from minieng.engine.sampling import KeyedRandom, sample
from minieng.lab.gpu_check.checkpoints import GREEDY, TINY, make_checkpoint, release
from minieng.lab.gpu_check.decode_paths import kernels_per_step, triton_runs_here
from minieng.lab.gpu_utilization import decode_ops, decoding
from minieng.measure.allocations import AllocationTrace
from minieng.measure.op_count import OpCounter, count_layer_ops
from minieng.measure.workloads import text_prompts
from minieng.model import triton_attention
from minieng.model.attention import build_metadata, check_attention_backend, paged_attention, sdpa_backends
from minieng.model.loader import build_model, randomize
from minieng.model.quantization import DEFAULT_GROUP_SIZE, make_linear
from minieng.units import cdiv

CONFIRMED, REFUTED, UNTESTED = "CONFIRMED", "REFUTED", "UNTESTED"
GIB = 1024**3


@dataclass(frozen=True)
class Prediction:
    """What a GPU will do, as a figure (``unit``) that must stay ``<= bound``; ``source``: where
    the bound comes from (the issue's figure, or the reasoning that sets it)."""

    id: str
    claim: str
    unit: str
    bound: float
    source: str


# fmt: off
PREDICTIONS = {p.id: p for p in [
    Prediction("load-peak-bytes", "building a bf16 model (dummy weights) holds at most 2.05 bytes a parameter at peak",
               "bytes/param", 2.05, "issue 33 section 1: cast on the meta device, no float32 copy (was 6 at the peak)"),
    Prediction("ops-eager-bf16", "an eager bf16 decode layer dispatches at most 14 computing ops",
               "ops/layer", 14, "issue 33 section 2: the fp32 budget in bf16 (was 16.8)"),
    Prediction("ops-graphed-bf16", "the forward CUDA graphs capture dispatches at most 14 computing ops a bf16 layer",
               "ops/layer", 14, "issue 33 section 2 (was 22)"),
    Prediction("no-bool-mask", "no bool mask reaches SDPA in a decode step (eager or graphed forward)",
               "calls", 0, "issue 33 section 2: an additive mask in the compute dtype, built once a step"),
    Prediction("kernels-eager", "an eager decode step launches at most 16 GPU activities a layer",
               "kernels/layer", 16, "issue 33 section 2: 14 computing ops a layer, one kernel each, plus 2 a layer "
               "for the step's own (embedding, head, copies); ~26 a layer before the fixes"),
    Prediction("kernels-graph", "a CUDA-graph decode step replays at most 16 kernels a layer",
               "kernels/layer", 16, "as kernels-eager"),
    Prediction("kernels-compiled", "a compile=True decode step (regions in the graphs) runs at most 16 kernels a layer",
               "kernels/layer", 16, "as kernels-eager (Inductor fuses the elementwise ops: fewer)"),
    Prediction("kernels-triton", "a Triton-attention decode step (graphs) runs at most 16 kernels a layer",
               "kernels/layer", 16, "as kernels-eager"),
    Prediction("sampling-syncs", "a sampling step of greedy and non-greedy rows (two settings) reaches the host once",
               "syncs/step", 1, "issue 33 section 2: one vectorized pass a step, not one sync a row"),
    Prediction("triton-vs-gather", "Triton paged decode takes at most the gather + SDPA path's time, per layer, at "
               "every point (8B b1 1k/8k, 8B b64 1k, 1.7B b1/b64 1k)", "x gather's (worst point)", 1.0,
               "issue 33 section 3: flash-decoding splits the context (0.3 ms a layer at 8B b1 8k before)"),
    Prediction("triton-graphs", "with attention_backend='triton' every decode bucket is captured",
               "buckets missing", 0, "issue 33 section 3: the gather budget does not filter an in-place kernel"),
    Prediction("triton-no-midrun-compile", "after start-up no decode step compiles a Triton kernel variant",
               "variants", 0, "issue 33 section 3: variants compiled in warm-up (1-3 s each mid-run before)"),
    Prediction("strict-paths", "with strict_forward_paths every decode step runs the path its engine was built for, "
               "and a fast path that fails raises", "steps off their path", 0, "issue 33 section 4"),
    Prediction("compiled-regions", "five engines of distinct (model, dtype, scheme) in one process each compile and "
               "run their own compiled regions (no recompile limit hit, no silent eager)", "engines failing", 0,
               "issue 33 section 4: Dynamo's recompile limit (8) silenced the fifth"),
    Prediction("quant-int8-linear", "int8 weight-only linear (14,336 x 4,096) at 1 row takes at most 0.6x bf16's time",
               "x bf16's", 0.6, "targets.QUANT_TPOT_RATIO, gpu-check's int8 target (half the bytes, room for scales)"),
    Prediction("quant-w8a8-linear", "W8A8 linear (14,336 x 4,096) at 1 row takes at most 0.6x bf16's time",
               "x bf16's", 0.6, "the int8 bound: the same weight bytes"),
    Prediction("quant-int4-linear", "int4 linear (14,336 x 4,096, groups of 64) at 1 row takes at most 0.4x bf16's",
               "x bf16's", 0.4, "targets.QUANT_TPOT_RATIO (a quarter of the bytes, room for scales and zeros)"),
    Prediction("w8a8-ops", "a W8A8 linear dispatches at most 8 computing ops at one row",
               "ops", 8, "issue 33 section 2 (was 16)"),
    Prediction("nb10-t4", "notebook 10's engines (its T4 model in fp16, its pools and experiments) fit a 14.5 GiB cap",
               "GiB reserved at peak", 14.5, "issue 33 section 1: a T4's 15 GiB less the CUDA context"),
    Prediction("triton-sm75-refused", "the Triton backend is refused below sm_80 and accepted from sm_80",
               "wrong decisions", 0, "issue 33 section 3: no tensor cores for tl.dot on sm_75"),
]}
# fmt: on


def decide(prediction_id: str, figure: float | None, reason: str = "", details: dict | None = None) -> dict:
    """A record of ``prediction_id`` (a key of ``PREDICTIONS``): CONFIRMED if ``figure <= bound``,
    else REFUTED; UNTESTED when ``figure`` is None (``reason`` says why). JSON-serializable: ``id``,
    ``claim``, ``figure``, ``unit``, ``bound``, ``source``, ``verdict``, ``reason``, ``details``."""
    p = PREDICTIONS[prediction_id]
    verdict = UNTESTED if figure is None else CONFIRMED if figure <= p.bound else REFUTED
    return {
        "id": p.id,
        "claim": p.claim,
        "figure": figure,
        "unit": p.unit,
        "bound": p.bound,
        "source": p.source,
        "verdict": verdict,
        "reason": reason,
        "details": details or {},
    }


def untested(prediction_id: str, reason: str, details: dict | None = None) -> dict:
    """``decide`` without a figure: UNTESTED, saying why."""
    return decide(prediction_id, None, reason, details)


def pred_line(record: dict) -> str:
    """``PRED <id> <verdict> <figure> <unit> (<= bound)``, or ``PRED <id> UNTESTED (<reason>)``."""
    if record["verdict"] == UNTESTED:
        return f"PRED {record['id']} UNTESTED ({record['reason']})"
    extra = f"; {record['reason']}" if record["reason"] else ""
    return (
        f"PRED {record['id']} {record['verdict']} {record['figure']:.4g} {record['unit']} "
        f"(<= {record['bound']:g}{extra})"
    )


# -- what each group measures ----------------------------------------------------------------------


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


def load_peak(device: torch.device, smoke: bool) -> list[dict]:
    """Peak bytes a parameter while ``loader.build_model`` builds a bf16 model and
    ``loader.randomize`` fills it (what ``load_format="dummy"`` does): on CUDA the allocator's peak
    (``torch.cuda.max_memory_allocated``) over Llama-3-8B; elsewhere a dispatch trace
    (``measure.allocations.AllocationTrace``) over SmolLM2-135M (``smoke``, or any CPU: an 8B on a
    CPU takes minutes to fill)."""
    cuda = device.type == "cuda"
    name = "Llama-3-8B" if cuda and not smoke else "SmolLM2-135M"
    config = published_config(name)
    max_position = 256 if name == "SmolLM2-135M" else 8192
    if cuda:
        release()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        model = build_model(config, torch.bfloat16, device, max_position)
        randomize(model)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        method = "torch.cuda.max_memory_allocated"
        fp32_largest = None
    else:
        with AllocationTrace(device.type) as trace:
            model = build_model(config, torch.bfloat16, device, max_position)
            randomize(model)
        peak, method, fp32_largest = (
            trace.peak_bytes,
            "dispatch trace (measure.allocations)",
            trace.largest(torch.float32),
        )
    params = sum(p.numel() for p in model.parameters())
    del model
    release()
    details = {
        "model": name,
        "params": params,
        "peak_bytes": peak,
        "method": method,
        "largest_fp32_bytes": fp32_largest,
    }
    return [decide("load-peak-bytes", peak / params, f"{name}, {method}", details)]


@contextmanager
def sdpa_spy():
    """Records the ``attn_mask`` of every ``F.scaled_dot_product_attention`` call made inside (the
    model calls it through ``torch.nn.functional``); yields the list of masks."""
    masks: list = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))
        return sdpa(*args, **kwargs)

    with mock.patch.object(F, "scaled_dot_product_attention", spy):
        yield masks


def decode_layer_ops(engine: LLMEngine) -> list[dict]:
    """On a bf16 eager engine: the computing ops of a decode layer (batch 4) on the eager forward
    (``gpu_utilization.decode_ops``) and on the forward the CUDA graphs capture (``DecodeGraphs``
    with ``capture=False``, run eagerly on its static buffers), and the masks SDPA got in both."""
    prompts = text_prompts(engine.tokenizer, 20, 4)
    layers = engine.model.layers
    with sdpa_spy() as masks:
        eager = decode_ops(engine, prompts)
        graphs = DecodeGraphs(engine.model, engine.runner.kv_cache, 8, engine.max_model_len, 1 << 40, capture=False)
        with decoding(engine, prompts, 4) as ids:
            seqs = [engine.requests[i].seq for i in ids]
            lay = engine.runner.layout([(seq, 1) for seq in seqs])
            with count_layer_ops(layers) as counter:
                ran = graphs.run(lay) is not None  # None: no bucket fits (nothing was counted)
    graphed = counter.result().computing / len(layers)
    bool_masks = sum(m is not None and m.dtype == torch.bool for m in masks)
    dtype = str(engine.dtype).removeprefix("torch.")
    mask_details = {"sdpa_calls": len(masks), "mask_dtypes": sorted({str(m.dtype) for m in masks if m is not None})}
    return [
        decide("ops-eager-bf16", eager["computing_per_layer"], f"{dtype}, batch 4", eager),
        decide("ops-graphed-bf16", graphed, f"{dtype}, batch 4", {"ops": dict(counter.result().ops)})
        if ran
        else untested("ops-graphed-bf16", "no graph bucket fitted the step: nothing ran"),
        decide("no-bool-mask", bool_masks, f"{len(masks)} SDPA calls", mask_details)
        if masks
        else untested("no-bool-mask", "no SDPA call was seen: nothing to decide", mask_details),
    ]


# (batch, prompt tokens) of the decode runs each path's engine makes: block tables of 1, 4 and 19
# blocks (widths 1, 4 and 32 once padded on CUDA), the three classes Triton specializes an integer by
# (1, a multiple of 16, any other).
DECODE_RUNS = ((1, 10), (3, 60), (5, 300))


def decode_runs(engine: LLMEngine) -> list[str]:
    """Each run of ``DECODE_RUNS`` for 4 tokens; returns the forward path of every decode-only step."""
    paths = []
    for batch, context in DECODE_RUNS:
        first = len(engine.step_records)
        engine.generate(text_prompts(engine.tokenizer, context, batch), SamplingParams(max_tokens=4, **GREEDY))
        paths += [s.forward_path for s in engine.step_records[first:] if s.num_prefill_tokens == 0]
    return paths


def triton_variants(module=triton_attention) -> int | None:
    """Kernel variants Triton holds compiled for ``module``'s kernels (every ``@triton.jit`` function
    the module defines, through autotuners and heuristics, on every device: triton 3.3+'s
    ``device_caches``, or the older ``cache``); None where this Triton keeps them elsewhere, or runs
    interpreted (nothing is compiled). ``module``: ``triton_attention``, or any object with its
    ``TRITON_AVAILABLE`` and ``INTERPRETED`` flags (tests)."""
    if not module.TRITON_AVAILABLE or module.INTERPRETED:
        return None
    from triton.runtime.jit import JITFunction  # lazy: triton is optional

    total, found = 0, False
    for value in vars(module).values():
        fn = value
        for _ in range(4):  # an autotuner or heuristics wraps the kernel in ``.fn``
            if fn is None or isinstance(fn, JITFunction):
                break
            fn = getattr(fn, "fn", None)
        if not isinstance(fn, JITFunction):
            continue
        if isinstance(getattr(fn, "device_caches", None), dict):
            total += sum(len(entry[0]) for entry in fn.device_caches.values())
        elif isinstance(getattr(fn, "cache", None), dict):
            total += sum(len(kernels) for kernels in fn.cache.values())
        else:
            continue
        found = True
    return total if found else None


# path label: (EngineConfig fields, the forward path its decode steps must run on CUDA, on a CPU)
PATHS = {
    "eager": (dict(enforce_eager=True, dtype="bfloat16"), EAGER, EAGER),
    "graph": ({}, CUDA_GRAPH, EAGER),
    "compiled": (dict(compile=True), CUDA_GRAPH, COMPILED_STEP),
    "triton-eager": (dict(attention_backend="triton", enforce_eager=True), EAGER, EAGER),
    "triton": (dict(attention_backend="triton"), CUDA_GRAPH, EAGER),
}


def decode_path_checks(path: Path, device: torch.device, load_format: str, max_model_len: int) -> list[dict]:
    """One engine per ``PATHS`` label on the checkpoint at ``path`` (strict: a fast path that fails
    raises), sharing weights where the dtypes agree, each running ``DECODE_RUNS``. On a CPU the
    compiled path is left to ``compiled_regions`` (its compiles are the slow part of a CPU run) and
    the Triton paths to a GPU (what they would decide there, graphs and variants, a CPU cannot show;
    the ``paths`` section runs a Triton engine under the interpreter). Decides the ops, mask,
    kernel, strict-path and Triton predictions."""
    cuda = device.type == "cuda"
    base = dict(
        model=str(path),
        load_format=load_format,
        device=str(device),
        max_num_seqs=8,
        max_model_len=max_model_len,
        kv_cache_memory_gib=1.0 if cuda else 0.25,
        enable_prefix_caching=False,
        strict_forward_paths=True,
    )
    rows: dict[str, dict] = {}
    records: list[dict] = []
    loaded = {}
    variants_added = {}
    triton_graphs = None
    for label, (extra, on_cuda, on_cpu) in PATHS.items():
        if label.startswith("triton") and not cuda:  # interpreted, a tiny model's step takes seconds
            rows[label] = {"skipped": "needs CUDA (the paths section runs the Triton engine under the interpreter)"}
            continue
        if label.startswith("triton") and not triton_runs_here(device):
            rows[label] = {"skipped": "triton is not installed"}
            continue
        if label == "compiled" and not cuda:
            rows[label] = {"skipped": "on a CPU, compiled-regions decides the compiled path"}
            continue
        dtype = extra.get("dtype") or dtype_choice(device)[0]  # engines of one dtype share their weights
        engine = graphs = None
        try:  # a path that fails (strict: its fast path did not build) is that path's finding, not the group's
            engine = LLMEngine(**(base | extra), loaded=loaded.get(dtype))
            loaded.setdefault(dtype, engine.loaded)
            if label == "eager":
                records += decode_layer_ops(engine)
            before = triton_variants() if label.startswith("triton") else None
            paths = decode_runs(engine)
            if before is not None:
                variants_added[label] = triton_variants() - before
            expected = on_cuda if cuda else on_cpu
            graphs = engine.runner.graphs
            rows[label] = {
                "expected_path": expected,
                "decode_steps": len(paths),
                "off_path": sum(p != expected for p in paths),
                "paths_seen": sorted(set(paths)),
                "num_graphs": graphs.num_graphs if graphs else 0,
                "kernels_per_step": kernels_per_step(engine, text_prompts(engine.tokenizer, 16, 1)),
                "layers": len(engine.model.layers),
                "dropped_paths": dict(engine.runner.dropped_paths),
            }
            if label == "triton" and graphs is not None:
                expected_buckets = len(graphs.query_lens) * len(graphs.batch_sizes) * len(graphs.widths)
                triton_graphs = (expected_buckets - graphs.num_graphs, expected_buckets)
        except Exception as e:  # noqa: BLE001
            rows[label] = {"error": f"{type(e).__name__}: {str(e)[:300]}", "traceback": traceback.format_exc()}
            if label == "eager":
                done = {r["id"] for r in records}
                records += [
                    untested(pid, f"the eager engine failed: {rows[label]['error']}")
                    for pid in ("ops-eager-bf16", "ops-graphed-bf16", "no-bool-mask")
                    if pid not in done
                ]
        del engine, graphs
        release()
    loaded.clear()
    release()
    records += kernel_records(rows, cuda)
    records.append(strict_record(rows))
    records.append(triton_graphs_record(triton_graphs, path, device, load_format, max_model_len, rows))
    records.append(
        decide(
            "triton-no-midrun-compile",
            sum(variants_added.values()),
            "variants compiled after start-up, per engine: " + ", ".join(f"{k} {v}" for k, v in variants_added.items()),
            {"variants_added": variants_added},
        )
        if variants_added
        else untested(
            "triton-no-midrun-compile",
            "needs CUDA (Triton's interpreter compiles nothing)" if not cuda else "Triton's kernel cache not readable",
        )
    )
    return records


def kernel_records(rows: dict, cuda: bool) -> list[dict]:
    """``kernels-<label>`` per path: the GPU activities of one batch-1 decode step over the layers.
    A count below one a layer is no measurement (the profiler missed the graph's kernels)."""
    out = []
    for label in ("eager", "graph", "compiled", "triton"):
        key = f"kernels-{label}"
        row = rows.get(label, {})
        kernels = row.get("kernels_per_step")
        if not cuda:
            out.append(untested(key, "needs CUDA: torch.profiler's kernel events"))
        elif kernels is None:
            out.append(untested(key, row.get("skipped") or row.get("error") or "not measured"))
        elif kernels < row["layers"]:
            out.append(untested(key, f"the profiler saw {kernels} kernels, fewer than the layers: not the step's"))
        else:
            out.append(decide(key, kernels / row["layers"], f"{kernels} a step, {row['layers']} layers", row))
    return out


def strict_record(rows: dict) -> dict:
    """``strict-paths``: decode steps off their engine's path, over every path that ran, once
    ``forward_paths.fall_back`` is seen to raise in strict mode and to fall back otherwise."""
    failing = FastPathFailed("cuda_graph", "a test failure", "capture failed (a test failure)")

    def fail():
        raise failing

    try:
        fall_back(fail, None, True, {})
        raised = False
    except FastPathFailed:
        raised = True
    dropped: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fell_back = fall_back(fail, "slower", False, dropped) == "slower" and dropped == {
            "cuda_graph": "a test failure"
        }
    ran = {k: r for k, r in rows.items() if "off_path" in r or "error" in r}
    if not ran:
        return untested("strict-paths", "no path ran")
    # a path that raised, or ran no decode step, counts as one step off its path
    off = sum(r["off_path"] + (r["decode_steps"] == 0) if "off_path" in r else 1 for r in ran.values())
    steps = sum(r.get("decode_steps", 0) for r in ran.values())
    failed = "; ".join(f"{k} failed to build: {r['error']}" for k, r in ran.items() if "error" in r)
    figure = off + (not raised) + (not fell_back)
    return decide(
        "strict-paths",
        figure,
        f"{steps} decode steps on {', '.join(ran)}; strict mode raised: {raised}; fell back otherwise: {fell_back}"
        + (f"; {failed}" if failed else ""),
        {"raised": raised, "fell_back": fell_back, "paths": rows},
    )


def triton_graphs_record(
    captured: tuple[int, int] | None, path: Path, device: torch.device, load_format: str, max_model_len: int, rows: dict
) -> dict:
    """``triton-graphs``: on CUDA the buckets the Triton engine did not capture (of every
    (batch, width) bucket); elsewhere the buckets ``DecodeGraphs`` plans for Triton under a gather
    budget of one block (which filters the SDPA plan: the control), its capture left to a GPU."""
    if captured is not None:
        missing, expected = captured
        return decide("triton-graphs", missing, f"{expected - missing} of {expected} buckets captured")
    if device.type == "cuda":
        row = rows.get("triton", {})
        return untested("triton-graphs", row.get("skipped") or row.get("error") or "the Triton engine has no graphs")
    engine = LLMEngine(
        model=str(path), load_format=load_format, device=str(device), max_num_seqs=8, max_model_len=max_model_len,
        kv_cache_memory_gib=0.25,
    )  # fmt: skip
    block = engine.config.block_size
    plans = {
        backend: DecodeGraphs(
            engine.model, engine.runner.kv_cache, 8, max_model_len, block, capture=False, attention_backend=backend
        ).buckets
        for backend in ("sdpa", "triton")
    }
    expected = len(capture_batch_sizes(8)) * len(capture_widths(cdiv(max_model_len, block)))
    del engine
    release()
    details = {"planned": {k: len(v) for k, v in plans.items()}, "all_buckets": expected}
    if len(plans["sdpa"]) >= expected:
        return untested("triton-graphs", "the budget did not filter the SDPA plan: the check cannot tell", details)
    return decide(
        "triton-graphs",
        expected - len(plans["triton"]),
        f"planned on a CPU ({len(plans['triton'])} of {expected}; SDPA {len(plans['sdpa'])}); capture needs CUDA",
        details,
    )


def count_host_syncs(fn: Callable[[], object], device: torch.device) -> int:
    """Host syncs while ``fn()`` runs: on CUDA every synchronizing operation
    (``torch.cuda.set_sync_debug_mode("warn")``: a device-to-host copy, ``.item()``, a blocking
    host-to-device copy); on a CPU the transfers that would be device-to-host on a GPU
    (``Tensor.tolist`` and ``_local_scalar_dense``: ``.item()``, ``int(t)``)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        return sum("synchroniz" in str(w.message) for w in caught)
    transfers = []
    tolist = torch.Tensor.tolist

    def counted(t):
        transfers.append("tolist")
        return tolist(t)

    with mock.patch.object(torch.Tensor, "tolist", counted), OpCounter() as ops:
        fn()
    return len(transfers) + ops.result().ops.get("_local_scalar_dense", 0)


def sampling_syncs(device: torch.device) -> list[dict]:
    """``sampling.sample`` over 8 rows on ``device``: greedy rows and non-greedy rows of two settings
    (temperature with top-p, temperature with top-k), as tests/engine/test_llm_engine.py samples."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(8, 512, generator=gen) * 2).to(device)
    hot, cold = SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.5, top_k=5)
    params = [hot, SamplingParams(temperature=0), cold, hot, hot, cold, SamplingParams(temperature=0), hot]
    rngs = [KeyedRandom(seed) for seed in range(8)]
    positions = list(range(8))
    sample(logits, params, rngs, positions)  # first calls (lazy initialisation) outside the count
    syncs = count_host_syncs(lambda: sample(logits, params, rngs, positions), device)
    how = (
        "torch.cuda.set_sync_debug_mode: every synchronizing call"
        if device.type == "cuda"
        else "a CPU counts device-to-host transfers only (tolist, item); a GPU also counts blocking "
        "host-to-device copies"
    )
    return [decide("sampling-syncs", syncs, how)]


# The attention points: (shape, batch, context tokens). Heads, KV heads, head_dim from the published shape.
ATTENTION_POINTS = (
    ("Llama-3-8B", 1, 1024),
    ("Llama-3-8B", 1, 8192),
    ("Llama-3-8B", 64, 1024),
    ("SmolLM2-1.7B", 1, 1024),
    ("SmolLM2-1.7B", 64, 1024),
)
SMOKE_ATTENTION_POINTS = ((4, 2, 16, 2, 40),)  # (heads, KV heads, head_dim, batch, context): the interpreter's


def time_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Median milliseconds of ``fn()``: on CUDA ``triton.testing.do_bench`` (CUDA events, the L2
    cache flushed before each call, as a decode layer meets its K/V cold), else one wall-clock call."""
    if device.type == "cuda":
        from triton.testing import do_bench  # lazy: CUDA only, and triton is optional

        return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


def attention_point(
    heads: int, kv_heads: int, head_dim: int, batch: int, context: int, dtype: torch.dtype, device: torch.device
) -> dict:
    """One layer's decode attention at ``batch`` sequences of ``context`` tokens over a random
    pool (blocks of 16 in a shuffled order, block 0 the null block), through
    ``attention.paged_attention`` with ``backend="sdpa"`` (gather, then SDPA, in ``sdpa_backends``
    as the model runs it) and ``"triton"``: each one's ms, their ratio and whether they agree."""
    block = 16
    per_seq = cdiv(context, block)
    gen = torch.Generator(device=device).manual_seed(0)
    cache = torch.randn(batch * per_seq + 1, block, 2 * kv_heads, head_dim, generator=gen, device=device).to(dtype)
    cache[0] = 0  # the null block
    ids = (torch.randperm(batch * per_seq, generator=torch.Generator().manual_seed(0)) + 1).view(batch, per_seq)
    decodes = [(row.tolist(), context) for row in ids]
    q = torch.randn(batch, heads, head_dim, generator=gen, device=device).to(dtype).view(batch, heads, head_dim // 2, 2)
    out, ms = {}, {}
    for backend in ("sdpa", "triton"):
        meta = build_metadata([0] * batch, decodes, [], block, 0, device, backend=backend, dtype=dtype)

        def run(meta=meta):
            with sdpa_backends(device):
                return paged_attention(q, cache, meta)

        out[backend] = run().float()
        ms[backend] = time_ms(run, device)
    diff = (out["triton"] - out["sdpa"]).abs().max().item()
    return {
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "batch": batch,
        "context": context,
        "gather_ms": ms["sdpa"],
        "triton_ms": ms["triton"],
        "ratio": ms["triton"] / ms["sdpa"],
        "max_abs_diff": diff,
        "agree": diff <= 2e-2 * max(1.0, out["sdpa"].abs().max().item()),
    }


def triton_vs_gather(device: torch.device, smoke: bool) -> list[dict]:
    """``triton-vs-gather``: ``attention_point`` at ``ATTENTION_POINTS`` on CUDA (bf16); the figure is
    the worst point's ratio. On a CPU, UNTESTED: only under Triton's interpreter does it run, on a
    tiny shape in fp32, so the code is exercised (and the outputs compared: REFUTED if they differ)."""
    if not triton_runs_here(device):
        return [untested("triton-vs-gather", "needs CUDA, or Triton's interpreter (TRITON_INTERPRET=1) for a dry run")]
    cuda = device.type == "cuda"
    if cuda and not smoke:
        points = []
        for name, batch, context in ATTENTION_POINTS:
            c = published_config(name)
            points.append(
                {"shape": name}
                | attention_point(
                    c.num_attention_heads, c.num_key_value_heads, c.head_dim, batch, context, torch.bfloat16, device
                )
            )
            release()
    else:
        dtype = torch.bfloat16 if cuda else torch.float32
        points = [attention_point(*p, dtype, device) for p in SMOKE_ATTENTION_POINTS]
    return [attention_record(points, timed=cuda and not smoke)]


def attention_record(points: list[dict], timed: bool) -> dict:
    """``triton-vs-gather`` from ``attention_point`` rows: REFUTED (an infinite figure) if the two
    paths' outputs differ anywhere; UNTESTED unless ``timed`` (full shapes on CUDA); else the worst
    point's ratio of Triton's time to the gather's."""
    details = {"points": points}
    wrong = [p for p in points if not p["agree"]]
    if wrong:
        return decide("triton-vs-gather", float("inf"), f"outputs differ at {len(wrong)} point(s)", details)
    if not timed:
        return untested(
            "triton-vs-gather", "a dry run: tiny shapes (interpreted on a CPU), times mean nothing", details
        )
    worst = max(points, key=lambda p: p["ratio"])
    where = (
        f"worst {worst.get('shape', '')} b{worst['batch']} {worst['context']}: "
        f"{worst['triton_ms']:.3f} vs {worst['gather_ms']:.3f} ms"
    )
    return decide("triton-vs-gather", worst["ratio"], where, details)


LINEAR_SHAPE = (14336, 4096)  # (out, in): Llama-3-8B's gate and up projections
SMOKE_LINEAR_SHAPE = (256, 128)
QUANT_SCHEMES = ("int8", "w8a8", "int4")


def quant_linears(device: torch.device, smoke: bool) -> list[dict]:
    """One linear of ``LINEAR_SHAPE`` in bf16 and per scheme (``quantization.make_linear``: the
    CUDA kernels' layers), timed at 1 and 16 rows on CUDA (``time_ms``); and the computing ops a
    W8A8 layer dispatches at one row (``measure.op_count``), on any device (the CUDA layer's ops,
    counted on CPU tensors off CUDA)."""
    out_f, in_f = SMOKE_LINEAR_SHAPE if smoke else LINEAR_SHAPE
    gen = torch.Generator(device=device).manual_seed(0)
    weight = (torch.randn(out_f, in_f, generator=gen, device=device) * 0.02).to(torch.bfloat16)
    x1 = torch.randn(1, in_f, generator=gen, device=device).to(torch.bfloat16)
    records = []
    w8a8 = make_linear("w8a8", "cuda", weight, None, DEFAULT_GROUP_SIZE)
    w8a8(x1)  # first call outside the count
    with OpCounter() as ops:
        w8a8(x1)
    count = ops.result()
    records.append(decide("w8a8-ops", count.computing, f"bf16, {out_f} x {in_f}", {"ops": dict(count.ops)}))
    if device.type != "cuda":
        return records + [
            untested(f"quant-{s}-linear", "needs CUDA: the CUDA kernels, timed by CUDA events") for s in QUANT_SCHEMES
        ]
    layers: dict[str, Callable] = {"bf16": lambda x: F.linear(x, weight)}
    errors = {}
    for scheme in QUANT_SCHEMES:
        try:
            layers[scheme] = make_linear(scheme, "cuda", weight, None, DEFAULT_GROUP_SIZE)
        except Exception as e:  # noqa: BLE001 (a kernel this GPU or torch lacks: that scheme is UNTESTED)
            errors[scheme] = f"{type(e).__name__}: {str(e)[:200]}"
    ms: dict[str, dict[int, float]] = {}
    for name, layer in layers.items():
        try:  # a kernel that fails when called leaves its scheme UNTESTED, not the others
            ms[name] = {}
            for rows in (1, 16):
                x = torch.randn(rows, in_f, generator=gen, device=device).to(torch.bfloat16)
                ms[name][rows] = time_ms(lambda layer=layer, x=x: layer(x), device)
        except Exception as e:  # noqa: BLE001
            if name == "bf16":
                raise
            errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
    return records + quant_records(ms, errors)  # the layers go with this frame; the group's guard frees them


def quant_records(ms: dict[str, dict[int, float]], errors: dict[str, str]) -> list[dict]:
    """``quant-<scheme>-linear`` per scheme of ``QUANT_SCHEMES``: its time at 1 row over bf16's
    (``ms[name][rows]``, with 16 rows' ratio beside it); UNTESTED with the error where the layer could
    not be built (``errors[scheme]``)."""
    records = []
    for scheme in QUANT_SCHEMES:
        key = f"quant-{scheme}-linear"
        if scheme in errors or scheme not in ms:
            records.append(untested(key, errors.get(scheme, "not timed")))
            continue
        ratios = {rows: ms[scheme][rows] / ms["bf16"][rows] for rows in (1, 16)}
        details = {"ms": ms[scheme], "bf16_ms": ms["bf16"], "ratio": ratios}
        why = f"{ms[scheme][1] * 1e3:.1f} vs {ms['bf16'][1] * 1e3:.1f} us; 16 rows {ratios[16]:.2f}x"
        records.append(decide(key, ratios[1], why, details))
    return records


def region_engines(device: torch.device) -> list[tuple[str, dict, str, str | None]]:
    """The five engines ``compiled_regions`` builds: (name, shape, dtype, scheme), distinct (model,
    dtype, scheme) each; on a CPU quantized engines run fp32 (fbgemm), on CUDA bf16 and fp16 (one
    scheme there, int8, gpt-fast's compiled form: the question is the regions', not each scheme's)."""
    bias = TINY | dict(attention_bias=True, mlp_bias=True)
    tied = TINY | dict(tie_word_embeddings=True)
    if device.type == "cuda":
        return [
            ("tiny", TINY, "bfloat16", None),
            ("tiny", TINY, "bfloat16", "int8"),
            ("tiny", TINY, "float16", None),
            ("tiny-bias", bias, "bfloat16", None),
            ("tiny-tied", tied, "bfloat16", None),
        ]
    return [
        ("tiny", TINY, "float32", None),
        ("tiny", TINY, "float32", "int8"),
        ("tiny", TINY, "float32", "w8a8"),
        ("tiny-bias", bias, "float32", None),
        ("tiny-tied", tied, "float32", None),
    ]


def compiled_regions(work: Path, device: torch.device) -> list[dict]:
    """Five compiled engines (``region_engines``, strict, eager decoding on CUDA so every decode
    step calls the regions) built one after another in this process, then each decoding, all with
    Dynamo's ``fail_on_recompile_limit_hit`` (a region that would run eagerly raises). An engine
    fails when it raised, compiled fewer than 4 graphs of its own (2 regions x 2 shapes), or a step
    ran off its compiled path (prefills: the regions; decodes: the regions on CUDA, the compiled
    step on a CPU)."""
    from minieng.engine.compilation import compiler_missing  # lazy: torch._dynamo is slow to import

    if (why := compiler_missing(device)) is not None:
        return [untested("compiled-regions", why)]
    from torch._dynamo import config as dynamo_config
    from torch._dynamo.utils import counters

    strict = (
        dynamo_config.patch(fail_on_recompile_limit_hit=True)
        if hasattr(dynamo_config, "fail_on_recompile_limit_hit")
        else nullcontext()
    )
    expected = COMPILED_REGIONS if device.type == "cuda" else COMPILED_STEP
    rows, engines = [], []
    with strict:
        for name, shape, dtype, scheme in region_engines(device):
            row = {"model": name, "dtype": dtype, "scheme": scheme}
            rows.append(row)
            before = counters["stats"]["unique_graphs"]
            try:
                path = work / name
                if not (path / "config.json").is_file():
                    make_checkpoint(path, shape, 512, device, weights=False)
                engine = LLMEngine(
                    model=str(path), load_format="dummy", device=str(device), dtype=dtype, quantization=scheme,
                    compile=True, enforce_eager=device.type == "cuda", strict_forward_paths=True, max_num_seqs=4,
                    max_model_len=256, kv_cache_memory_gib=0.0625, enable_prefix_caching=False,
                )  # fmt: skip
                engines.append((row, engine))
            except Exception as e:  # noqa: BLE001 (the failure is the finding)
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            row["graphs"] = counters["stats"]["unique_graphs"] - before
        for row, engine in engines:
            try:
                first = len(engine.step_records)
                prompts = text_prompts(engine.tokenizer, 9, 2)
                engine.generate(prompts, SamplingParams(max_tokens=4, **GREEDY))
                steps = engine.step_records[first:]
                paths = [s.forward_path for s in steps if s.num_prefill_tokens == 0]
                prefills = [s.forward_path for s in steps if s.num_prefill_tokens > 0]  # the regions, every device
                row["off_path"] = sum(p != expected for p in paths) + sum(p != COMPILED_REGIONS for p in prefills)
                row["decode_steps"] = len(paths)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    del engines
    release()
    failing = [r for r in rows if "error" in r or r["graphs"] < 4 or r.get("off_path", 1) or not r.get("decode_steps")]
    reason = f"{len(rows) - len(failing)} of {len(rows)} ran their own compiled regions ({expected})"
    if failing:
        reason += "; failing: " + ", ".join(f"{r['model']} {r['dtype']} {r['scheme']}" for r in failing)
    return [decide("compiled-regions", len(failing), reason, {"engines": rows})]


# -- notebook 10 under a T4's memory ----------------------------------------------------------------

T4_MEMORY_CAP_GIB = 14.5  # a T4's 15 GiB less the CUDA context's share (tests/course/test_t4_memory.py)
T4_BANDWIDTH_BYTES_S = 320e9  # the T4's datasheet bandwidth, as tests/course/test_t4_memory.py picks its model
T4_FIXED_COST_PER_LAYER_S = 20e-6  # a graph replay's cost per layer, the same test's figure
T4_CUDA_CONTEXT_BYTES = 300 * 1024**2
NOTEBOOK10_KV_GIB = 1  # its KV_CACHE_GIB
NOTEBOOK10_CAPS = [(1, 512), (8, 1024), (64, 8192)]  # its CAPS in full mode


def notebook10_engine_set(device: torch.device) -> dict:
    """Notebook 10's engines in the order it builds them, on ``device``, as on a T4: the model
    ``course_model`` picks for a T4 (``model_choice.choose_model`` on its bandwidth and memory)
    with dummy weights in fp16, a 1 GiB pool; the embedded model's probe engine beside it (the 135M
    shape); the batch-cap sweep (``goodput.batch_cap_sweep``, its full-mode caps) and
    ``disaggregation.compare_disaggregation`` with the real-time baseline, over 24 requests of its
    workload (the trace's quantiles, lengths x 0.25, at most 512 prompt and 64 output tokens),
    arriving at once (the widest batches: the most memory). Returns what it ran."""
    from minieng.lab.disaggregation import compare_disaggregation  # lazy: these lessons' modules are heavy
    from minieng.lab.goodput import batch_cap_sweep
    from minieng.measure.metrics import SLO
    from minieng.measure.model_choice import choose_model
    from minieng.measure.workloads import sampled_trace_workload, scale_workload

    name = choose_model(T4_BANDWIDTH_BYTES_S, 15 * GIB - T4_CUDA_CONTEXT_BYTES, 2, T4_FIXED_COST_PER_LAYER_S).name
    common = dict(load_format="dummy", dtype="float16", device=str(device))
    probe = LLMEngine(model="SmolLM2-135M", kv_cache_memory_gib=0.25, max_model_len=1024, **common)
    engine = LLMEngine(model=name, kv_cache_memory_gib=NOTEBOOK10_KV_GIB, **common)
    specs = scale_workload(sampled_trace_workload(24, "conv", seed=0), 1.0, 0.25, 512, 64)
    specs = scale_workload(specs, time_scale=0.0)
    slo = SLO(ttft_ms=1000.0, tpot_ms=100.0)  # goodput is not what this run reads
    sweep = batch_cap_sweep(engine, specs, NOTEBOOK10_CAPS, slo)
    disagg = compare_disaggregation(engine, specs, slo, num_prefill=1, num_decode=1, real_time_baseline=True)
    del probe, engine
    release()
    return {
        "model": name,
        "sweep_points": len(sweep["points"]),
        "comparison_runs": [r["name"] for r in disagg["runs"]],
    }


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the device ran out of memory (torch's error, or a library's failed
    allocation: cuBLAS's ``CUBLAS_STATUS_ALLOC_FAILED``)."""
    text = str(e)
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in text.lower() or "ALLOC_FAILED" in text


def under_memory_cap(call: Callable[[], object], device: torch.device, cap_gib: float, cuda=torch.cuda) -> dict:
    """``nb10-t4``: ``call()`` with the process held to ``cap_gib`` of the device
    (``cuda.set_per_process_memory_fraction``, restored to 1 afterwards, whatever happens): the
    peak reserved (``cuda.max_memory_reserved``, GiB) against the cap, or, REFUTED with an infinite
    figure, an out-of-memory error or a fast path an engine dropped for want of memory (a CUDA graph
    capture that fell back to eager with a warning: it ran, but did not fit). ``cuda``: the
    ``torch.cuda`` module (tests pass a fake). Errors other than out-of-memory propagate."""
    gc.collect()
    cuda.empty_cache()
    total = cuda.get_device_properties(device).total_memory
    cuda.reset_peak_memory_stats(device)
    cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / total), device)
    oom = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ran = call()
    except Exception as e:  # noqa: BLE001 (out of memory is the finding; anything else propagates)
        if not out_of_memory(e):
            raise
        oom, ran = f"{type(e).__name__}: {str(e)[:200]}", None
        caught = []
    finally:
        cuda.set_per_process_memory_fraction(1.0, device)
        gc.collect()
        cuda.empty_cache()
    peak = cuda.max_memory_reserved(device) / GIB
    allocated = cuda.max_memory_allocated(device) / GIB
    dropped = [str(w.message)[:200] for w in caught if out_of_memory(w.message)]
    details = {"ran": ran, "peak_reserved_gib": peak, "peak_allocated_gib": allocated, "dropped": dropped}
    if oom or dropped:
        why = (
            f"out of memory under {cap_gib:g} GiB: {oom}"
            if oom
            else f"{len(dropped)} fast path(s) dropped: {dropped[0]}"
        )
        return decide("nb10-t4", float("inf"), f"{why} (peak {peak:.2f} GiB reserved)", details)
    return decide(
        "nb10-t4",
        peak,
        f"peak {allocated:.2f} GiB allocated, {peak:.2f} reserved: a margin of {cap_gib - peak:.2f} GiB "
        "(no allocation failed; the engines' pools are fixed, as on a T4)",
        details,
    )


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
        "nb10": (("nb10-t4",), lambda: nb10(device, smoke, notebook10)),
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
