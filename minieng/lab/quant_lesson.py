"""Notebook 08's plumbing: its runs' estimates, their results in words, the roofline's points, the
scheme selector's engine, and the worked answers its pencil problems reveal.

The measurements are ``quantization.run_quantization``, ``quant_quality.quality`` and
``quant_quality.float_noise_amplification``; this module sizes, formats and explains them.
"""

from __future__ import annotations

from dataclasses import replace

from minieng.engine.llm_engine import LLMEngine
from minieng.lab.probes import estimate_s
from minieng.measure.flops_bytes import decode_work, prefill_work
from minieng.measure.metrics import request_metrics
from minieng.measure.peaks import Peak
from minieng.measure.roofline import format_percent

OVERHEAD_GAP_X = 1.3  # a TPOT ratio this far above the bytes ratio: the step's per-op overhead shows


def format_layer_times(times: dict, dtype) -> list[str]:
    """``quantization.layer_decode_times`` per scheme: its time, its ratio to the float product, and
    whether it beat it (a scheme with no kernel in ``dtype`` here says so)."""
    lines = []
    for scheme, t in times.items():
        if t is None:
            lines.append(f"{scheme:>5}: no kernel in {dtype} on this device")
            continue
        said = (
            ""
            if scheme == "none"
            else (
                "  faster than the float product"
                if t < times["none"]
                else "  SLOWER than the float product: the bytes are saved, the time is not"
            )
        )
        lines.append(f"{scheme:>5}: {t * 1e3:7.3f} ms ({t / times['none']:.2f}x){said}")
    return lines


def quant_estimate_s(probe: dict, schemes: list[str], cfg) -> float:
    """Rough seconds of ``run_quantization`` with ``cfg`` (a ``QuantBenchConfig``): every engine
    (float and each scheme) runs its rounds of a prefill and decodes at each batch (a batch's step
    costing more than one sequence's), then its accuracy prompts."""
    engines = len(schemes) + 1
    steps = round(cfg.output_tokens * sum(1 + b / 16 for b in cfg.batch_sizes))
    quality_tokens = cfg.quality_prompts * 2 * (64 + cfg.quality_tokens)
    return engines * (cfg.repeats + 1) * estimate_s(probe, cfg.prompt_tokens, steps, prefills=1) + engines * estimate_s(
        probe, quality_tokens, prefills=2 * cfg.quality_prompts
    )


def quant_lines(res: dict, batch: int) -> list[str]:
    """Each scheme's batch-``batch`` TPOT against its bytes, its MBU against the float model's, and
    its TTFT; where the time fell much less than the bytes, why."""
    rows = {r["scheme"]: r for r in res["rows"]}
    lines = []
    for r in res["rows"][1:]:
        tpot, pred = r[f"tpot_b{batch}_ratio"], r[f"tpot_b{batch}_ratio_predicted"]
        lines.append(
            f"{r['scheme']}: batch-{batch} TPOT {tpot:.2f}x of float's for {pred:.2f}x of its bytes (MBU "
            f"{format_percent(r['decode_mbu_percent'])} against {format_percent(rows['none']['decode_mbu_percent'])}); "
            f"TTFT {r['ttft_ratio']:.2f}x: decode {1 / tpot:.2f}x faster, prefill {1 / r['ttft_ratio']:.2f}x"
        )
        if tpot / pred > OVERHEAD_GAP_X:
            lines.append(
                f"   the time fell less than the bytes: the rest of each {r['scheme']} step is per-op overhead "
                "(quantizing activations, small elementwise ops, Python), which no byte saving removes"
            )
    return lines


def roofline_points(res: dict, batch: int, peak: Peak) -> tuple[list[Peak], list[tuple[str, float, float]]]:
    """The roofline's roofs (the measured peak, and the W8A8 kernel's measured FLOP rate where it ran)
    and points (each scheme's prefill and batch-``batch`` decode: intensity, achieved FLOP/s)."""
    points = []
    for r in res["rows"]:
        points.append((f"prefill {r['scheme']}", r["prefill_intensity_flop_per_byte"], r["prefill_flop_s"]))
        points.append((f"decode b{batch} {r['scheme']}", r["decode_intensity_flop_per_byte"], r["decode_flop_s"]))
    roofs = [peak]
    if "w8a8" in res["kernel_flop_s"]:
        rate = res["kernel_flop_s"]["w8a8"] / 1e12
        roofs.append(Peak("w8a8 kernel", rate, peak.bandwidth_gbps, "w8a8 kernel (measured)"))
    return roofs, points


def roofline_answer(model_config, dtype_bytes: int, prompt_tokens: int, context_tokens: int, ridge: float) -> str:
    """A worked answer (Markdown) to "which points move up, which only sideways?": the counted
    FLOP per byte of a prefill of ``prompt_tokens`` and of a batch-1 decode step, against the ridge."""
    pre = prefill_work(model_config, prompt_tokens, dtype_bytes).arithmetic_intensity_flop_per_byte
    dec = decode_work(model_config, 1, context_tokens, dtype_bytes).arithmetic_intensity_flop_per_byte
    return (
        f"A batch-1 decode step does **{dec:.2f} FLOP per byte**, far left of this machine's ridge "
        f"(**{ridge:.0f}**): on the slanted, bandwidth-bound roof, so fewer bytes move its point right *and up*. "
        f"A {prompt_tokens}-token prefill does **{pre:.0f} FLOP per byte**"
        + (
            ", past the ridge: under the flat roof, so it moves only sideways. "
            if pre > ridge
            else ", still below the ridge here: it gains a little, less than decode. "
        )
        + "Only W8A8's integer products have a higher roof of their own."
    )


def levels_why(out: dict) -> str:
    """Why the median token uses so few of a per-tensor scale's levels (``activation_outliers``)."""
    return (
        f"the napkin assumes no outliers; here the tensor's largest |x| ({out['tensor_max']:.1f}) is "
        f"{out['tensor_max'] / out['median_token_max']:.0f}x the median token's ({out['median_token_max']:.1f}): "
        "that one scale spends most codes on values the median token never reaches"
    )


def ranking_answer(out: dict, group_size: int) -> str:
    """A worked answer (Markdown) to "rank int8, int4, W8A8 per token and per tensor by accuracy",
    from the rounding steps and the outliers measured just above (``activation_outliers``)."""
    return (
        f"Count the levels each value gets. int8 weights: 127 a side per output channel. int4: 16 levels in all per "
        f"group of {group_size} inputs (a scale and a zero), a step about 17x coarser. W8A8 per token adds the activations' rounding at 127 levels "
        f"a side of each token's own largest value. W8A8 per tensor gives the median token only "
        f"**{out['median_levels_per_tensor']:.1f}** levels (measured above). Best to worst: **int8, then W8A8 per "
        "token, then int4, with W8A8 per tensor last** (int4 and W8A8 per token can swap: the weights' rounding "
        "against the activations')."
    )


def nudge_answer(model_config, epsilon: float, levels: int = 127) -> str:
    """A worked answer (Markdown) to "how far will a nudge of ``epsilon`` move int8's and W8A8's
    logits?": the activations W8A8 rounds per token, and how many sit within a nudge of a code's edge."""
    per_token = model_config.num_hidden_layers * (6 * model_config.hidden_size + model_config.intermediate_size)
    crossings = per_token * 2 * epsilon * levels
    return (
        f"A float model carries a relative nudge ε = {epsilon:.0e} through as a change of the same order: its logits "
        f"move by about ε times their size. W8A8 rounds about **{per_token:,}** activations per token (the inputs "
        f"of the 7 products in each of {model_config.num_hidden_layers} layers). A value moved by ε of itself crosses a "
        f"code's edge with a chance of about 2ε x {levels} (its position in the code is uniform): "
        f"**{crossings:.2g}** crossings per token, each moving a product by a whole code, 1/{levels} of the token's "
        "largest value. Enough, over a sequence, to move logits by whole units and flip close greedy choices. "
        "int8 weight-only rounds no activation to 8 bits: it moves them little more than float."
    )


def nudge_curve(amp: dict, positions: int) -> dict:
    """``viz.curve``'s arguments for ``float_noise_amplification``'s nudge: each model's largest
    logit change per position after the prompt."""
    label = {"none": f"float ({amp['dtype']})"}
    return {
        "xs": list(range(1, positions + 1)),
        "ys": {label.get(k, k): r["dlogit_per_position"] for k, r in amp["nudge"].items()},
        "xlabel": "position after the prompt",
        "ylabel": "largest |logit change|",
        "title": f"A {amp['epsilon']:.0e} nudge to the embeddings, per model",
        "logy": True,
    }


def scheme_engine(engines: dict, base: LLMEngine, scheme: str, group_size: int) -> LLMEngine:
    """The engine of ``scheme`` sharing ``base``'s weights, built once and kept in ``engines``."""
    if scheme not in engines:
        config = replace(base.config, quantization=scheme, quantization_group_size=group_size)
        engines[scheme] = LLMEngine(config, loaded=base.loaded)
    return engines[scheme]


def format_reply(engine: LLMEngine, out, reference_ids: list[int], scheme: str) -> str:
    """One scheme's reply: its weights, TTFT and TPOT (``request_metrics``), and how many of its first
    tokens match the float model's ``reference_ids``."""
    m = request_metrics(out)
    same = next((i for i, (a, b) in enumerate(zip(out.token_ids, reference_ids)) if a != b), len(out.token_ids))
    return (
        f"{scheme}: weights {engine.memory_plan.weight_bytes / 1e6:.0f} MB, TTFT {m.ttft_s * 1e3:.0f} ms, TPOT "
        f"{m.tpot_s * 1e3:.1f} ms; the first {same} of {len(out.token_ids)} tokens match the float model's reply"
    )
