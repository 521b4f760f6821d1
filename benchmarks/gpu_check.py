"""The GPU path's checks, in one script: python benchmarks/gpu_check.py [--out DIR] [--smoke].

Runs on one CUDA GPU in a few minutes with no network. It makes random-weight checkpoints of
real shapes on the device (transformers' ``from_config`` + ``save_pretrained``, with a byte-level
tokenizer, so transformers and minieng read the same weights and every experiment can cut its
prompts from the project's text), then prints and writes as JSON (``gpu_check.json`` under
``--out``, default ``$OUT`` or ``results/``):

- logits parity and greedy agreement with transformers, fp32 and bf16;
- TTFT and prefill MFU at 512, 4,096 and 16,384 prompt tokens, and what the first request of a
  new length pays over a warm one (a per-shape planning cost);
- TPOT and MBU at batch 1, 8, 64 and 256, with CUDA graphs and eager (``enforce_eager=True``);
- the prefix cache: TTFT against the hit rate at 16,384-token prompts, and the cold baseline;
- speculative decoding, the 1.7B shape with the 135M shape as draft: c, v and the machinery;
- NVML util.gpu and GPM SM occupancy / DRAM bandwidth during batch-1 decode, beside MFU and MBU;
- quantization, the 1.7B shape: per scheme (int8, int4, w8a8) TTFT and TPOT at batch 1 and 16
  as ratios to bf16, beside the bytes and FLOP-rate predictions (``quant_experiment``);
- tensor parallelism, the 1.7B shape: decode at tensor_parallel_size 1 and 2 with the step split
  into compute and all-reduces, and the all-reduce swept (needs two GPUs; skipped with one);
- the GPU path's targets (issue 9), each as PASS or MISS with the figures it compares.

Random weights: speed does not depend on weight values, and greedy agreement on random logits
mostly measures near-ties, which is why parity reports the largest logit difference too.
``--smoke`` runs every section on tiny shapes in seconds (CPU tests use it); its figures mean
nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from minieng import EngineConfig, LLMEngine, SamplingParams
from minieng.lab.bench import minieng_decode, minieng_prefill
from minieng.lab.tensor_parallel import format_tensor_parallel, measure_tensor_parallel
from minieng.measure.harness import fingerprint
from minieng.measure.peaks import datasheet_peak, measure_ceilings
from minieng.measure.roofline import phase_utilization
from minieng.measure.workloads import text_prompts

GREEDY = dict(temperature=0, ignore_eos=True)

# A table: one shape a row reads better than one field a line.
# fmt: off
SHAPES = {  # transformers LlamaConfig fields; max_position_embeddings raised for 16k prompts
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0),
    "smollm2-1.7b": dict(vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                         num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=True, rope_theta=130000.0),
    "llama-7b-hd64": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=64, num_key_value_heads=16, tie_word_embeddings=False, rope_theta=500000.0),
}
# fmt: on
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)

FULL = dict(
    max_position=16384 + 512,
    prefill_lens=[512, 4096, 16384],
    batches=[1, 8, 64, 256],
    decode_context=1024,
    big_batch_context=512,
    output_tokens=32,
    prefix_tokens=16384,
    prefix_shares=[0.0, 0.5, 0.9, 0.97],
    spec_ks=[1, 2, 4],
    nvml_seconds=4.0,
    repeats=3,
    quant_prompt=4096,
    quant_batches=[1, 16],
)
SMOKE = dict(
    max_position=512,
    prefill_lens=[16, 64],
    batches=[1, 2],
    decode_context=16,
    big_batch_context=16,
    output_tokens=4,
    prefix_tokens=64,
    prefix_shares=[0.0, 0.5],
    spec_ks=[1, 2],
    nvml_seconds=0.0,
    repeats=1,
    quant_prompt=64,
    quant_batches=[1, 2],
)


def byte_tokenizer():
    """A byte-level tokenizer (one token per byte, ids 0-255, EOS 256): text in, ids every shape accepts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab["</s>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


def make_checkpoint(directory: Path, shape: dict, max_position: int, device: torch.device, weights: bool) -> Path:
    """A Hugging Face folder: config, tokenizer and (``weights=True``) random bf16 weights made on
    ``device``. Without weights, engines load it with ``load_format="dummy"``."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    directory.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        **shape,
        max_position_embeddings=max_position,
        rms_norm_eps=1e-5,
        initializer_range=0.05,
        eos_token_id=256,
        bos_token_id=None,
        pad_token_id=None,
    )
    config.save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    if weights:
        torch.manual_seed(0)  # the same random weights on every run
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                config, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32
            )
        model.save_pretrained(directory)
        del model
    return directory


def release() -> None:
    """Return freed memory to the device, after the caller dropped its engines (``del``), so the
    next engine sizes its KV pool from a free device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- sections --------------------------------------------------------------------------------------


def parity(path: Path, device: torch.device, p: dict) -> list[dict]:
    """Logits and greedy tokens of minieng against transformers on the same checkpoint."""
    from transformers import AutoModelForCausalLM

    rows = []
    for dtype in ("float32", "bfloat16"):
        engine = LLMEngine(
            model=str(path),
            dtype=dtype,
            device=str(device),
            kv_cache_memory_gib=2.0,
            max_model_len=min(1024, p["max_position"]),
        )
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=engine.dtype).to(device).eval()
        prompt = text_prompts(engine.tokenizer, 64, 1)[0]
        with torch.no_grad():
            ref = hf(torch.tensor([prompt], device=device)).logits[0, -1].float()
        n = 8 if p is SMOKE else 32
        ours = engine.generate([prompt], SamplingParams(max_tokens=n, **GREEDY))[0].token_ids
        theirs = reference_greedy(hf, prompt, n)
        agree = greedy_agreement(ours, theirs)
        logits = last_logits(engine, prompt)
        rows.append(
            {
                "dtype": dtype,
                "max_abs_logit_diff": (logits - ref).abs().max().item(),
                "logit_std": ref.std().item(),
                "greedy_tokens_agreeing": agree,
                "greedy_tokens": n,
            }
        )
        del engine, hf
        release()
    return rows


@torch.no_grad()
def reference_greedy(hf, prompt: list[int], n: int) -> list[int]:
    """transformers' model's ``n`` greedy tokens after ``prompt``, through EOS and every stop
    (``generate`` ends at the checkpoint's EOS whatever it is told, and minieng's side ignores EOS:
    both must run the same number of tokens to be compared)."""
    device = next(hf.parameters()).device
    tokens: list[int] = []
    for _ in range(n):  # the whole sequence each time: no cache API that changes between versions
        tokens.append(int(hf(torch.tensor([prompt + tokens], device=device)).logits[0, -1].argmax()))
    return tokens


def greedy_agreement(ours: list[int], theirs: list[int]) -> int:
    """Leading tokens the two greedy runs share; refuses runs of different lengths (a reference
    that stopped early would read as full agreement)."""
    if len(ours) != len(theirs):
        raise ValueError(f"greedy runs of {len(ours)} and {len(theirs)} tokens: compare runs of the same length")
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))


def decode_mode(row: dict) -> str:
    """How a decode row's steps ran: "graphs" when every step replayed a CUDA graph, "eager" when
    none did (no bucket fits that batch and context), else "graphs i/n" steps."""
    graphed, steps = row["graphed_steps"], row["steps"]
    return "graphs" if graphed == steps > 0 else "eager" if graphed == 0 else f"graphs {graphed}/{steps}"


def last_logits(engine: LLMEngine, prompt: list[int]) -> torch.Tensor:
    """minieng's logits after ``prompt`` (a throwaway sequence through the runner)."""
    from minieng.engine.sequence import Sequence

    seq = Sequence("parity", prompt, SamplingParams(temperature=0), 0.0)
    engine.block_manager.allocate(seq, len(prompt))
    logits, _ = engine.runner.forward([(seq, len(prompt))])
    engine.block_manager.free(seq)
    return logits[-1]


def prefill(engine: LLMEngine, peaks, p: dict) -> list[dict]:
    rows = []
    for n in p["prefill_lens"]:
        if n >= engine.max_model_len:
            continue
        prompts = text_prompts(engine.tokenizer, n, p["repeats"] + 1)
        first_ttft, _ = minieng_prefill(engine, prompts[:1])  # the first request of this length
        ttft, steps = minieng_prefill(engine, prompts[1:])
        util = phase_utilization(engine.model_config, engine.dtype.itemsize, steps, peaks)
        rows.append(
            {
                "prompt_tokens": n,
                "ttft_ms": 1e3 * ttft,
                "first_request_ttft_ms": 1e3 * first_ttft,
                "new_shape_cost_ms": 1e3 * (first_ttft - ttft),
                "utilization": util,
            }
        )
    return rows


def decode(engine: LLMEngine, peaks, p: dict) -> list[dict]:
    rows = []
    for b in p["batches"]:
        if b > engine.config.max_num_seqs:
            continue
        context = p["decode_context"] if b <= 64 else p["big_batch_context"]
        prompts = text_prompts(engine.tokenizer, context, b)
        tpot, steps = minieng_decode(engine, prompts, p["output_tokens"])
        util = phase_utilization(engine.model_config, engine.dtype.itemsize, steps, peaks)
        rows.append(
            {
                "batch_size": b,
                "context_tokens": context,
                "tpot_ms": 1e3 * tpot,
                "graphed_steps": sum(s.graphed for s in steps),
                "steps": len(steps),
                "utilization": util,
            }
        )
    return rows


def shape_speed(name: str, path: Path, device: torch.device, peaks, p: dict, load_format: str) -> dict:
    """Prefill and decode of one shape, with CUDA graphs and eager, on one loaded copy of the weights."""
    base = dict(
        model=str(path),
        load_format=load_format,
        device=str(device),
        max_num_seqs=max(p["batches"]),
        max_num_batched_tokens=max(p["prefill_lens"]),
        enable_prefix_caching=False,
    )
    if device.type == "cpu":
        base["kv_cache_memory_gib"] = 0.25
    start = time.perf_counter()
    engine = LLMEngine(**base)
    out = {
        "shape": name,
        "params": engine.model_config.num_params,
        "load_s": time.perf_counter() - start,
        "weight_bytes": engine.memory_plan.weight_bytes,
        "kv_pool_tokens": engine.memory_plan.kv_tokens,
        "max_model_len": engine.max_model_len,
    }
    graphs = engine.runner.graphs
    out["graph_capture_s"] = graphs.capture_s if graphs else None
    out["num_graphs"] = graphs.num_graphs if graphs else 0
    engine.generate(text_prompts(engine.tokenizer, 16, 2), SamplingParams(max_tokens=4, **GREEDY))  # warm-up
    out["prefill"] = prefill(engine, peaks, p)
    out["decode_graphs"] = decode(engine, peaks, p)
    loaded = engine.loaded
    del engine, graphs
    release()
    eager = LLMEngine(EngineConfig(**base, enforce_eager=True), loaded=loaded)
    eager.generate(text_prompts(eager.tokenizer, 16, 2), SamplingParams(max_tokens=4, **GREEDY))
    out["decode_eager"] = decode(eager, peaks, p)
    bandwidth = peaks[0].bandwidth_gbps * 1e9
    out["tpot_floor_b1_ms"] = 1e3 * out["weight_bytes"] / bandwidth  # weights / measured bandwidth
    del eager, loaded
    release()
    return out


def kernels_per_step(engine: LLMEngine, prompts: list[list[int]]) -> int | None:
    """CUDA kernels one decode step of ``prompts`` launches (a graph replay's kernels included), from
    torch.profiler's device events; None off CUDA."""
    if engine.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile  # lazy: a CUDA-only measurement

    from minieng.lab.gpu_utilization import decoding

    with decoding(engine, prompts, 4), profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.step()
        torch.cuda.synchronize(engine.device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def decode_paths(path: Path, device: torch.device, peaks, p: dict, load_format: str) -> dict:
    """One shape's decode through each path the engine has, on one copy of the weights, each row
    labelled by what ran: eager; the default (CUDA graphs on a GPU); compile=True (inside the graphs);
    attention_backend="triton" (the paged kernel, graphs too). Ops per layer of an eager step, and
    kernels per step (CUDA)."""
    from minieng.lab.gpu_utilization import decode_ops
    from minieng.model import triton_attention

    base = dict(
        model=str(path),
        load_format=load_format,
        device=str(device),
        max_num_seqs=max(p["batches"]),
        enable_prefix_caching=False,
    )
    if device.type == "cpu":
        base["kv_cache_memory_gib"] = 0.25
    paths = {
        "eager": dict(enforce_eager=True),
        "default": {},
        "compiled": dict(compile=True),
        "triton": dict(attention_backend="triton"),
    }
    out: dict = {"rows": {}}
    loaded = None
    one = None
    for label, extra in paths.items():
        if label == "triton" and not (
            triton_attention.TRITON_AVAILABLE and (device.type == "cuda" or triton_attention.INTERPRETED)
        ):
            out["rows"][label] = {"skipped": "triton cannot run here"}
            continue
        engine = LLMEngine(EngineConfig(**base, **extra), loaded=loaded)
        loaded = engine.loaded
        one = one or text_prompts(engine.tokenizer, 16, 1)
        engine.generate(text_prompts(engine.tokenizer, 16, 2), SamplingParams(max_tokens=4, **GREEDY))  # warm-up
        graphs = engine.runner.graphs
        out["rows"][label] = {
            "ran": ", ".join(
                [f"graphs ({graphs.num_graphs})" if graphs else "eager"]
                + (["compiled"] if engine.runner.regions is not None else [])
                + (["triton attention"] if engine.config.attention_backend == "triton" else ["gather + SDPA"])
            ),
            "compile_s": engine.runner.compile_s,
            "kernels_per_step": kernels_per_step(engine, one),
            "decode": decode(engine, peaks, p),
        }
        if label == "eager":
            out["eager_ops"] = decode_ops(engine, one)
        del engine, graphs
        release()
    return out


def prefix_cache(path: Path, device: torch.device, p: dict, load_format: str) -> dict:
    from minieng.lab.prefix_caching import measure_point

    engine = LLMEngine(
        model=str(path),
        load_format=load_format,
        device=str(device),
        max_num_batched_tokens=p["prefix_tokens"],
        max_num_seqs=8,
        **({"kv_cache_memory_gib": 0.25} if device.type == "cpu" else {}),
    )
    n, rows = p["prefix_tokens"], []
    cold = measure_point(engine, 0, n, p["repeats"], cache=False)
    for share in p["prefix_shares"]:
        shared = int(share * n)
        point = measure_point(engine, shared, n - shared, p["repeats"], cache=True)
        rows.append(
            {
                "share": share,
                "hit_rate": point.hit_rate,
                "ttft_p50_ms": point.ttft_ms["p50"],
                "ttft_p99_ms": point.ttft_ms["p99"],
            }
        )
    del engine
    release()
    return {
        "prompt_tokens": n,
        "cold_ttft_p50_ms": cold.ttft_ms["p50"],
        "cold_ttft_p99_ms": cold.ttft_ms["p99"],
        "points": rows,
    }


def speculative(target: Path, draft: Path, device: torch.device, p: dict) -> dict:
    from minieng.lab.speculative import k_sweep, machinery_overhead

    # k at its largest: a GPU engine captures verification graphs for every k up to it.
    engine = LLMEngine(
        model=str(target),
        draft_model=str(draft),
        speculative_method="draft",
        num_speculative_tokens=max(p["spec_ks"]),
        device=str(device),
        max_num_seqs=8,
        **({"kv_cache_memory_gib": 0.25} if device.type == "cpu" else {}),
    )
    prompts = text_prompts(engine.tokenizer, 64, 1)
    result = k_sweep(engine, prompts, p["spec_ks"], p["output_tokens"])
    result["machinery"] = [machinery_overhead(engine, prompts[0], k, p["output_tokens"]) for k in p["spec_ks"]]
    del engine
    release()
    return result


def nvml_during_decode(path: Path, device: torch.device, peaks, p: dict, load_format: str) -> list[dict]:
    """util.gpu and GPM metrics over a batch-1 decode of a few seconds, eager and with graphs."""
    from minieng.measure.nvml import TelemetrySampler, summarize

    rows = []
    for eager in (True, False):
        engine = LLMEngine(
            model=str(path), load_format=load_format, device=str(device), max_num_seqs=8, enforce_eager=eager
        )
        prompt = text_prompts(engine.tokenizer, 64, 1)
        engine.generate(prompt, SamplingParams(max_tokens=8, **GREEDY))
        step = statistics.median(s.duration_s for s in engine.step_records[-4:])
        tokens = min(engine.max_model_len - 80, max(32, int(p["nvml_seconds"] / step)))
        first = len(engine.step_records)
        with TelemetrySampler(engine.device) as sampler:
            engine.generate(prompt, SamplingParams(max_tokens=tokens, **GREEDY))
        steps = [s for s in engine.step_records[first:] if s.num_prefill_tokens == 0]
        util = phase_utilization(engine.model_config, engine.dtype.itemsize, steps, peaks)
        rows.append(
            {
                "enforce_eager": eager,
                "decode_steps": len(steps),
                "nvml": summarize(sampler.samples),
                "mfu_percent": util["measured"]["mfu_percent"],
                "mbu_percent": util["measured"]["mbu_percent"],
                "tpot_ms": 1e3 * statistics.median(s.duration_s for s in steps),
            }
        )
        del engine
        release()
    return rows


def quantization(path: Path, device: torch.device, peaks, p: dict, load_format: str) -> dict:
    """Every scheme with a kernel on the device against the float engine, sharing its weights."""
    from minieng.lab.quantization_lab import QuantBenchConfig, device_schemes, run_quantization

    engine = LLMEngine(
        model=str(path),
        load_format=load_format,
        device=str(device),
        max_num_seqs=max(p["quant_batches"]),
        max_num_batched_tokens=p["quant_prompt"],
        max_model_len=min(p["quant_prompt"] + 512, p["max_position"]),
        kv_cache_memory_gib=2.0 if device.type == "cuda" else 0.25,
        enable_prefix_caching=False,
    )
    cfg = QuantBenchConfig(
        schemes=device_schemes(engine.device, engine.dtype),
        prompt_tokens=p["quant_prompt"],
        batch_sizes=p["quant_batches"],
        output_tokens=p["output_tokens"],
        repeats=p["repeats"],
        quality_prompts=1,
        quality_tokens=8 if p is SMOKE else 32,
    )
    result = run_quantization(engine, cfg, peaks)
    del engine
    release()
    return result


# -- targets ---------------------------------------------------------------------------------------


def tensor_parallel(path: Path, device: torch.device, p: dict, load_format: str) -> dict:
    """Decode at tensor_parallel_size 1 and 2 (``lab.tensor_parallel``): over two GPUs where the
    machine has them (skipped with one), as two processes on a CPU."""
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        return {"skipped": f"{torch.cuda.device_count()} GPU here: tensor parallelism needs two"}
    run = measure_tensor_parallel(
        2,
        batch_sizes=tuple(p["batches"][:2]),
        prompt_len=p["decode_context"],
        output_tokens=p["output_tokens"],
        model=str(path),
        load_format=load_format,
        device=str(device),
    )
    return asdict(run) | {"table": format_tensor_parallel(run)}


def targets(result: dict) -> list[dict]:
    """Issue 9's GPU targets, from the figures measured above (absent figures are skipped)."""
    out = []

    def check(name, value, goal, ok):
        out.append({"target": name, "value": value, "goal": goal, "pass": bool(ok)})

    shapes = {s["shape"]: s for s in result.get("speed", []) if "shape" in s}
    for name, s in shapes.items():
        b1 = next((r for r in s["decode_graphs"] if r["batch_size"] == 1), None)
        if b1 is None:
            continue
        if name == "smollm2-135m":
            check(f"{name} batch-1 TPOT", b1["tpot_ms"], "<= 1 ms", b1["tpot_ms"] <= 1.0)
        else:
            ratio = b1["tpot_ms"] / s["tpot_floor_b1_ms"]
            check(f"{name} batch-1 TPOT / (weights / measured bandwidth)", ratio, "<= 1.35", ratio <= 1.35)
        if name == "llama-7b-hd64":
            b64 = next((r for r in s["decode_graphs"] if r["batch_size"] == 64), None)
            if b64:
                check(
                    f"{name} batch-64 TPOT / batch-1 TPOT (1,024 context)",
                    b64["tpot_ms"] / b1["tpot_ms"],
                    "<= 1.6",
                    b64["tpot_ms"] / b1["tpot_ms"] <= 1.6,
                )
            at4k = next((r for r in s["prefill"] if r["prompt_tokens"] == 4096), None)
            if at4k:
                mfu = at4k["utilization"]["measured"]["mfu_percent"]
                check(f"{name} prefill MFU at 4,096 tokens (measured peak)", mfu, ">= 50%", mfu >= 50)
        worst = max((r["new_shape_cost_ms"] for r in s["prefill"]), default=None)
        if worst is not None:
            check(f"{name} extra cost of a new prompt length", worst, "<= 5 ms", worst <= 5)
    pc = result.get("prefix_cache")
    if pc and "points" in pc:
        hits = [r["ttft_p50_ms"] / pc["cold_ttft_p50_ms"] for r in pc["points"] if r["hit_rate"] > 0]
        if hits:
            check("prefix-cache hit TTFT / cold TTFT, worst point with hits", max(hits), "<= 1", max(hits) <= 1.0)
        high = [r for r in pc["points"] if r["hit_rate"] >= 0.9]
        if high:
            gain = pc["cold_ttft_p50_ms"] / high[0]["ttft_p50_ms"]
            check(f"cold TTFT / TTFT at >= 90% hits, {pc['prompt_tokens']} tokens", gain, ">= 5x", gain >= 5)
    quant = result.get("quantization")
    if quant and "rows" in quant:
        by = {r["scheme"]: r for r in quant["rows"]}
        for scheme, goal in (("int8", 0.6), ("int4", 0.4)):
            if scheme in by:
                ratio = by[scheme]["tpot_b1_ratio"]
                check(f"quantization {scheme}: batch-1 TPOT / bf16's", ratio, f"<= {goal}", ratio <= goal)
    spec = result.get("speculative")
    if spec and "rows" in spec:
        c = max(r["c"] for r in spec["rows"])
        check("speculative c (draft step / target step), worst k", c, "<= 0.2", c <= 0.2)
    return out


COURSE_ON_DEVICE = ["00", "01", "02", "03", "04"]  # the notebooks --notebooks runs: hardware to utilization


def course_on_device(output_dir: Path) -> dict:
    """Notebooks 00-04 in smoke mode on this device, each with the model it picks here: their
    status, time and the articles' claims as they read on this device."""
    from minieng.course.runner import run_course  # lazy: nbclient is the notebooks extra's

    summary = run_course(output_dir=output_dir, only=COURSE_ON_DEVICE, smoke=True, progress=False)
    keep = ("name", "status", "wall_s", "error")
    return {
        "wall_s": summary["wall_s"],
        "notebooks": [{k: r.get(k) for k in keep} for r in summary["notebooks"]],
        "claims": summary["claims"],
        "output_dir": str(output_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "results"), help="folder for gpu_check.json")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, every section, seconds (tests)")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument(
        "--sections",
        default="parity,speed,paths,prefix,spec,nvml,quant,tp",
        help="comma-separated subset of parity,speed,paths,prefix,spec,nvml,quant,tp",
    )
    parser.add_argument(
        "--notebooks",
        action="store_true",
        help="also run notebooks 00-04 in smoke mode on this device (the course runner; needs the notebooks extra)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    p = SMOKE if args.smoke else FULL
    shapes = {name: TINY for name in SHAPES} if args.smoke else SHAPES
    sections = set(args.sections.split(","))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    started = time.perf_counter()
    measured, _, _ = measure_ceilings(device, dtype)
    sheet = datasheet_peak(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    peaks = [measured] + ([sheet] if sheet else [])
    result: dict = {"smoke": args.smoke, "peaks": [pk.to_dict() for pk in peaks]}
    work = Path(tempfile.mkdtemp(prefix="minieng-gpu-check-"))
    ckpt = {
        name: make_checkpoint(work / name, shape, p["max_position"], device, weights=name != "llama-7b-hd64")
        for name, shape in shapes.items()
    }
    fmt = "dummy" if args.smoke else "auto"  # smoke: tiny dummy weights; full: the checkpoints' weights

    def section(key, fn):
        if key.split(":")[0] not in sections:
            return
        print(f"[{time.perf_counter() - started:6.1f} s] {key}", file=sys.stderr, flush=True)
        try:
            value = fn()
        except Exception as e:  # one failing section must not hide the others' figures
            value = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            print(value["traceback"], file=sys.stderr)
        if ":" in key:
            result.setdefault(key.split(":")[0], []).append(value)
        else:
            result[key] = value

    section("parity", lambda: parity(ckpt["smollm2-135m"], device, p))
    for name, path in ckpt.items():
        section(
            f"speed:{name}",
            lambda n=name, pth=path: shape_speed(
                n, pth, device, peaks, p, "dummy" if n == "llama-7b-hd64" or args.smoke else "auto"
            ),
        )
    section("paths", lambda: decode_paths(ckpt["smollm2-1.7b"], device, peaks, p, fmt))
    section("prefix", lambda: prefix_cache(ckpt["smollm2-1.7b"], device, p, fmt))
    section("spec", lambda: speculative(ckpt["smollm2-1.7b"], ckpt["smollm2-135m"], device, p))
    if device.type == "cuda":
        section("nvml", lambda: nvml_during_decode(ckpt["smollm2-1.7b"], device, peaks, p, fmt))
    section("quant", lambda: quantization(ckpt["smollm2-1.7b"], device, peaks, p, fmt))
    section("tp", lambda: tensor_parallel(ckpt["smollm2-1.7b"], device, p, fmt))
    if args.notebooks:
        sections.add("notebooks")
        section("notebooks", lambda: course_on_device(Path(args.out) / "course"))
    result["quantization"] = result.pop("quant", None)
    result["prefix_cache"] = result.pop("prefix", None)
    result["speculative"] = result.pop("spec", None)
    result["tensor_parallel"] = result.pop("tp", None)
    result["targets"] = targets(result)
    result["environment"] = fingerprint(device, dtype)
    result["wall_s"] = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str))
    print_summary(result)
    print(f"wrote {out / 'gpu_check.json'} in {result['wall_s']:.0f} s")
    return 0


def print_summary(result: dict) -> None:
    from minieng.measure.roofline import format_percent

    for row in result.get("parity") or []:
        if "dtype" in row:
            print(
                f"parity {row['dtype']:>8}: max |dlogit| {row['max_abs_logit_diff']:.3g} (logit std "
                f"{row['logit_std']:.3g}), greedy {row['greedy_tokens_agreeing']}/{row['greedy_tokens']} agree"
            )
    for s in result.get("speed") or []:
        if "error" in s:
            print(f"speed: {s['error']}")
            continue
        print(
            f"\n{s['shape']}: {s['params'] / 1e9:.2f}B params, {s['num_graphs']} graphs captured in "
            f"{(s['graph_capture_s'] or 0):.1f} s, b1 floor {s['tpot_floor_b1_ms']:.2f} ms"
        )
        for r in s["prefill"]:
            u = r["utilization"]["measured"]
            print(
                f"  prefill {r['prompt_tokens']:>6}: TTFT {r['ttft_ms']:8.2f} ms (first {r['first_request_ttft_ms']:.2f})"
                f"  MFU {format_percent(u['mfu_percent'])}"
            )
        eager = {r["batch_size"]: r for r in s["decode_eager"]}
        for r in s["decode_graphs"]:
            e = eager.get(r["batch_size"], {})
            print(
                f"  decode b{r['batch_size']:<4} TPOT {r['tpot_ms']:7.2f} ms {decode_mode(r)}, "
                f"{e.get('tpot_ms', float('nan')):7.2f} ms eager  MBU {format_percent(r['utilization']['measured']['mbu_percent'])}"
            )
    quant = result.get("quantization") or {}
    for r in quant.get("rows", [])[1:]:
        print(
            f"quantization {r['scheme']:>4}: TTFT {r['ttft_ratio']:.2f}x ({r['ttft_ratio_predicted']:.2f}), TPOT b1 "
            f"{r['tpot_b1_ratio']:.2f}x ({r['tpot_b1_ratio_predicted']:.2f}) of bf16's, predictions in parentheses"
        )
    tp = result.get("tensor_parallel") or {}
    if tp.get("table") or tp.get("skipped"):
        print(f"\ntensor parallelism (p = 1 against p = 2):\n{tp.get('table') or tp['skipped']}")
    paths = result.get("paths") or {}
    if paths.get("eager_ops"):
        ops = paths["eager_ops"]
        print(
            f"decode ops (eager, batch 1): {ops['computing_per_layer']:.0f} computing, {ops['ops_per_layer']:.0f} in all per layer"
        )
    for label, row in (paths.get("rows") or {}).items():
        if "decode" not in row:
            print(f"decode path {label}: {row.get('skipped') or row}")
            continue
        tpots = ", ".join(f"b{r['batch_size']} {r['tpot_ms']:.2f} ms" for r in row["decode"])
        kernels = f", {row['kernels_per_step']} kernels a step" if row["kernels_per_step"] is not None else ""
        print(f"decode path {label} ({row['ran']}{kernels}): {tpots}")
    course = result.get("notebooks") or {}
    for r in course.get("notebooks", []):
        print(
            f"notebook {r['name']}: {r['status']} in {r['wall_s']:.0f} s" + (f" ({r['error']})" if r["error"] else "")
        )
    for c in course.get("claims", []):
        print(f"claim {c['id']} ({c['notebook'] or '-'}): {c['here']} -> {c['holds']}")
    for t in result.get("targets", []):
        print(f"{'PASS' if t['pass'] else 'MISS'}  {t['target']}: {t['value']:.3g} (goal {t['goal']})")


if __name__ == "__main__":
    sys.exit(main())
