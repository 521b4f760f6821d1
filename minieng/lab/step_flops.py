"""The engine's steps under FlopCounterMode, beside the analytic count of the same steps.

``flop_count.counted_flops`` counts the matrix products each step dispatches from their shapes
(2 m n k each), knowing nothing of the model: an independent check of ``flops_bytes.step_work``.
On the engine's steps:

- linear layers run as ``aten.mm``/``aten.addmm`` (CUDA, other CPUs) or oneDNN's linear on x86-64
  CPUs (``llama.linear``): the count equals ``step_work``'s matmul + LM head FLOPs exactly (a bias
  inside addmm is counted by neither);
- attention runs as SDPA, counted as the dense score rectangle of the shapes the kernel was
  handed: ``step_work``'s causal count plus the masked triangle of each prefill chunk
  (``flops_bytes.masked_attention_flops``), plus, for decodes, the padding of the batch's keys to
  whole blocks (a kernel's layout, which the analytic count leaves out).

Norms, RoPE, softmax, SiLU and sampling are not matrix products: neither side counts them.
A step that replays a CUDA graph dispatches no op, so counting needs an eager engine
(``enforce_eager=True``).
"""

from __future__ import annotations

from collections.abc import Sequence

from minieng.config import SamplingParams
from minieng.engine.llm_engine import LLMEngine
from minieng.measure.flop_count import ATTENTION_OPS, LINEAR_OPS, counted_flops
from minieng.measure.flops_bytes import masked_attention_flops, step_work


def counted_steps(engine: LLMEngine, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[dict]:
    """Send ``prompts`` (greedy, ``max_tokens`` each) and run every step under FlopCounterMode.

    Returns one dict per step: ``chunks`` (the ``StepRecord``'s), ``counted_linear_flops`` and
    ``linear_flops`` (``step_work``'s matmul + LM head), ``counted_attention_flops`` and
    ``attention_flops`` (the causal count), ``masked_attention_flops`` (the prefill chunks'
    masked triangles), and ``other_flops``: what FlopCounterMode counted in any other op.
    Raises ``ValueError`` for an engine that replays CUDA graphs (FlopCounterMode sees none of
    a graph's ops) or when requests are already running (their steps would mix in).
    """
    if engine.runner.fast.graphs is not None:
        raise ValueError(
            "this engine replays CUDA graphs, whose ops FlopCounterMode cannot see: count on "
            "LLMEngine(loaded=engine.loaded, enforce_eager=True, ...)"
        )
    if engine.has_unfinished_requests():
        raise ValueError("the engine has requests running: counted_steps needs it idle")
    params = SamplingParams.fixed_length(max_tokens)
    for prompt in prompts:
        engine.add_request(list(prompt), params)
    rows = []
    while engine.has_unfinished_requests():
        counts = counted_flops(engine.step)
        chunks = engine.step_records[-1].chunks
        work = step_work(engine.model_config, chunks, engine.dtype.itemsize)
        rows.append(
            {
                "chunks": [list(c) for c in chunks],
                "counted_linear_flops": sum(counts.get(op, 0) for op in LINEAR_OPS),
                "linear_flops": work.matmul_flops + work.lm_head_flops,
                "counted_attention_flops": sum(counts.get(op, 0) for op in ATTENTION_OPS),
                "attention_flops": work.attention_flops,
                "masked_attention_flops": masked_attention_flops(engine.model_config, chunks),
                "other_flops": {op: n for op, n in counts.items() if op not in LINEAR_OPS + ATTENTION_OPS},
            }
        )
    return rows


def counting_engine(engine: LLMEngine, max_num_batched_tokens: int) -> LLMEngine:
    """``engine`` itself when it runs eagerly; else an eager engine sharing its weights (a CUDA
    graph's replay dispatches no op for FlopCounterMode to see)."""
    if engine.runner.fast.graphs is None:
        return engine
    return LLMEngine(
        loaded=engine.loaded,
        enforce_eager=True,
        enable_prefix_caching=False,
        kv_cache_memory_gib=1,
        max_num_batched_tokens=max_num_batched_tokens,
    )


def format_counted_steps(counts: Sequence[dict], model_config) -> list[str]:
    """``counted_steps``' rows, two lines a step: the linear FLOPs counted against ``step_work``'s,
    and the attention FLOPs counted split into the causal work, the masked triangle and padding."""
    c = model_config
    per_key = 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim  # attention FLOPs per query-key pair
    lines = []
    for r in counts:
        ((new, context, _),) = r["chunks"]
        what = f"prefill of {new} tokens" if new > 1 else f"decode after {context} tokens"
        same = "equal" if r["counted_linear_flops"] == r["linear_flops"] else "DIFFERENT"
        extra = r["counted_attention_flops"] - r["attention_flops"] - r["masked_attention_flops"]
        lines += [
            f"{what}:",
            f"  linear    counted {r['counted_linear_flops'] / 1e9:10.4f} GFLOP, step_work {r['linear_flops'] / 1e9:10.4f} ({same})",
            f"  attention counted {r['counted_attention_flops'] / 1e9:10.4f} GFLOP = causal {r['attention_flops'] / 1e9:.4f}"
            f" + masked triangle {r['masked_attention_flops'] / 1e9:.4f} + padding {extra / 1e9:.4f}"
            f" ({extra // per_key} key slots beyond the {context + new} attended)",
        ]
        if r["other_flops"]:
            lines.append(f"  also counted: {r['other_flops']}")
    return lines
