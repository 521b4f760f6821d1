"""The GPU path's targets, each read as PASS or MISS from the figures the check measured.

- decode at batch 1 (CUDA graphs): the 135M shape's TPOT at most 1 ms; every larger shape's TPOT
  at most 1.35x its floor, the weights' bytes over the measured bandwidth;
- the 7B shape (head_dim 64): batch-64 TPOT at most 1.6x batch-1's at 1,024 tokens of context, and
  prefill MFU at least 50% of the measured peak at 4,096 prompt tokens;
- every shape: the first request of a new prompt length costs at most 5 ms over a warm one;
- the prefix cache: a hit never slower than a cold prefill, and at least 5x faster at 90% hits
  or more;
- quantization: batch-1 TPOT at most 0.6x bf16's for int8 and 0.4x for int4 (a decode reads a
  half and a quarter of the weights' bytes, with room for the scales and the dequantization);
- speculative decoding: c (a draft step over a target step) at most 0.2 at every k.

A target whose figures are absent (a section skipped, failed or not run on this device) is left out.
"""

from __future__ import annotations

SMALL_SHAPE = "smollm2-135m"
SMALL_TPOT_MS = 1.0
TPOT_OVER_FLOOR_X = 1.35
LARGE_SHAPE = "llama-7b-hd64"
BATCH_64_OVER_BATCH_1_X = 1.6
PREFILL_MFU_PERCENT = 50.0
NEW_SHAPE_COST_MS = 5.0
PREFIX_HIT_GAIN_X = 5.0
QUANT_TPOT_RATIO = {"int8": 0.6, "int4": 0.4}
SPECULATIVE_C = 0.2


def targets(result: dict) -> list[dict]:
    """Each target as ``{"target", "value", "goal", "pass"}``, from the check's result dict (its
    ``speed``, ``prefix_cache``, ``quantization`` and ``speculative`` sections)."""
    out = []

    def check(name, value, goal, ok):
        out.append({"target": name, "value": value, "goal": goal, "pass": bool(ok)})

    shapes = {s["shape"]: s for s in result.get("speed") or [] if "shape" in s}
    for name, s in shapes.items():
        b1 = next((r for r in s["decode_graphs"] if r["batch_size"] == 1), None)
        if b1 is None:
            continue
        if name == SMALL_SHAPE:
            check(f"{name} batch-1 TPOT", b1["tpot_ms"], f"<= {SMALL_TPOT_MS:g} ms", b1["tpot_ms"] <= SMALL_TPOT_MS)
        else:
            ratio = b1["tpot_ms"] / s["tpot_floor_b1_ms"]
            check(
                f"{name} batch-1 TPOT / (weights / measured bandwidth)",
                ratio,
                f"<= {TPOT_OVER_FLOOR_X:g}",
                ratio <= TPOT_OVER_FLOOR_X,
            )
        if name == LARGE_SHAPE:
            b64 = next((r for r in s["decode_graphs"] if r["batch_size"] == 64), None)
            if b64:
                ratio = b64["tpot_ms"] / b1["tpot_ms"]
                check(
                    f"{name} batch-64 TPOT / batch-1 TPOT (1,024 context)",
                    ratio,
                    f"<= {BATCH_64_OVER_BATCH_1_X:g}",
                    ratio <= BATCH_64_OVER_BATCH_1_X,
                )
            at4k = next((r for r in s["prefill"] if r["prompt_tokens"] == 4096), None)
            if at4k:
                mfu = at4k["utilization"]["measured"]["mfu_percent"]
                check(
                    f"{name} prefill MFU at 4,096 tokens (measured peak)",
                    mfu,
                    f">= {PREFILL_MFU_PERCENT:g}%",
                    mfu >= PREFILL_MFU_PERCENT,
                )
        worst = max((r["new_shape_cost_ms"] for r in s["prefill"]), default=None)
        if worst is not None:
            check(
                f"{name} extra cost of a new prompt length",
                worst,
                f"<= {NEW_SHAPE_COST_MS:g} ms",
                worst <= NEW_SHAPE_COST_MS,
            )
    pc = result.get("prefix_cache")
    if pc and "points" in pc:
        hits = [r["ttft_p50_ms"] / pc["cold_ttft_p50_ms"] for r in pc["points"] if r["hit_rate"] > 0]
        if hits:
            check("prefix-cache hit TTFT / cold TTFT, worst point with hits", max(hits), "<= 1", max(hits) <= 1.0)
        high = [r for r in pc["points"] if r["hit_rate"] >= 0.9]
        if high:
            gain = pc["cold_ttft_p50_ms"] / high[0]["ttft_p50_ms"]
            check(
                f"cold TTFT / TTFT at >= 90% hits, {pc['prompt_tokens']} tokens",
                gain,
                f">= {PREFIX_HIT_GAIN_X:g}x",
                gain >= PREFIX_HIT_GAIN_X,
            )
    quant = result.get("quantization")
    if quant and "rows" in quant:
        by = {r["scheme"]: r for r in quant["rows"]}
        for scheme, goal in QUANT_TPOT_RATIO.items():
            if scheme in by:
                ratio = by[scheme]["tpot_b1_ratio"]
                check(f"quantization {scheme}: batch-1 TPOT / bf16's", ratio, f"<= {goal:g}", ratio <= goal)
    spec = result.get("speculative")
    if spec and "rows" in spec:
        c = max(r["c"] for r in spec["rows"])
        check("speculative c (draft step / target step), worst k", c, f"<= {SPECULATIVE_C:g}", c <= SPECULATIVE_C)
    return out
