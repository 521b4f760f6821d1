"""Kernels timed one at a time, for issue 33's predictions: one layer's decode attention, Triton
against gather + SDPA at five points (``triton-vs-gather``), and one Llama-3-8B linear per
quantization scheme against bf16 at 1 and 16 rows (``quant-*-linear``), with the ops a W8A8 linear
dispatches (``w8a8-ops``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from minieng.config import published_config
from .checkpoints import release
from .decode_paths import triton_runs_here
from .verdicts import decide, untested
from minieng.measure.op_count import OpCounter
from minieng.core.attention import build_metadata, paged_attention, sdpa_backends
from minieng.wings.quantization.quantization import DEFAULT_GROUP_SIZE, make_linear
from minieng.units import cdiv

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
    """Median milliseconds of ``fn()``'s kernels: on CUDA, ``fn`` captured once in a CUDA graph (as
    the engine's decode steps replay their layers: no Python or launch cost of an eager call,
    which at one sequence of 1k tokens would outweigh the kernels) and its replays timed by
    ``triton.testing.do_bench`` (CUDA events, the L2 cache flushed before each replay, as a decode
    layer meets its K/V cold); elsewhere one wall-clock call. ``fn`` runs once first, outside the
    graph, so that any kernel it compiles is compiled before the capture."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - start)
    from triton.testing import do_bench  # lazy: CUDA only, and triton is optional

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks before a capture
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return float(do_bench(graph.replay, warmup=10, rep=50, return_mode="median"))


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
