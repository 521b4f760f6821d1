"""Issue 33's predictions of what a GPU will do, and their verdicts: CONFIRMED, REFUTED or UNTESTED.

Every prediction has a bound (``PREDICTIONS``, with the issue's figure it comes from) and a figure
read as ``figure <= bound``: CONFIRMED when it holds, REFUTED when it does not, UNTESTED with the
reason where this device cannot decide (``decide``, ``untested``); ``pred_line`` prints one. The
measurements that decide them live beside this module (``predictions`` lists them and runs them).
"""

from __future__ import annotations

from dataclasses import dataclass

CONFIRMED, REFUTED, UNTESTED = "CONFIRMED", "REFUTED", "UNTESTED"


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
