"""The GPU check's result as text: parity, each shape's phases, the features, the decode paths,
the notebooks run on the device, the targets and the predictions (``PRED`` lines). Formatting only:
every figure is in the result."""

from __future__ import annotations

from .speed import decode_mode
from .verdicts import PREDICTIONS, pred_line
from minieng.measure.roofline import format_percent


def summary_lines(result: dict) -> list[str]:
    """The lines ``benchmarks/gpu_check.py`` prints after a run; sections absent from ``result``
    print nothing."""
    lines = []
    for row in result.get("parity") or []:
        if "dtype" in row:
            lines.append(
                f"parity {row['dtype']:>8}: max |dlogit| {row['max_abs_logit_diff']:.3g} (logit std "
                f"{row['logit_std']:.3g}), greedy {row['greedy_tokens_agreeing']}/{row['greedy_tokens']} agree"
            )
    for s in result.get("speed") or []:
        if "error" in s:
            lines.append(f"speed: {s['error']}")
            continue
        lines.append(
            f"\n{s['shape']}: {s['params'] / 1e9:.2f}B params, {s['num_graphs']} graphs captured in "
            f"{(s['graph_capture_s'] or 0):.1f} s, b1 floor {s['tpot_floor_b1_ms']:.2f} ms"
        )
        for r in s["prefill"]:
            u = r["utilization"]["measured"]
            lines.append(
                f"  prefill {r['prompt_tokens']:>6}: TTFT {r['ttft_ms']:8.2f} ms (first {r['first_request_ttft_ms']:.2f})"
                f"  MFU {format_percent(u['mfu_percent'])}"
            )
        eager = {r["batch_size"]: r for r in s["decode_eager"]}
        for r in s["decode_graphs"]:
            e = eager.get(r["batch_size"], {})
            lines.append(
                f"  decode b{r['batch_size']:<4} TPOT {r['tpot_ms']:7.2f} ms {decode_mode(r)}, "
                f"{e.get('tpot_ms', float('nan')):7.2f} ms eager  "
                f"MBU {format_percent(r['utilization']['measured']['mbu_percent'])}"
            )
    quant = result.get("quantization") or {}
    for r in quant.get("rows", [])[1:]:
        lines.append(
            f"quantization {r['scheme']:>4}: TTFT {r['ttft_ratio']:.2f}x ({r['ttft_ratio_predicted']:.2f}), TPOT b1 "
            f"{r['tpot_b1_ratio']:.2f}x ({r['tpot_b1_ratio_predicted']:.2f}) of bf16's, predictions in parentheses"
        )
    tp = result.get("tensor_parallel") or {}
    if tp.get("table") or tp.get("skipped"):
        lines.append(f"\ntensor parallelism (p = 1 against p = 2):\n{tp.get('table') or tp['skipped']}")
    paths = result.get("paths") or {}
    if paths.get("eager_ops"):
        ops = paths["eager_ops"]
        lines.append(
            f"decode ops (eager, batch 1): {ops['computing_per_layer']:.0f} computing, "
            f"{ops['ops_per_layer']:.0f} in all per layer"
        )
    for label, row in (paths.get("rows") or {}).items():
        if "decode" not in row:
            lines.append(f"decode path {label}: {row.get('skipped') or row}")
            continue
        tpots = ", ".join(f"b{r['batch_size']} {r['tpot_ms']:.2f} ms" for r in row["decode"])
        kernels = f", {row['kernels_per_step']} kernels a step" if row["kernels_per_step"] is not None else ""
        lines.append(f"decode path {label} ({row['ran']}{kernels}): {tpots}")
    course = result.get("notebooks") or {}
    for r in course.get("notebooks", []):
        lines.append(
            f"notebook {r['name']}: {r['status']} in {r['wall_s']:.0f} s" + (f" ({r['error']})" if r["error"] else "")
        )
    for c in course.get("claims", []):
        lines.append(f"claim {c['id']} ({c['notebook'] or '-'}): {c['here']} -> {c['holds']}")
    for t in result.get("targets", []):
        lines.append(f"{'PASS' if t['pass'] else 'MISS'}  {t['target']}: {t['value']:.3g} (goal {t['goal']})")
    lines += prediction_lines(result.get("predictions"))
    return lines


def prediction_lines(section: dict | None) -> list[str]:
    """One ``PRED <id> CONFIRMED|REFUTED|UNTESTED ...`` line per prediction (``verdicts.pred_line``);
    a section that failed as a whole prints every prediction UNTESTED with its error; not run: none."""
    if section is None:
        return []
    if "error" in section:
        return [f"PRED {pid} UNTESTED (the section failed: {section['error']})" for pid in PREDICTIONS]
    return [pred_line(r) for r in section["records"]]
