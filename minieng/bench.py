"""The main benchmark: prefill against decode, minieng against transformers, in one run.

Two sweeps on the same prompts (real text cut to exact token lengths):

- prompt length: TTFT and prefill tok/s (= prompt tokens / TTFT) of one request alone;
- batch size: TPOT and decode tok/s (= batch / TPOT) with every request decoding together.

TTFT and TPOT follow DESIGN.md section 4 (vLLM's definitions): TTFT = first token - arrival,
TPOT = (E2EL - TTFT) / (n_out - 1), taken from the engine's recorded timestamps. transformers'
``generate`` has no timestamps, so its TTFT is the wall time of a 1-token ``generate`` and its
TPOT is (t(n tokens) - t(1 token)) / (n - 1) on the same prompts. Every figure is the median of
``repeats`` runs after a warm-up; ratios are taken within this one run, since timings on a shared
machine drift between runs.
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch

from .config import SamplingParams
from .engine import LLMEngine, StepRecord
from .flops import SuspectFigureWarning, mbu, mfu, step_work
from .harness import fingerprint
from .hardware import Peak, datasheet_peak, measure_ceilings, synchronize
from .workload import text_prompts

SEED_PANEL = {"prefill_tok_s": 12968.6, "decode_tok_s": 95.0}  # seed 000's vLLM panel (136x)


@dataclass
class BenchConfig:
    prompt_lens: list[int] = field(default_factory=lambda: [32, 128, 512, 1024])
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    decode_prompt_len: int = 64
    output_tokens: int = 32
    repeats: int = 3
    compare_transformers: bool = True


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _ttft_tpot(out) -> tuple[float, float | None]:
    t = out.times
    ttft = t.emissions[0][0] - t.arrival_s
    n = len(out.token_ids)
    tpot = (t.emissions[-1][0] - t.emissions[0][0]) / (n - 1) if n > 1 else None
    return ttft, tpot


def minieng_prefill(engine: LLMEngine, prompts: list[list[int]]) -> tuple[float, list[StepRecord]]:
    """Median TTFT (s) of each prompt sent alone, and the steps that ran them (all prefill)."""
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    first = len(engine.step_records)
    ttft = _median([_ttft_tpot(engine.generate([p], params)[0])[0] for p in prompts])
    return ttft, engine.step_records[first:]


def minieng_decode(engine: LLMEngine, prompts: list[list[int]], output_tokens: int) -> tuple[float, list[StepRecord]]:
    """Median TPOT (s) over a batch decoding together, and the decode-only steps of the run."""
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    first = len(engine.step_records)
    tpot = _median([_ttft_tpot(o)[1] for o in engine.generate(prompts, params)])
    return tpot, [s for s in engine.step_records[first:] if s.num_prefill_tokens == 0]


def phase_utilization(engine: LLMEngine, steps: list[StepRecord], peaks: list[Peak]) -> dict:
    """FLOPs and bytes of ``steps`` (``flops.step_work``) over their measured time: MFU and MBU.

    One entry per peak, keyed by its source ("measured", "datasheet"); a figure over 100% is
    flagged as suspect (a wrong count or ceiling), never reported as fact.
    """
    dtype_bytes = torch.empty((), dtype=engine.dtype).element_size()
    work = sum(step_work(engine.model_config, s.chunks, dtype_bytes) for s in steps)
    seconds = sum(s.duration_s for s in steps)
    out = {"flops": work.total_flops, "bytes": work.total_bytes, "seconds": seconds,
           "arithmetic_intensity_flop_per_byte": work.arithmetic_intensity_flop_per_byte,
           "achieved_tflops": work.total_flops / seconds / 1e12, "achieved_gbps": work.total_bytes / seconds / 1e9}
    for peak in peaks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SuspectFigureWarning)  # the flag travels in the result
            f = mfu(work.total_flops, seconds, peak.peak_tflops * 1e12)
            b = mbu(work.total_bytes, seconds, peak.bandwidth_gbps * 1e9)
        out[peak.source] = {"mfu_percent": f.percent, "mbu_percent": b.percent, "suspect": f.suspect or b.suspect}
    return out


def _hf_generate_s(hf_model, prompts: list[list[int]], new_tokens: int) -> float:
    ids = torch.tensor(prompts, device=hf_model.device)
    start = time.perf_counter()
    hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                      min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    synchronize(hf_model.device)
    return time.perf_counter() - start


def hf_prefill(hf_model, prompts: list[list[int]]) -> float:
    return _median([_hf_generate_s(hf_model, [p], 1) for p in prompts])


def hf_decode(hf_model, prompts: list[list[int]], output_tokens: int) -> float:
    return (_hf_generate_s(hf_model, prompts, output_tokens) - _hf_generate_s(hf_model, prompts, 1)) / (output_tokens - 1)


def load_transformers(engine: LLMEngine):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(engine.loaded.path, dtype=engine.dtype).to(engine.device).eval()


def run_bench(engine: LLMEngine, cfg: BenchConfig, load_s: float | None = None, progress=print) -> dict:
    """Run both sweeps; return a JSON-serializable dict whose keys carry their units."""
    hf = load_transformers(engine) if cfg.compare_transformers else None
    tok = engine.tokenizer
    progress("measuring this machine's ceilings (matmul, copy)")
    measured, matmul, copy = measure_ceilings(engine.device, engine.dtype)
    env = environment(engine)
    sheet = datasheet_peak(env["device_name"]) if engine.device.type == "cuda" else None
    peaks = [measured] + ([sheet] if sheet else [])
    result = {"environment": env, "config": asdict(cfg), "load_s": load_s,
              "peaks": [asdict(p) | {"ridge_flop_per_byte": p.ridge_flop_per_byte} for p in peaks],
              "ceilings": {"matmul_flop_s": matmul.to_dict(), "copy_bytes_s": copy.to_dict()},
              "prefill": [], "decode": []}
    warm = text_prompts(tok, 16, 1)
    engine.generate(warm, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    if hf is not None:
        _hf_generate_s(hf, warm, 4)
    for n in cfg.prompt_lens:
        progress(f"prefill: {n} prompt tokens")
        prompts = text_prompts(tok, n, cfg.repeats)
        ttft, steps = minieng_prefill(engine, prompts)
        row = {"prompt_tokens": n, "minieng_ttft_ms": 1e3 * ttft, "minieng_prefill_tok_s": n / ttft,
               "utilization": phase_utilization(engine, steps, peaks)}
        if hf is not None:
            row["transformers_ttft_ms"] = 1e3 * hf_prefill(hf, prompts)
            row["transformers_prefill_tok_s"] = n / (row["transformers_ttft_ms"] / 1e3)
            row["prefill_speedup_x"] = row["minieng_prefill_tok_s"] / row["transformers_prefill_tok_s"]
        result["prefill"].append(row)
    for b in cfg.batch_sizes:
        progress(f"decode: batch {b}")
        prompts = text_prompts(tok, cfg.decode_prompt_len, b)
        tpot, steps = minieng_decode(engine, prompts, cfg.output_tokens)
        row = {"batch_size": b, "minieng_tpot_ms": 1e3 * tpot, "minieng_decode_tok_s": b / tpot,
               "utilization": phase_utilization(engine, steps, peaks)}
        if hf is not None:
            row["transformers_tpot_ms"] = 1e3 * hf_decode(hf, prompts, cfg.output_tokens)
            row["transformers_decode_tok_s"] = b / (row["transformers_tpot_ms"] / 1e3)
            row["decode_speedup_x"] = row["minieng_decode_tok_s"] / row["transformers_decode_tok_s"]
        result["decode"].append(row)
    result["phase_ratio"] = phase_ratio(result)
    return result


def phase_ratio(result: dict) -> dict:
    """Prefill tok/s (best of the sweep) over batch-1 decode tok/s, beside the seed's panel."""
    out = {"seed_vllm_prefill_tok_s": SEED_PANEL["prefill_tok_s"], "seed_vllm_decode_tok_s": SEED_PANEL["decode_tok_s"],
           "seed_ratio_x": SEED_PANEL["prefill_tok_s"] / SEED_PANEL["decode_tok_s"]}
    b1 = next((r for r in result["decode"] if r["batch_size"] == 1), None)
    if b1 and result["prefill"]:
        for name in ("minieng", "transformers"):
            key = f"{name}_prefill_tok_s"
            if key in result["prefill"][0]:
                best = max(result["prefill"], key=lambda r: r[key])
                out[f"{name}_prefill_tok_s"] = best[key]
                out[f"{name}_prefill_at_prompt_tokens"] = best["prompt_tokens"]
                out[f"{name}_decode_tok_s"] = b1[f"{name}_decode_tok_s"]
                out[f"{name}_ratio_x"] = best[key] / b1[f"{name}_decode_tok_s"]
    return out


def environment(engine: LLMEngine) -> dict:
    """The harness fingerprint (device, versions, dtype, threads, GPU clocks) plus the model."""
    import transformers

    return fingerprint(engine.device, engine.dtype) | {
        "transformers_version": transformers.__version__,
        "model": str(engine.config.model or "SmolLM2-135M-Instruct (embedded default)"),
        "model_params": engine.model_config.num_params,
    }


TARGETS = [  # (description, section, selector, key, comparison, threshold): from the engine issue
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
    env = result["environment"]
    lines = [f"minieng bench: {env['model']} on {env['device_name']} ({env['device']}, {env['dtype']}, "
             f"{env['torch_threads']} threads), torch {env['torch_version']}, transformers {env['transformers_version']}"]
    if result.get("load_s") is not None:
        lines.append(f"model load: {result['load_s']:.2f} s")
    hf = result["config"]["compare_transformers"]
    lines += ["", "Prefill (one request alone): TTFT and prefill throughput"]
    head = f"{'prompt tok':>10} {'TTFT ms':>9} {'tok/s':>8}"
    if hf:
        head += f" | {'HF TTFT ms':>10} {'HF tok/s':>8} | {'speedup':>7}"
    lines.append(head)
    for r in result["prefill"]:
        line = f"{r['prompt_tokens']:>10} {r['minieng_ttft_ms']:>9.1f} {r['minieng_prefill_tok_s']:>8.0f}"
        if hf:
            line += (f" | {r['transformers_ttft_ms']:>10.1f} {r['transformers_prefill_tok_s']:>8.0f}"
                     f" | {r['prefill_speedup_x']:>6.2f}x")
        lines.append(line)
    cfg = result["config"]
    lines += ["", f"Decode ({cfg['decode_prompt_len']}-token prompts, {cfg['output_tokens']} output tokens each): "
              "TPOT and decode throughput"]
    head = f"{'batch':>10} {'TPOT ms':>9} {'tok/s':>8}"
    if hf:
        head += f" | {'HF TPOT ms':>10} {'HF tok/s':>8} | {'speedup':>7}"
    lines.append(head)
    for r in result["decode"]:
        line = f"{r['batch_size']:>10} {r['minieng_tpot_ms']:>9.1f} {r['minieng_decode_tok_s']:>8.1f}"
        if hf:
            line += (f" | {r['transformers_tpot_ms']:>10.1f} {r['transformers_decode_tok_s']:>8.1f}"
                     f" | {r['decode_speedup_x']:>6.2f}x")
        lines.append(line)
    lines += ["", "Per phase, against the peaks (MFU = achieved FLOP/s / peak, MBU = achieved bytes/s / bandwidth)"]
    for pk in result["peaks"]:
        lines.append(f"  {pk['source']:>9} peak: {pk['peak_tflops']:.3g} TFLOP/s, {pk['bandwidth_gbps']:.3g} GB/s, "
                     f"ridge {pk['ridge_flop_per_byte']:.3g} FLOP/byte")
    lines.append(f"  {'phase':<22} {'FLOP/byte':>9} {'TFLOP/s':>8} {'GB/s':>7}" +
                 "".join(f" {pk['source'][:4] + ' MFU':>9} {pk['source'][:4] + ' MBU':>9}" for pk in result["peaks"]))
    for label, row in ([(f"prefill {r['prompt_tokens']} tok", r) for r in result["prefill"]]
                       + [(f"decode batch {r['batch_size']}", r) for r in result["decode"]]):
        u = row["utilization"]
        line = (f"  {label:<22} {u['arithmetic_intensity_flop_per_byte']:>9.1f} {u['achieved_tflops']:>8.3f} "
                f"{u['achieved_gbps']:>7.1f}")
        for pk in result["peaks"]:
            v = u[pk["source"]]
            flag = "!" if v["suspect"] else " "
            line += f" {v['mfu_percent']:>7.1f}%{flag} {v['mbu_percent']:>7.1f}%{flag}"
        lines.append(line)
    if any(r["utilization"][pk["source"]]["suspect"] for r in result["prefill"] + result["decode"]
           for pk in result["peaks"]):
        lines.append("  ! over 100%: suspect (a wrong count or a ceiling measured too low), not a fact")
    b1 = next((r for r in result["decode"] if r["batch_size"] == 1), None)
    if b1:
        mbu1 = b1["utilization"]["measured"]["mbu_percent"]
        lines.append(f"  batch-1 decode reaches {mbu1:.0f}% of the measured bandwidth (engine goal: >= 75%)")
    pr = result["phase_ratio"]
    lines += ["", "Two phases: prefill tok/s / batch-1 decode tok/s"]
    lines.append(f"  seed article (vLLM panel): {pr['seed_vllm_prefill_tok_s']:,.1f} / {pr['seed_vllm_decode_tok_s']:.0f}"
                 f" = {pr['seed_ratio_x']:.0f}x")
    for name in ("minieng", "transformers"):
        if f"{name}_ratio_x" in pr:
            lines.append(f"  {name} here: {pr[f'{name}_prefill_tok_s']:,.0f} (at {pr[f'{name}_prefill_at_prompt_tokens']} "
                         f"tokens) / {pr[f'{name}_decode_tok_s']:.1f} = {pr[f'{name}_ratio_x']:.1f}x")
    if result.get("targets"):
        lines += ["", "Targets (engine issue), measured in this run:"]
        for t in result["targets"]:
            lines.append(f"  {'met ' if t['met'] else 'MISS'} {t['target']}: {t['measured_x']:.2f}x (goal {t['goal']})")
    return "\n".join(lines)


def probe_speed(engine: LLMEngine) -> dict:
    """A few-second probe of this device: prefill tok/s at 64 tokens and one batch-1 decode step (s).

    Notebooks use it to print an estimate before a heavy cell runs.
    """
    prompt = text_prompts(engine.tokenizer, 64, 1)
    ttft, _ = minieng_prefill(engine, prompt)
    tpot, _ = minieng_decode(engine, prompt, 5)
    return {"prefill_tok_s": 64 / ttft, "decode_step_s": tpot}


def estimate_s(probe: dict, prefill_tokens: int = 0, decode_steps: int = 0) -> float:
    """Rough seconds for ``prefill_tokens`` of prefill plus ``decode_steps`` batch-1 decode steps."""
    return prefill_tokens / probe["prefill_tok_s"] + decode_steps * probe["decode_step_s"]
