"""The quantization experiment: per scheme, the bytes it reads, what it does to each phase, and
what it costs in accuracy, beside the roofline's prediction.

One float engine and one engine per scheme share the loaded weights (each scheme adds only its
quantized matrices). In rounds, every engine runs the same requests in turn, so each ratio to the
float engine is taken within one round of one run (timings on a shared machine drift):

- TTFT of one ``prompt_tokens``-token prompt alone (prefill);
- TPOT at each batch size (decode), every request decoding together, taken as the median
  decode step (each step emits one token per sequence): a step stalled by another job on a
  shared machine moves a mean, not a median.

Predictions (the roofline, docs/architecture.md, FLOPs and bytes):
- decode is memory-bound, so its time follows the bytes of a decode step: TPOT ratio ~ bytes
  ratio (``flops_bytes.decode_work`` with the scheme's ``matmul_bytes``; the KV cache stays in the
  model's dtype, so it dilutes the gain at long context and large batch);
- prefill is compute-bound, so its time follows the FLOP rate of the products: TTFT ratio ~ the
  float kernel's FLOP/s over the scheme's, both measured on the model's largest layer (gate/up)
  at ``prompt_tokens`` rows (``kernel_rates``). Weight-only schemes compute in the float dtype,
  so the roofline promises prefill nothing; W8A8 computes in int8.

Accuracy: ``quant_quality.quality`` on held-out real prompts, with each scheme's own kernels.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace

import torch

from minieng.engine.llm_engine import LLMEngine
from minieng.lab.probes import minieng_decode, minieng_prefill, warm_up
from minieng.lab.quant_quality import quality, reference_sequences
from minieng.measure.flops_bytes import decode_work
from minieng.measure.harness import measure
from minieng.measure.peaks import Peak
from minieng.measure.roofline import phase_utilization, tpot_floor_s
from minieng.measure.workloads import text_prompts
from minieng.wings.quantization.quantization import (
    KERNELS,
    SCHEMES,
    check_supported,
    make_linear,
    matmul_bytes,
    quantize_model,
)


@dataclass
class QuantBenchConfig:
    """What the experiment runs: the TTFT prompt, the decode batches, the quality sample."""

    schemes: list[str] | None = None  # None: every scheme that runs on the device
    group_size: int = 64
    prompt_tokens: int = 512
    batch_sizes: list[int] = field(default_factory=lambda: [1, 16])
    decode_prompt_len: int = 64
    output_tokens: int = 32
    repeats: int = 3
    quality_prompts: int = 4
    quality_prompt_len: int = 64
    quality_tokens: int = 64


def device_schemes(device: torch.device, dtype: torch.dtype) -> list[str]:
    """The schemes whose kernel runs on ``device`` in ``dtype`` (``quantization.check_supported``:
    int4 needs bfloat16, a CPU float32)."""
    out = []
    for scheme in SCHEMES:
        try:
            check_supported(scheme, device, dtype)
        except ValueError:
            continue
        out.append(scheme)
    return out


@torch.inference_mode()
def kernel_rates(engine: LLMEngine, schemes: list[str], rows: int, group_size: int, repeats: int = 3) -> dict:
    """FLOP/s of the float layer and of each scheme's layer on the model's gate/up matrix
    ([2 x intermediate, hidden]) at ``rows`` rows: the flat roof of each kernel, for prefill."""
    gate_up = engine.loaded.model.layers[0].mlp.gate_up_proj  # the float layer
    weight = gate_up.weight.detach()
    x = torch.randn(rows, weight.shape[1], device=weight.device, dtype=weight.dtype)
    flops = 2 * rows * weight.shape[0] * weight.shape[1]
    layers = {None: gate_up} | {s: make_linear(s, weight.device.type, weight, None, group_size) for s in schemes}
    # the best run: a ceiling
    return {scheme or "none": flops / _best_s(layer, x, repeats) for scheme, layer in layers.items()}


def predicted_table(
    model_config, dtype_bytes: int, group_size: int, bandwidth_bytes_s: float, context_tokens: int, batch_size: int = 1
) -> list[dict]:
    """Computed, not measured: per scheme (the float model first), the matrices' bytes per
    weight (scales included), a decode step's bytes at ``batch_size`` sequences of
    ``context_tokens`` tokens, the TPOT floor bytes / ``bandwidth_bytes_s`` and its ratio to
    the float model's (``flops_bytes.decode_work``, ``tpot_floor_s``)."""
    rows = []
    for scheme in (None, *SCHEMES):
        mb = matmul_bytes(model_config, scheme, group_size, dtype_bytes)
        work = decode_work(model_config, batch_size, context_tokens, dtype_bytes, mb)
        rows.append(
            {
                "scheme": scheme or "none",
                "bytes_per_weight": (mb.layers + mb.lm_head) / model_config.num_matmul_params,
                "step_bytes": work.total_bytes,
                "tpot_floor_ms": 1e3 * tpot_floor_s(work.total_bytes, bandwidth_bytes_s),
            }
        )
    for row in rows:
        row["tpot_ratio_predicted"] = row["step_bytes"] / rows[0]["step_bytes"]
    return rows


def format_predicted(rows: list[dict]) -> list[str]:
    """``predicted_table``'s rows as a table: bytes per weight, a step's MB, the TPOT floor and its
    ratio to the float model's."""
    lines = [f"{'scheme':>7} {'bytes/weight':>12} {'step MB':>8} {'TPOT floor ms':>13} {'vs float':>8}"]
    for r in rows:
        lines.append(
            f"{r['scheme']:>7} {r['bytes_per_weight']:>12.3f} {r['step_bytes'] / 1e6:>8.1f} "
            f"{r['tpot_floor_ms']:>13.2f} {r['tpot_ratio_predicted']:>7.2f}x"
        )
    return lines


@torch.inference_mode()
def layer_decode_times(engine: LLMEngine, schemes=SCHEMES, group_size: int = 64, repeats: int = 20) -> dict:
    """Seconds of one batch-1 product through the LM head ([vocab, hidden], the largest matrix),
    float and each scheme's kernel, even one the device refuses (int4's CPU twin): the best of
    ``repeats`` (None where the kernel cannot run in this dtype). Shows whether a kernel turns
    fewer bytes into less time at all."""
    head = engine.loaded.model.lm_head
    weight = head.weight.detach()
    x = torch.randn(1, weight.shape[1], device=weight.device, dtype=weight.dtype)
    layers = {"none": head}
    for s in schemes:
        try:
            layers[s] = make_linear(s, weight.device.type, weight, None, group_size)
        except RuntimeError:  # a kernel this device or dtype lacks (int4 in float16): no time to show
            layers[s] = None
    return {name: None if layer is None else _best_s(layer, x, repeats) for name, layer in layers.items()}


def _best_s(layer, x: torch.Tensor, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``layer(x)``, after one warm-up (``harness.measure``)."""
    return min(measure(lambda: layer(x), x.device, warmup=1, repeats=repeats).values)


def run_quantization(
    engine: LLMEngine, cfg: QuantBenchConfig, peaks: list[Peak], progress=None, text_engine: LLMEngine | None = None
) -> dict:
    """The experiment on a float ``engine`` (its weights shared by one engine per scheme).

    Accuracy is measured on ``text_engine``'s model and its quantized copies when given (an engine
    with real weights, for an ``engine`` whose weights are random: their agreement means nothing),
    else on ``engine``'s.

    Returns a JSON-serializable dict: ``config``, ``rows`` (one per scheme, the float model
    first: weight bytes, TTFT and TPOTs with their ratios and predictions, accuracy, and the
    prefill and batch-1 decode steps' intensity and achieved FLOP/s for a roofline),
    ``kernel_flop_s`` and ``peaks``.
    """
    if engine.config.quantization is not None:
        raise ValueError(
            "run_quantization compares schemes with the float model: pass an engine with quantization=None"
        )
    schemes = cfg.schemes if cfg.schemes is not None else device_schemes(engine.device, engine.dtype)
    say = progress or (lambda msg: None)
    engines = {None: engine}
    for s in schemes:
        say(f"quantization: building the {s} engine")
        engines[s] = LLMEngine(
            replace(engine.config, quantization=s, quantization_group_size=cfg.group_size), loaded=engine.loaded
        )
    tok = engine.tokenizer
    for e in engines.values():  # warm-up: allocation, kernel selection
        warm_up(e)
    ttft = {s: [] for s in engines}
    tpot = {s: {b: [] for b in cfg.batch_sizes} for s in engines}
    steps = {s: {"prefill": [], "decode": []} for s in engines}
    prefill_prompts = text_prompts(tok, cfg.prompt_tokens, cfg.repeats + 1)
    for e in engines.values():  # a new prompt length is a new shape (a GPU plans it): discarded
        minieng_prefill(e, prefill_prompts[:1])
    for r in range(cfg.repeats):
        say(f"quantization: round {r + 1} of {cfg.repeats}")
        for s, e in engines.items():
            t, st = minieng_prefill(e, [prefill_prompts[1 + r]])
            ttft[s].append(t)
            steps[s]["prefill"] += st
            for b in cfg.batch_sizes:
                _, st = minieng_decode(e, text_prompts(tok, cfg.decode_prompt_len, b), cfg.output_tokens)
                tpot[s][b].append(statistics.median(step.duration_s for step in st))
                if b == cfg.batch_sizes[0]:
                    steps[s]["decode"] += st
    say("quantization: kernel FLOP rates and accuracy")
    rates = kernel_rates(engine, schemes, cfg.prompt_tokens, cfg.group_size)
    talker = text_engine or engine
    sequences = reference_sequences(
        talker, text_prompts(talker.tokenizer, cfg.quality_prompt_len, cfg.quality_prompts), cfg.quality_tokens
    )
    copies = (
        {s: engines[s].model for s in schemes}
        if talker is engine
        else {s: quantize_model(talker.model, s, cfg.group_size) for s in schemes}
    )
    acc = quality(talker.model, copies, sequences, cfg.quality_prompt_len)
    context = cfg.decode_prompt_len + cfg.output_tokens // 2  # the decode steps' mean context
    dtype_bytes = engine.dtype.itemsize
    base = {b: decode_work(engine.model_config, b, context, dtype_bytes).total_bytes for b in cfg.batch_sizes}
    rows = []
    for s, e in engines.items():
        key = s or "none"
        row = {
            "scheme": key,
            "kernel": KERNELS[s, engine.device.type] if s else f"{engine.dtype} (float)",
            "weight_bytes": e.memory_plan.weight_bytes,
            "matmul_bytes": (e.matmul_bytes.layers + e.matmul_bytes.lm_head)
            if e.matmul_bytes
            else engine.model_config.num_matmul_params * dtype_bytes,
            "ttft_ms": 1e3 * statistics.median(ttft[s]),
            "ttft_ratio": statistics.median(a / b for a, b in zip(ttft[s], ttft[None])),
            "ttft_ratio_predicted": rates["none"] / rates[key],
        }
        row["bytes_per_weight"] = row["matmul_bytes"] / engine.model_config.num_matmul_params
        for b in cfg.batch_sizes:
            row[f"tpot_b{b}_ms"] = 1e3 * statistics.median(tpot[s][b])
            row[f"tpot_b{b}_ratio"] = statistics.median(a / c for a, c in zip(tpot[s][b], tpot[None][b]))
            work = decode_work(engine.model_config, b, context, dtype_bytes, e.matmul_bytes)
            row[f"tpot_b{b}_ratio_predicted"] = work.total_bytes / base[b]
        for phase in ("prefill", "decode"):
            u = phase_utilization(engine.model_config, dtype_bytes, steps[s][phase], peaks, e.matmul_bytes)
            row[f"{phase}_intensity_flop_per_byte"] = u["arithmetic_intensity_flop_per_byte"]
            row[f"{phase}_flop_s"] = u["achieved_tflops"] * 1e12
            row[f"{phase}_mbu_percent"] = u[peaks[0].source]["mbu_percent"]
        row.update(
            acc.get(
                s,
                {
                    "agreement": 1.0,
                    "agreement_min": 1.0,
                    "kl_nats": 0.0,
                    "positions": acc[schemes[0]]["positions"] if schemes else 0,
                },
            )
        )
        rows.append(row)
    return {
        "config": asdict(cfg) | {"schemes": schemes},
        "device": str(engine.device),
        "dtype": str(engine.dtype),
        "decode_context_tokens": context,
        "kernel_flop_s": rates,
        "peaks": [p.to_dict() for p in peaks],
        "rows": rows,
    }


def decode_vs_prefill(row: dict, batch_size: int = 1) -> float:
    """How many times more a scheme speeds decode than prefill: (TTFT ratio) / (TPOT ratio)
    (2.0: decode gained twice what prefill did; 1.0: both phases the same)."""
    return row["ttft_ratio"] / row[f"tpot_b{batch_size}_ratio"]
