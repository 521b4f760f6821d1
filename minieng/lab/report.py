"""The bench's result as text: the sweep tables, per-phase MFU/MBU, the serving run, the targets.

Formatting only: every figure was measured by ``bench`` or ``replay`` and sits in the result dict.
"""

from __future__ import annotations

from collections import Counter

from minieng.lab.quantization import decode_vs_prefill
from minieng.lab.speculative import format_speculative
from minieng.lab.token_cost import format_token_cost
from minieng.measure.metrics import ServingMetrics, common_tail, percentile_label
from minieng.measure.roofline import format_percent

TARGETS = [  # (description, section, selector, key, comparison, threshold): the engine's speed targets
    ("batch-1 TPOT vs transformers", "decode", 1, "tpot_ratio", "<=", 0.8),
    ("decode tok/s at batch 8 vs transformers", "decode", 8, "decode_speedup_x", ">=", 1.5),
    ("decode tok/s at batch 32 vs transformers", "decode", 32, "decode_speedup_x", ">=", 1.5),
    ("prefill tok/s at 512 tokens vs transformers", "prefill", 512, "prefill_speedup_x", ">=", 1.0),
]


def check_targets(result: dict) -> list[dict]:
    rows = []
    for desc, section, sel, key, op, threshold in TARGETS:
        field_ = "batch_size" if section == "decode" else "prompt_tokens"
        row = next((r for r in result[section] if r[field_] == sel), None)
        if row is None or "transformers_tpot_ms" not in row and "transformers_ttft_ms" not in row:
            continue
        value = row["minieng_tpot_ms"] / row["transformers_tpot_ms"] if key == "tpot_ratio" else row[key]
        met = value <= threshold if op == "<=" else value >= threshold
        rows.append({"target": desc, "measured_x": value, "goal": f"{op} {threshold}x", "met": met})
    return rows


def format_table(result: dict) -> str:
    """The bench result as the tables the README describes."""
    env = result["environment"]
    lines = [
        f"minieng bench: {env['model']} on {env['device_name']} ({env['device']}, {env['dtype']}, "
        f"{env['torch_threads']} threads), torch {env['torch_version']}, transformers {env['transformers_version']}"
    ]
    if result.get("load_s") is not None:
        lines.append(f"model load: {result['load_s']:.2f} s")
    lines += result.get("noise_lines", [])
    if env.get("cuda_graphs"):
        lines.append(
            f"decode steps replay CUDA graphs: {env['cuda_graphs']} batch/width buckets captured in "
            f"{env['cuda_graph_capture_s']:.1f} s at start-up (enforce_eager=True to compare)"
        )
    if env.get("compile_s") is not None:
        lines.append(f"the layers' dense parts compiled (torch.compile) in {env['compile_s']:.1f} s at start-up")
    for path, why in (env.get("dropped_paths") or {}).items():
        lines.append(f"FAST PATH DROPPED at start-up, a slower one ran: {path}: {why}")
    paths = Counter()
    for row in result["decode"]:
        paths.update(row.get("forward_paths") or {})
    if paths:
        lines.append("decode steps ran: " + ", ".join(f"{n} {path}" for path, n in paths.most_common()))
    if result["prefill"] or result["decode"]:
        lines += _sweeps(result) + _utilization(result) + _decode_step(result) + _phase_ratio(result["phase_ratio"])
    if result.get("token_cost"):
        lines += [""] + _token_cost(result["token_cost"])
    if result.get("serving"):
        lines += [""] + format_serving(result["serving"])
    if result.get("prefix_cache"):
        lines += [""] + format_prefix(result["prefix_cache"])
    if result.get("speculative"):
        lines += [""] + format_speculative(result["speculative"])
    if result.get("quantization"):
        lines += [""] + format_quantization(result["quantization"])
    if result.get("figures"):
        lines += ["", "Figures: " + ", ".join(result["figures"])]
    if result.get("targets"):
        noise = result.get("noise") or {}
        lines += ["", "Targets, measured in this run:"]
        if noise.get("level") in ("noisy", "busy"):
            lines.append(
                f"  (the machine was {noise['level']}: timings may be off by about {100 * noise['relative']:.0f}%, and so "
                "may these ratios; rerun on a quiet machine before reading a MISS as the engine's)"
            )
        for t in result["targets"]:
            lines.append(f"  {'met ' if t['met'] else 'MISS'} {t['target']}: {t['measured_x']:.3f}x (goal {t['goal']})")
    return "\n".join(lines)


def _decode_step(result: dict) -> list[str]:
    """One batch-1 decode step: the ops it dispatches, and the share of its time in the products."""
    ops, prof = result.get("decode_ops"), result.get("decode_profile")
    if not ops:
        return []
    lines = [
        "",
        f"A batch-1 decode step dispatches {ops['step_ops']} ops: {ops['computing_per_layer']:.0f} computing "
        f"(a kernel each on a GPU) and {ops['ops_per_layer']:.0f} in all per layer",
    ]
    if prof:
        view = prof["device"] or prof["cpu"]
        where = "GPU kernel time" if prof["device"] else "host time"
        lines.append(
            f"  profiled ({prof['step_ms']:.1f} ms a step, the profiler's cost included): matrix products "
            f"{100 * view['matmul_share']:.0f}% of its {where}, other ops {100 * view['other_ops_share']:.0f}%, "
            f"outside any op {100 * view.get('outside_ops_share', 0):.0f}%"
        )
    return lines


def _sweeps(result: dict) -> list[str]:
    hf, cfg = result["config"]["compare_transformers"], result["config"]
    sections = [
        (
            "Prefill (one request alone): TTFT and prefill throughput",
            "prefill",
            "prompt tok",
            "prompt_tokens",
            "ttft_ms",
            "TTFT ms",
            "prefill_tok_s",
            "prefill_speedup_x",
        ),
        (
            f"Decode ({cfg['decode_prompt_len']}-token prompts, {cfg['output_tokens']} output tokens each): "
            "TPOT and decode throughput",
            "decode",
            "batch",
            "batch_size",
            "tpot_ms",
            "TPOT ms",
            "decode_tok_s",
            "decode_speedup_x",
        ),
    ]
    lines = []
    for title, key, label, x, lat, lat_name, rate, speedup in sections:
        if not result[key]:
            continue
        head = f"{label:>10} {lat_name:>9} {'tok/s':>8}"
        if hf:
            head += f" | {'HF ' + lat_name:>10} {'HF tok/s':>8} | {'speedup':>7}"
        lines += ["", title, head]
        for r in result[key]:
            line = f"{r[x]:>10} {r['minieng_' + lat]:>9.1f} {r['minieng_' + rate]:>8.1f}"
            if hf:
                line += f" | {r['transformers_' + lat]:>10.1f} {r['transformers_' + rate]:>8.1f} | {r[speedup]:>6.2f}x"
            lines.append(line)
    return lines


def _utilization(result: dict) -> list[str]:
    peaks = result["peaks"]
    lines = ["", "Per phase, against the peaks (MFU = achieved FLOP/s / peak, MBU = achieved bytes/s / bandwidth)"]
    for pk in peaks:
        lines.append(
            f"  {pk['source']:>9} peak: {pk['peak_tflops']:.3g} TFLOP/s, {pk['bandwidth_gbps']:.3g} GB/s, "
            f"ridge {pk['ridge_flop_per_byte']:.3g} FLOP/byte"
        )
    lines.append(
        f"  {'phase':<22} {'FLOP/byte':>9} {'TFLOP/s':>8} {'GB/s':>7}"
        + "".join(f" {pk['source'][:4] + ' MFU':>9} {pk['source'][:4] + ' MBU':>9}" for pk in peaks)
    )
    rows = [(f"prefill {r['prompt_tokens']} tok", r) for r in result["prefill"]] + [
        (f"decode batch {r['batch_size']}", r) for r in result["decode"]
    ]
    suspect = False
    for label, row in rows:
        u = row["utilization"]
        line = f"  {label:<22} {u['arithmetic_intensity_flop_per_byte']:>9.1f} {u['achieved_tflops']:>8.3f} {u['achieved_gbps']:>7.1f}"
        for pk in peaks:
            v = u[pk["source"]]
            suspect |= v["suspect"]
            flag = "!" if v["suspect"] else " "
            line += f" {format_percent(v['mfu_percent']):>8}{flag} {format_percent(v['mbu_percent']):>8}{flag}"
        lines.append(line)
    if suspect:
        lines.append("  ! over 100%: suspect (a wrong count or a ceiling measured too low), not a fact")
    b1 = next((r for r in result["decode"] if r["batch_size"] == 1), None)
    if b1:
        lines.append(
            f"  batch-1 decode reaches {format_percent(b1['utilization']['measured']['mbu_percent'])} of the measured "
            "bandwidth (engine goal: >= 75%)"
        )
    return lines


def _phase_ratio(pr: dict) -> list[str]:
    lines = [
        "",
        "Two phases: prefill tok/s / batch-1 decode tok/s",
        f"  Nascimento's article (vLLM panel): {pr['article_vllm_prefill_tok_s']:,.1f}"
        f" / {pr['article_vllm_decode_tok_s']:.0f} = {pr['article_ratio_x']:.1f}x",
    ]
    for name in ("minieng", "transformers"):
        if f"{name}_ratio_x" in pr:
            lines.append(
                f"  {name} here: {pr[f'{name}_prefill_tok_s']:,.0f} (at {pr[f'{name}_prefill_at_prompt_tokens']} "
                f"tokens) / {pr[f'{name}_decode_tok_s']:.1f} = {pr[f'{name}_ratio_x']:.1f}x"
            )
    return lines


def _token_cost(cost: dict) -> list[str]:
    """J/token per phase (``lab.token_cost``), or why the energy was not measurable here."""
    if not cost.get("rows"):
        return [f"J/token per phase: not measured; {cost['energy']['description']}"]
    return format_token_cost(cost).splitlines()


def format_serving(report: dict) -> list[str]:
    """The ``--workload`` section of the table: latency percentiles, throughput, goodput, MFU/MBU."""
    m, w = report["metrics"], report["workload"]
    lines = [
        f"Serving run: {w['kind']} workload, {w['num_requests']} requests over {w['last_arrival_s']:.1f} s of arrivals "
        f"({w['prompt_tokens_total']} prompt + {w['output_tokens_total']} output tokens)",
        f"  completed {m['completed']}, aborted {m['aborted']}, failed {m['failed']}; duration {m['duration_s']:.1f} s; "
        f"{m['num_preemptions']} preemptions",
        f"  throughput: {m['output_throughput_tok_s'] or 0:.1f} output tok/s, {m['prefill_throughput_tok_s'] or 0:.1f} prompt tok/s, "
        f"{m['request_throughput_req_s'] or 0:.2f} req/s",
        f"  {'ms':<6} {'n':>6} {'mean':>8} {'P50':>8} {'P90':>8} {'P99':>8} {'max':>8}",
    ]
    short = []  # rows too small for a P99 (metrics.percentile_label): their tail is their max
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        st, name = m[key], key[:-3].upper()
        if st["count"]:
            n = st["count"]
            percentiles = [
                f"{st[f'p{p}']:>8.1f}" if percentile_label(p, n)[0] == "P" else f"{'-':>8}" for p in (50, 90, 99)
            ]
            lines.append(f"  {name:<6} {n:>6} {st['mean']:>8.1f} " + " ".join(percentiles) + f" {st['max']:>8.1f}")
            if percentile_label(99, n)[0] != "P":
                short.append(f"{name} {percentile_label(99, n)}")
    if short:
        lines.append(
            f"  (-: a percentile too high for its sample (P99 needs 100); their tail is the max: {', '.join(short)})"
        )
    if m["num_excluded_from_tpot"]:
        lines.append(f"  ({m['num_excluded_from_tpot']} requests with fewer than 2 output tokens have no TPOT)")
    if m.get("cached_prompt_tokens") is None:
        lines.append("  prefix cache: the server did not report cached prompt tokens (usage.prompt_tokens_details)")
    else:
        lines.append(
            f"  prefix cache: {format_percent(100 * (m['prefix_cache_hit_rate'] or 0))} of prompt tokens served from "
            f"the cache ({m['cached_prompt_tokens']} tokens)"
        )
    if m.get("slo"):
        slo = ", ".join(f"{k} <= {v:g}" for k, v in m["slo"].items() if v is not None)
        lines.append(
            f"  goodput under SLO ({slo}): {m['goodput_req_s']:.2f} req/s, "
            f"{m['num_good_requests']} of {m['num_requests']} requests met every objective"
        )
    for name in ("steps_with_prefill", "decode_only_steps"):
        u = report.get(name)
        if u:
            meas = u["measured"]
            lines.append(
                f"  {name.replace('_', ' ')}: {u['num_steps']} steps, {u['arithmetic_intensity_flop_per_byte']:.1f} FLOP/byte, "
                f"MFU {format_percent(meas['mfu_percent'])}, MBU {format_percent(meas['mbu_percent'])} (measured peaks)"
                + (" SUSPECT" if meas["suspect"] else "")
            )
    if report.get("telemetry"):
        t = report["telemetry"]
        lines.append(
            f"  NVML: util.gpu median {format_percent(t.get('util_gpu_percent_median'))}, SM occupancy median "
            f"{format_percent(t.get('sm_occupancy_percent_median'))} (reliable: {t.get('reliable')})"
        )
    return lines


def format_two_clocks(client: ServingMetrics, engine: ServingMetrics) -> list[str]:
    """The same requests timed by a load generator (``client``) and by the engine (``engine``), both
    ``metrics.serving_metrics``: per figure (TTFT, TPOT, ITL, E2EL) the sample size, both P50s and
    both tails. A tail is the P99 where both samples support it, else both maxima, named in the row
    (``metrics.common_tail``: "max of 24")."""
    lines = [
        f"  {'ms':<6} {'n':>5} {'client P50':>11} {'engine P50':>11} {'client tail':>12} {'engine tail':>12}  tail"
    ]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        c, e = getattr(client, key), getattr(engine, key)
        if not (c["count"] and e["count"]):
            lines.append(f"  {key[:-3].upper():<6} (not measured: {c['count']} client and {e['count']} engine samples)")
            continue
        label, tail = common_tail([c, e])
        lines.append(
            f"  {key[:-3].upper():<6} {min(c['count'], e['count']):>5} {c['p50']:>11.1f} {e['p50']:>11.1f} "
            f"{c[tail]:>12.1f} {e[tail]:>12.1f}  {label}"
        )
    return lines


def format_prefix(result: dict) -> list[str]:
    """The ``--prefix-cache`` section: TTFT against the measured hit rate, then the multi-turn run."""
    cold = result["cold"]["ttft_ms"]
    # the tail column: P99 where every point has the 100 requests it needs, else each point's max
    tail, tail_key = common_tail([cold] + [p["ttft_ms"] for p in result["points"]])
    lines = [
        f"Prefix caching: {result['prompt_tokens']}-token prompts = shared system prompt + distinct user turn "
        f"(block size {result['block_size']})",
        f"  {'shared tok':>10} {'hit rate':>9} {'P50 TTFT ms':>12} {('P99' if tail_key == 'p99' else 'max') + ' TTFT ms':>12} {'vs cold':>8}",
        f"  {'cache off':>10} {0:>8.1%} {cold['p50']:>12.1f} {cold[tail_key]:>12.1f} {1:>7.2f}x",
    ]
    for p in result["points"]:
        lines.append(
            f"  {p['shared_tokens']:>10} {p['hit_rate']:>8.1%} {p['ttft_ms']['p50']:>12.1f} "
            f"{p['ttft_ms'][tail_key]:>12.1f} {cold['p50'] / p['ttft_ms']['p50']:>7.2f}x"
        )
    if tail_key == "max":
        lines.append(f"  (max: the {tail} requests a point, too few for a P99)")
    high = [p for p in result["points"] if p["hit_rate"] >= 0.9]
    if high:
        speedup = cold["p50"] / high[0]["ttft_ms"]["p50"]
        lines.append(f"  at {high[0]['hit_rate']:.1%} hits TTFT is {speedup:.1f}x lower than cache off (target >= 5x)")
    lines.append(
        "  Nascimento's article: "
        + ", ".join(f"{s['hit_rate']:.1%} -> {s['ttft_s']:.2f} s" for s in result["article_points"])
    )
    if result.get("zero_hit_overhead"):
        z = result["zero_hit_overhead"]
        lines.append(
            f"  overhead with 0% hits ({z['num_requests']} x {z['prompt_tokens']}-token prompts, {z['rounds']} "
            f"rounds): {z['cache_on_tok_s']:.1f} tok/s on vs {z['cache_off_tok_s']:.1f} off = "
            f"{z['overhead_percent']:+.1f}% (target < 3%)"
        )
    if result.get("multi_turn"):
        lines.append("  multi-turn conversation, each turn resending the history:")
        for row in result["multi_turn"]:
            lines.append(
                f"    turn {row['turn']}: {row['prompt_tokens']:>5} prompt tokens, {row['cached_tokens']:>5} cached "
                f"({row['hit_rate']:.0%}), TTFT {row['ttft_ms']:.1f} ms"
            )
    return lines


def format_quantization(result: dict) -> list[str]:
    """The ``--quantization`` section: per scheme, bytes, TTFT and TPOT as ratios to the float
    model beside the roofline's prediction, then accuracy (``lab.quantization.run_quantization``)."""
    cfg = result["config"]
    batches = cfg["batch_sizes"]
    lines = [
        f"Quantization on {result['device']} ({result['dtype']}): ratios to the float model measured in the same rounds; "
        f"(predicted) decode = bytes ratio of a step, prefill = float kernel FLOP/s / the scheme's",
        f"  {'scheme':<6} {'weights MB':>10} {'B/weight':>8} {'TTFT ' + str(cfg['prompt_tokens']):>15}"
        + "".join(f" {'TPOT b' + str(b):>15}" for b in batches)
        + f" {'dec/pre':>7} {'agree':>6} {'KL nats':>8}",
    ]
    for r in result["rows"]:
        line = (
            f"  {r['scheme']:<6} {r['weight_bytes'] / 1e6:>10.1f} {r['bytes_per_weight']:>8.3f} "
            f"{r['ttft_ratio']:>6.2f}x ({r['ttft_ratio_predicted']:>4.2f})"
        )
        for b in batches:
            line += f" {r[f'tpot_b{b}_ratio']:>6.2f}x ({r[f'tpot_b{b}_ratio_predicted']:>4.2f})"
        line += f" {decode_vs_prefill(r, batches[0]):>6.2f}x {r['agreement']:>6.1%} {r['kl_nats']:>8.4f}"
        lines.append(line)
    base = result["rows"][0]
    lines.append(
        f"  float model: TTFT {base['ttft_ms']:.1f} ms, "
        + ", ".join(f"TPOT b{b} {base[f'tpot_b{b}_ms']:.1f} ms" for b in batches)
        + f"; B/weight = matrix bytes per matrix weight, scales included; dec/pre = TTFT ratio / TPOT b{batches[0]} ratio"
    )
    lines.append(
        f"  accuracy: greedy agreement and KL(float || scheme) over {base['positions']} positions of "
        f"{cfg['quality_prompts']} held-out prompts (teacher-forced, {cfg['quality_tokens']} tokens each)"
    )
    for r in result["rows"][1:]:
        lines.append(f"  {r['scheme']}: {r['kernel']}")
    return lines
