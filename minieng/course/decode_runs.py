"""Notebooks 02, 03, 05 and 11's measurements, announced with their estimated time and kept in the
results folder (``kit.cached``): a re-run with the same parameters on the same machine reads them
back, and notebook 11 reads 03's batch-1 decode instead of measuring it again.

Each function takes the engine and the lesson's parameters, builds the cache key (the parameters,
the model, device and dtype) and returns the ``CachedResult`` (``.noise``: the run that measured it).
The cache names and keys are those ``measured_points.READERS`` reads ("roofline", "decode_b1",
"kv_context", "prefill_batch", "batch_sweep").
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from minieng.course.kit import announce, cached
from minieng.lab import batching, decode_floor, kv_cache, phase_levers, roofline_sweep, token_cost
from minieng.lab.lesson_setup import result_key
from minieng.lab.tensor_parallel import TensorParallelRun, measure_tensor_parallel
from minieng.measure.sweep_plan import predict_ttft_s


def _where(engine) -> dict:
    return {"device": str(engine.device), "dtype": str(engine.dtype)}


def roofline_run(
    engine,
    model: str,
    probe: dict,
    *,
    prompt_tokens,
    decode_batches,
    repeats: int,
    decode_tokens: int,
    decode_prompt_tokens: int,
    peaks,
    noise=None,
):
    """Notebook 02's prefill and decode sweeps (``roofline_sweep.roofline_sweep``)."""
    sizes = dict(repeats=repeats, decode_tokens=decode_tokens, decode_prompt_tokens=decode_prompt_tokens)
    announce(
        f"{len(prompt_tokens) * repeats} prefills and {len(decode_batches)} decode batches",
        roofline_sweep.sweep_estimate_s(probe, engine, prompt_tokens, decode_batches, **sizes),
    )
    params = {
        "model": model,
        "prompt_tokens": list(prompt_tokens),
        "decode_batches": list(decode_batches),
        **sizes,
        **_where(engine),
    }
    return cached(
        "roofline",
        params,
        lambda: roofline_sweep.roofline_sweep(engine, prompt_tokens, decode_batches, peaks=peaks, **sizes),
        noise=noise,
    )


def decode_b1_run(engine, model: str, *, prompt_tokens: int, decode_tokens: int, peaks, noise=None):
    """A batch-1 decode's MFU and MBU (``decode_floor.decode_b1``): notebook 03's, read back by 11."""
    params = {"model": model, "decode_prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens, **_where(engine)}
    return cached(
        "decode_b1", params, lambda: decode_floor.decode_b1(engine, prompt_tokens, decode_tokens, peaks), noise=noise
    )


def kv_context_run(engine, model: str, probe: dict, *, batch_size: int, contexts, steps: int, measured, noise=None):
    """Notebook 03's context sweep: ``decode_floor.kv_point`` at each context."""
    announce(
        f"{len(contexts)} contexts, {batch_size} sequence(s) each",
        sum(
            decode_floor.kv_point_estimate_s(probe, engine, batch_size, c, steps, measured.bandwidth_gbps)
            for c in contexts
        ),
    )
    params = {"model": model, "contexts": list(contexts), "batch": batch_size, "steps": steps, **_where(engine)}
    return cached(
        "kv_context",
        params,
        lambda: {"rows": [decode_floor.kv_point(engine, batch_size, c, steps, measured) for c in contexts]},
        noise=noise,
    )


def prefill_batch_run(engine, model: str, probe: dict, *, prompt_tokens: int, batches, peaks, noise=None):
    """Notebook 03's prefill batches (``phase_levers.prefill_batch_sweep``), one step each."""
    gpu = engine.device.type == "cuda"
    announce(
        f"{len(batches)} batches of {prompt_tokens}-token prompts, each in one step",
        (2 if gpu else 1) * sum(predict_ttft_s(probe, prompt_tokens, engine.model_config, b) for b in batches),
    )
    params = {"model": model, "prompt_tokens": prompt_tokens, "batches": list(batches), **_where(engine)}
    return cached(
        "prefill_batch",
        params,
        lambda: {"rows": phase_levers.prefill_batch_sweep(engine, prompt_tokens, batches, peaks=peaks, warmup=gpu)},
        noise=noise,
    )


def recompute_run(engine, model: str, probe: dict, prompt: list[int], answer_tokens: int, *, noise=None):
    """Notebook 05's answer generated with the KV cache and recomputed without it
    (``kv_cache.recompute_vs_cache``)."""
    announce(
        f"a {answer_tokens}-token answer generated twice",
        kv_cache.recompute_estimate_s(probe, len(prompt), answer_tokens),
    )
    params = result_key(engine, model, prompt_tokens=len(prompt), answer_tokens=answer_tokens)
    return cached(
        "kv_recompute", params, lambda: kv_cache.recompute_vs_cache(engine, prompt, answer_tokens), noise=noise
    )


def batch_sweep_run(
    engine, model: str, *, max_batch: int, prompt_tokens: int, output_tokens: int, budget_s: float, peaks, noise=None
):
    """Notebook 05's decode batch sweep (``batching.batch_sweep``): batch 1, 2, 4, ... until tok/s stops
    growing, ``max_batch`` or ``budget_s``."""
    announce(f"a decode batch sweep, batch 1 up to at most {max_batch}", budget_s)
    params = result_key(
        engine,
        model,
        max_batch=max_batch,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        budget_s=budget_s,
        peaks=[p.to_dict() for p in peaks],
    )
    return cached(
        "batch_sweep",
        params,
        lambda: batching.batch_sweep(engine, max_batch, prompt_tokens, output_tokens, peaks, budget_s),
        noise=noise,
    )


def token_cost_run(
    engine, model: str, *, batches, prompt_tokens: int, output_tokens: int, interval_s: float, noise=None
) -> dict:
    """Notebook 05's energy and price per token, prefill and decode at each of ``batches``
    (``token_cost.measure_token_cost``; at least 4 output tokens, as it needs). ``interval_s``: each
    measured interval's least length, and the meter's idle window."""
    params = result_key(engine, model, batches=list(batches), output_tokens=output_tokens)
    return cached(
        "token_cost_batches",
        params,
        lambda: token_cost.measure_token_cost(
            engine,
            prompt_tokens=prompt_tokens,
            decode_batches=tuple(batches),
            output_tokens=max(4, output_tokens),
            decode_prompt_tokens=prompt_tokens,
            min_interval_s=interval_s,
            idle_s=interval_s,
        ),
        noise=noise,
    )


def thread_knob_run(
    engine,
    model: str,
    probe: dict,
    *,
    prompt_tokens: int,
    decode_steps: int,
    threads: list[int],
    decode_prompt_tokens: int,
    repeats: int,
    noise=None,
):
    """Notebook 11's thread knob (``phase_levers.thread_knob``) at each count of ``threads``."""
    announce(
        f"ceilings, a {prompt_tokens}-token prefill and {decode_steps} decode steps at {threads} threads",
        len(threads)
        * (predict_ttft_s(probe, prompt_tokens, engine.model_config) + decode_steps * probe["decode_step_s"])
        + 2,
    )
    params = {
        "model": model,
        "prompt_tokens": prompt_tokens,
        "threads": threads[0],
        "decode_steps": decode_steps,
        "dtype": str(engine.dtype),
    }
    return cached(
        "thread_knob",
        params,
        lambda: {
            "rows": phase_levers.thread_knob(
                engine,
                prompt_tokens,
                decode_steps,
                threads=threads,
                decode_prompt_tokens=decode_prompt_tokens,
                repeats=repeats,
            )
        },
        noise=noise,
    )


def tensor_parallel_run(ranks: int, *, batch_sizes, output_tokens: int, engine_args: dict, gpus: bool, noise=None):
    """Notebook 11's split, measured (``measure_tensor_parallel``): a ``TensorParallelRun`` and the
    noise of the run that measured it."""
    params = dict(ranks=ranks, batch_sizes=list(batch_sizes), output_tokens=output_tokens, engine=engine_args)
    res = cached(
        "tensor_parallel",
        params,
        lambda: asdict(
            measure_tensor_parallel(
                ranks, batch_sizes=tuple(batch_sizes), output_tokens=output_tokens, progress=print, **engine_args
            )
        ),
        device="cuda" if gpus else "cpu",
        noise=noise,
    )
    return TensorParallelRun.from_dict(res), res.noise


def flops_knob(
    engine,
    model: str,
    probe: dict,
    b1: dict,
    *,
    prompt_tokens: int,
    decode_steps: int,
    decode_prompt_tokens: int,
    repeats: int,
    peaks,
    noise=None,
) -> dict:
    """Claim S17, more FLOP/s for the same bandwidth: on a CPU, torch's threads (all against one,
    ``thread_knob_run``); on a GPU, a projection on the datasheets (``phase_time_projection``).
    Returns ``knob`` (the thread knob's ``CachedResult``, or None), ``projection`` (the GPU's, or
    None) and ``lines`` to print."""
    threads = torch.get_num_threads()
    if engine.device.type != "cpu":
        projection = decode_floor.phase_time_projection(engine, prompt_tokens, b1, decode_prompt_tokens, peaks)
        return {"knob": None, "projection": projection, "lines": projection["lines"]}
    if threads == 1:
        return {"knob": None, "projection": None, "lines": ["torch runs one thread here: there is no knob to turn"]}
    knob = thread_knob_run(
        engine,
        model,
        probe,
        prompt_tokens=prompt_tokens,
        decode_steps=decode_steps,
        threads=[threads, 1],
        decode_prompt_tokens=decode_prompt_tokens,
        repeats=repeats,
        noise=noise,
    )
    return {"knob": knob, "projection": None, "lines": decode_floor.format_thread_knob(knob["rows"])}
