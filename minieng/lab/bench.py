"""The main benchmark: prefill against decode, minieng against transformers, in one run.

Two sweeps on the same prompts (real text cut to exact token lengths):

- prompt length: TTFT and prefill tok/s (= prompt tokens / TTFT) of one request alone;
- batch size: TPOT and decode tok/s (= batch / TPOT) with every request decoding together.

TTFT and TPOT follow docs/architecture.md, Figures (vLLM's definitions): TTFT = first token - arrival,
TPOT = (E2EL - TTFT) / (n_out - 1), taken from the engine's recorded timestamps. transformers'
``generate`` has no timestamps, so its TTFT is the wall time of a 1-token ``generate`` and its
TPOT is (t(n tokens) - t(1 token)) / (n - 1) on the same prompts. After a warm-up, a prefill
figure is the median over ``repeats`` distinct prompts and a decode figure the median TPOT over
the batch's requests; ratios are taken within this one run, since timings on a shared machine
drift between runs. MFU and MBU come from the FLOPs and bytes of the steps that ran
(``roofline.phase_utilization``) against this machine's ceilings (``ceilings.machine_ceilings``:
measured once per machine and environment, shared with the notebooks), and the result records
the machine's timing noise read at the start. Where the device's energy is measurable (NVML on a
GPU, RAPL on a CPU: ``measure.energy``), J/token of prefill (the longest prompt) and of decode
(batch 1 and the largest batch) follow (``lab.token_cost``); elsewhere the result says why not.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch

from minieng.config import DEFAULT_MODEL_NAME
from minieng.device import synchronize
from minieng.engine.llm_engine import LLMEngine
from minieng.lab.gpu_utilization import decode_ops, profile_decode
from minieng.lab.probes import minieng_decode, minieng_prefill, warm_up
from minieng.lab.token_cost import measure_token_cost
from minieng.measure.ceilings import machine_ceilings
from minieng.measure.energy import energy_source
from minieng.measure.harness import fingerprint
from minieng.measure.peaks import datasheet_peak, measure_ceilings
from minieng.measure.roofline import phase_utilization
from minieng.measure.workloads import text_prompts

ARTICLE_PHASE_TOK_S = {"prefill_tok_s": 12968.6, "decode_tok_s": 95.0}  # the vLLM panel of Nascimento's article (136x)


@dataclass
class BenchConfig:
    """The sweeps: prompt lengths (tokens) for prefill, batch sizes for decode, and their sizes."""

    prompt_lens: list[int] = field(default_factory=lambda: [32, 128, 512, 1024])
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    decode_prompt_len: int = 64
    output_tokens: int = 32
    repeats: int = 3
    compare_transformers: bool = True
    energy: bool = True  # J/token per phase where the device's energy is measurable
    price_per_device_hour: float | None = None  # None: the example price, labelled as one


def _hf_generate(hf_model, prompts: list[list[int]], new_tokens: int, streamer=None) -> None:
    """One greedy ``generate`` of exactly ``new_tokens`` tokens for the batch ``prompts``
    (``streamer``: what transformers hands each step's tokens to, or None)."""
    ids = torch.tensor(prompts, device=hf_model.device)
    hf_model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        streamer=streamer,
    )


def _hf_generate_s(hf_model, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds of ``_hf_generate``, the device synchronized."""
    start = time.perf_counter()
    _hf_generate(hf_model, prompts, new_tokens)
    synchronize(hf_model.device)
    return time.perf_counter() - start


def hf_prefill(hf_model, prompts: list[list[int]]) -> float:
    return statistics.median([_hf_generate_s(hf_model, [p], 1) for p in prompts])


def hf_decode(hf_model, prompts: list[list[int]], output_tokens: int) -> float:
    """transformers' TPOT, s: the median gap between consecutive tokens of one ``generate`` of
    ``output_tokens`` tokens for the batch ``prompts``, timed in its own decoding loop (the
    streamer it hands each step's tokens to, already on the host: a gap is one decode step,
    its host transfer included, as minieng's steps include theirs). Not the difference of two
    ``generate`` calls, which a busy machine's noise can make negative."""
    from transformers.generation.streamers import BaseStreamer  # lazy, as load_transformers

    class StepClock(BaseStreamer):
        def __init__(self):
            self.times_s: list[float] = []

        def put(self, value):  # the prompt first, then each step's tokens
            self.times_s.append(time.perf_counter())

        def end(self):
            pass

    clock = StepClock()
    _hf_generate(hf_model, prompts, output_tokens, streamer=clock)
    gaps = [b - a for a, b in zip(clock.times_s[1:], clock.times_s[2:])]  # after the first token
    if not gaps:
        raise ValueError(f"hf_decode: output_tokens={output_tokens} gives no gap between tokens: ask for 2 or more")
    return statistics.median(gaps)


def load_transformers(engine: LLMEngine):
    from transformers import (
        AutoModelForCausalLM,
    )  # lazy: transformers takes seconds to import; `import minieng` does not pay it

    return AutoModelForCausalLM.from_pretrained(engine.loaded.path, dtype=engine.dtype).to(engine.device).eval()


def run_bench(
    engine: LLMEngine, cfg: BenchConfig, load_s: float | None = None, progress=print, sweeps: bool = True
) -> dict:
    """Measure the ceilings, run both sweeps (unless ``sweeps=False``); return a JSON-serializable
    dict whose keys carry their units."""
    if not sweeps:
        cfg.prompt_lens, cfg.batch_sizes, cfg.compare_transformers, cfg.energy = [], [], False, False
    hf = load_transformers(engine) if cfg.compare_transformers else None
    tok = engine.tokenizer
    progress("this machine's ceilings (matmul, copy: stored once per machine) and its noise now")
    ceilings = machine_ceilings(engine.device, engine.dtype, measure=measure_ceilings)
    env = bench_environment(engine)
    sheet = datasheet_peak(env["device_name"]) if engine.device.type == "cuda" else None
    peaks = [ceilings.peak] + ([sheet] if sheet else [])
    result = {
        "environment": env,
        "config": asdict(cfg),
        "load_s": load_s,
        "peaks": [p.to_dict() for p in peaks],
        "ceilings": ceilings.to_dict(),
        "noise": ceilings.noise.to_dict() if ceilings.noise else None,
        "noise_lines": ceilings.noise.lines() if ceilings.noise else [],
        "prefill": [],
        "decode": [],
    }
    if cfg.energy:
        result["token_cost"] = bench_token_cost(engine, cfg, progress)
    warm = text_prompts(tok, 16, 1)
    warm_up(engine, warm)
    if hf is not None:
        _hf_generate_s(hf, warm, 4)
    for n in cfg.prompt_lens:
        progress(f"prefill: {n} prompt tokens")
        prompts = text_prompts(tok, n, cfg.repeats)
        ttft, steps = minieng_prefill(engine, prompts)
        row = {
            "prompt_tokens": n,
            "minieng_ttft_ms": 1e3 * ttft,
            "minieng_prefill_tok_s": n / ttft,
            "utilization": phase_utilization(
                engine.model_config, engine.dtype.itemsize, steps, peaks, engine.matmul_bytes
            ),
        }
        if hf is not None:
            row["transformers_ttft_ms"] = 1e3 * hf_prefill(hf, prompts)
            row["transformers_prefill_tok_s"] = n / (row["transformers_ttft_ms"] / 1e3)
            row["prefill_speedup_x"] = row["minieng_prefill_tok_s"] / row["transformers_prefill_tok_s"]
        result["prefill"].append(row)
    for b in cfg.batch_sizes:
        progress(f"decode: batch {b}")
        prompts = text_prompts(tok, cfg.decode_prompt_len, b)
        tpot, steps = minieng_decode(engine, prompts, cfg.output_tokens)
        row = {
            "batch_size": b,
            "minieng_tpot_ms": 1e3 * tpot,
            "minieng_decode_tok_s": b / tpot,
            "utilization": phase_utilization(
                engine.model_config, engine.dtype.itemsize, steps, peaks, engine.matmul_bytes
            ),
            "forward_paths": dict(Counter(s.forward_path for s in steps)),  # how its steps ran
        }
        if hf is not None:
            row["transformers_tpot_ms"] = 1e3 * hf_decode(hf, prompts, cfg.output_tokens)
            row["transformers_decode_tok_s"] = b / (row["transformers_tpot_ms"] / 1e3)
            row["decode_speedup_x"] = row["minieng_decode_tok_s"] / row["transformers_decode_tok_s"]
        result["decode"].append(row)
    if cfg.batch_sizes:
        progress("decode step: ops dispatched and where its host time goes")
        one = text_prompts(tok, cfg.decode_prompt_len, 1)
        result["decode_ops"] = decode_ops(engine, one)
        shares = profile_decode(engine, one, steps=4)
        result["decode_profile"] = {"step_ms": shares["step_ms"], "cpu": shares["cpu"], "device": shares["device"]}
    result["phase_ratio"] = phase_ratio(result)
    return result


def bench_token_cost(engine: LLMEngine, cfg: BenchConfig, progress=print) -> dict:
    """``measure_token_cost`` at the sweeps' longest prompt, batch 1 and largest batch, where the
    device's energy is measurable; else ``{"energy": {"source": None, "description": why not}}``."""
    source, description = energy_source(engine.device)
    if source is None:
        return {"energy": {"source": None, "description": description}}
    progress(f"energy per token ({description}; the idle power first)")
    return measure_token_cost(
        engine,
        prompt_tokens=max(cfg.prompt_lens or [cfg.decode_prompt_len]),
        decode_batches=tuple(sorted({1, max(cfg.batch_sizes or [1])})),
        output_tokens=max(cfg.output_tokens, 4),
        decode_prompt_tokens=cfg.decode_prompt_len,
        price_per_device_hour=cfg.price_per_device_hour,
        progress=progress,
    )


def phase_ratio(result: dict) -> dict:
    """Prefill tok/s (best of the sweep) over batch-1 decode tok/s, beside the article's panel."""
    out = {
        "article_vllm_prefill_tok_s": ARTICLE_PHASE_TOK_S["prefill_tok_s"],
        "article_vllm_decode_tok_s": ARTICLE_PHASE_TOK_S["decode_tok_s"],
        "article_ratio_x": ARTICLE_PHASE_TOK_S["prefill_tok_s"] / ARTICLE_PHASE_TOK_S["decode_tok_s"],
    }
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


def bench_environment(engine: LLMEngine) -> dict:
    """The harness fingerprint (device, versions, dtype, threads, GPU clocks) plus the model."""
    import transformers  # lazy: transformers takes seconds to import; `import minieng` does not pay it

    graphs = engine.runner.fast.graphs
    return fingerprint(engine.device, engine.dtype) | {
        "transformers_version": transformers.__version__,
        "model": str(engine.config.model or f"{DEFAULT_MODEL_NAME} (embedded default)"),
        "model_params": engine.model_config.num_params,
        "kv_pool_tokens": engine.memory_plan.kv_tokens,
        "max_model_len": engine.max_model_len,
        "cuda_graphs": graphs.num_graphs if graphs else 0,  # decode buckets captured (0: eager)
        "cuda_graph_capture_s": graphs.capture_s if graphs else None,
        "compile_s": engine.runner.fast.compile_s,  # compile=True's start-up compilation (None: eager)
        "dropped_paths": dict(engine.runner.fast.dropped_paths),  # fast paths that failed to build: why
    }
