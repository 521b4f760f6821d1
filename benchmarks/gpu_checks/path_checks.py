"""Each decode path run strictly, for issue 33's predictions: one engine per path (eager, CUDA
graphs, compiled, Triton eager, Triton with graphs) on the 135M shape, each decoding at three block
table widths; the kernels a step launches (``kernels-*``), the steps off their engine's path
(``strict-paths``), the Triton buckets captured (``triton-graphs``) and the Triton variants compiled
after start-up (``triton-no-midrun-compile``). The eager engine also decides the ops and mask
predictions (``step_dispatch.decode_layer_ops``)."""

from __future__ import annotations

import traceback
import warnings
from pathlib import Path

import torch

from minieng.config import EngineConfig, SamplingParams
from minieng.device import dtype_choice
from minieng.wings.fast_paths.cuda_graph import DecodeGraphs, capture_batch_sizes, capture_widths
from minieng.wings.fast_paths.forward_paths import COMPILED_STEP, CUDA_GRAPH, EAGER, FastPathFailed, fall_back
from minieng.engine.llm_engine import LLMEngine
from .checkpoints import GREEDY, release
from .decode_paths import kernels_per_step, triton_runs_here
from .step_dispatch import decode_layer_ops
from .verdicts import decide, untested
from minieng.measure.workloads import text_prompts
from minieng.wings.fast_paths import triton_attention
from minieng.units import cdiv

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
            graphs = engine.runner.fast.graphs
            rows[label] = {
                "expected_path": expected,
                "decode_steps": len(paths),
                "off_path": sum(p != expected for p in paths),
                "paths_seen": sorted(set(paths)),
                "num_graphs": graphs.num_graphs if graphs else 0,
                "kernels_per_step": kernels_per_step(engine, text_prompts(engine.tokenizer, 16, 1)),
                "layers": len(engine.model.layers),
                "dropped_paths": dict(engine.runner.fast.dropped_paths),
            }
            if label == "triton" and graphs is not None:
                expected_buckets = len(graphs.query_lens) * len(graphs.batch_sizes) * len(graphs.widths)
                triton_graphs = (expected_buckets - graphs.num_graphs, expected_buckets)
        except Exception as e:  # noqa: BLE001
            rows[label] = {"error": f"{type(e).__name__}: {str(e)[:300]}", "traceback": traceback.format_exc()}
            if label == "triton" and isinstance(e, FastPathFailed):  # strict: the capture failed, no bucket kept
                every = len(capture_batch_sizes(base["max_num_seqs"]))
                every *= len(capture_widths(cdiv(max_model_len, EngineConfig.block_size)))
                triton_graphs = (every, every)
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
