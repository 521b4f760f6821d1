"""Tensor parallelism measured (two devices add their bandwidth, less the link's toll): a decode
step on one rank and on p, the all-reduce's toll, and the paper model held against both.

``measure_tensor_parallel`` builds the same model at ``tensor_parallel_size`` 1 and p, in turn
(one engine alive at a time, each with a KV pool of ``kv_cache_memory_gib`` per rank), and times
batch decodes on each: TPOT (vLLM's definition), each decode step's forward pass, and, within it,
rank 0's time in collectives (``StepRecord.comm_s``: the ``2 x layers + 2`` all-reduces and
gathers of ``wings.parallel.tensor_parallel``, waits for the other rank included). At p it also sweeps the
all-reduce over message sizes on the engine's own process group, and fits the ring model's hop
latency and link bandwidth to it (``tp_estimate.fit_link``). The fit reads each size's fastest
quarter (its 25th percentile), not its median: on a 2-core CPU an all-reduce between two
processes (gloo) either completes at the link's pace or waits for the kernel's next timer tick, and a
median flips between the two (docs/measurements.md). The table shows both.

The paper model (``tp_estimate.tensor_parallel_decode``) is then fed what was measured instead of
what it assumed: the bandwidth one rank reads at (the p = 1 step's bytes over its forward time)
and the measured link. Two readings of "p devices": the paper's, p devices each with its own
memory (p times the bandwidth), and this machine's when the ranks are processes on one CPU
socket, sharing one memory bus (the same bandwidth, split). The model counts the layers' 2 x
layers all-reduces and an even split; the engine also runs the embedding's all-reduce and the
logits' gather, and splits heads as evenly as whole heads allow: part of what the model misses.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from minieng.engine.llm_engine import LLMEngine
from minieng.lab.probes import minieng_decode, warm_up
from minieng.measure.flops_bytes import decode_work
from minieng.measure.tp_estimate import Link, TensorParallelStep, fit_link, tensor_parallel_decode
from minieng.measure.workloads import text_prompts

# Message sizes (bytes) of the sweep: from far below one token's activations (hidden x dtype bytes:
# 2,304 for the default model in fp32) to a batch of hundreds of tokens'.
ALL_REDUCE_SIZES = [64, 1024, 16 * 1024, 256 * 1024, 1024 * 1024]


@dataclass(frozen=True)
class SplitStep:
    """Decode at one tensor-parallel size and batch: medians over the decode steps (seconds)."""

    num_ranks: int
    batch_size: int
    tpot_s: float
    forward_s: float  # the forward pass of a decode step, collectives included
    comm_s: float  # of forward_s, rank 0's time in collectives
    collectives_per_step: float
    bytes_per_step: float  # weights and KV a step reads, all ranks together (``flops_bytes.decode_work``)
    kv_bytes_per_step: float  # of bytes_per_step, the KV cache's (read and written)

    @property
    def compute_s(self) -> float:
        """The forward pass less its collectives: reading weights and computing."""
        return self.forward_s - self.comm_s


@dataclass(frozen=True)
class ModelledStep:
    """The paper model's step at ``num_ranks`` and ``batch_size``, under one ``reading`` of what p
    ranks have: "own memory" (p times the bandwidth) or "one shared bus" (the same, split)."""

    reading: str
    num_ranks: int
    batch_size: int
    step: TensorParallelStep


@dataclass
class TensorParallelRun:
    """What ``measure_tensor_parallel`` measured, and the paper model fed with it."""

    steps: list[SplitStep]
    sizes_bytes: list[int] = field(default_factory=list)
    all_reduce_s: list[float] = field(default_factory=list)  # median of each size
    all_reduce_p25_s: list[float] = field(default_factory=list)  # 25th percentile of each size: the fit's
    link: Link | None = None  # fitted to the sweep
    hop_latency_s: float | None = None
    modelled: list[ModelledStep] = field(default_factory=list)

    def step(self, num_ranks: int, batch_size: int) -> SplitStep:
        return next(s for s in self.steps if (s.num_ranks, s.batch_size) == (num_ranks, batch_size))

    def modelled_step(self, reading: str, num_ranks: int, batch_size: int) -> TensorParallelStep:
        return next(
            m.step for m in self.modelled if (m.reading, m.num_ranks, m.batch_size) == (reading, num_ranks, batch_size)
        )

    @classmethod
    def from_dict(cls, d: dict) -> TensorParallelRun:
        """The run back from ``dataclasses.asdict`` (a notebook's cached JSON)."""
        return cls(
            steps=[SplitStep(**s) for s in d["steps"]],
            sizes_bytes=d["sizes_bytes"],
            all_reduce_s=d["all_reduce_s"],
            all_reduce_p25_s=d["all_reduce_p25_s"],
            link=Link(**d["link"]) if d["link"] else None,
            hop_latency_s=d["hop_latency_s"],
            modelled=[ModelledStep(**{**m, "step": TensorParallelStep(**m["step"])}) for m in d["modelled"]],
        )


def decode_steps(engine: LLMEngine, batch_size: int, prompt_len: int, output_tokens: int) -> SplitStep:
    """Decode ``batch_size`` prompts of ``prompt_len`` tokens together for ``output_tokens`` tokens
    (after an untimed warm-up of the same shape); medians over the decode-only steps."""
    prompts = text_prompts(engine.tokenizer, prompt_len, batch_size)
    warm_up(engine, prompts)
    first, tp = len(engine.step_records), getattr(engine.model, "tp", None)  # None: one rank's whole model
    collectives_before = tp.num_collectives if tp else 0
    tpot_s, decodes = minieng_decode(engine, prompts, output_tokens)
    num_steps = len(engine.step_records) - first  # the prompts' steps too: each runs as many collectives
    context = prompt_len + output_tokens // 2
    work = decode_work(engine.model_config, batch_size, context, engine.dtype.itemsize)
    return SplitStep(
        num_ranks=engine.config.tensor_parallel_size,
        batch_size=batch_size,
        tpot_s=tpot_s,
        forward_s=statistics.median(r.forward_s for r in decodes),
        comm_s=statistics.median(r.comm_s for r in decodes),
        collectives_per_step=(tp.num_collectives - collectives_before) / num_steps if tp else 0.0,
        bytes_per_step=work.total_bytes,
        kv_bytes_per_step=work.kv_read_bytes + work.kv_write_bytes,
    )


def measure_tensor_parallel(
    num_ranks: int = 2,
    batch_sizes: tuple[int, ...] = (1, 8),
    prompt_len: int = 64,
    output_tokens: int = 32,
    sizes_bytes: list[int] | None = None,
    repeats: int = 50,
    progress=None,
    **engine_args,
) -> TensorParallelRun:
    """Decode at ``tensor_parallel_size`` 1 and ``num_ranks`` on this machine, the all-reduce swept
    at ``num_ranks``, and the paper model fed the measured bandwidth and link.

    ``engine_args`` go to both engines (``model``, ``device``, ``load_format``, ...). Raises what
    ``LLMEngine`` raises for a size the model or the machine cannot split.
    """
    sizes_bytes = sizes_bytes or ALL_REDUCE_SIZES
    engine_args = {
        "enable_prefix_caching": False,
        "max_num_seqs": max(batch_sizes),
        "kv_cache_memory_gib": None if "num_kv_blocks" in engine_args else 1.0,
        **engine_args,
    }
    run = TensorParallelRun(steps=[])
    for p in (1, num_ranks):
        if progress:
            progress(f"tensor parallel: decode at p = {p}")
        with LLMEngine(tensor_parallel_size=p, **engine_args) as engine:
            run.steps += [decode_steps(engine, b, prompt_len, output_tokens) for b in batch_sizes]
            if p > 1:
                run.sizes_bytes = sizes_bytes
                samples = engine.workers.time_all_reduce(sizes_bytes, repeats, engine.dtype)
                run.all_reduce_s = [float(np.median(t)) for t in samples]
                run.all_reduce_p25_s = [float(np.percentile(t, 25)) for t in samples]
                run.link, run.hop_latency_s = fit_link(
                    sizes_bytes, run.all_reduce_p25_s, p, f"{engine.device.type} link"
                )
            config, dtype_bytes = engine.model_config, engine.dtype.itemsize
    for b in batch_sizes:
        one = run.step(1, b)
        bandwidth_gbps = one.bytes_per_step / one.compute_s / 1e9  # what one rank read at, measured
        shape = dict(
            weight_bytes=one.bytes_per_step - one.kv_bytes_per_step,
            kv_bytes=one.kv_bytes_per_step,
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            batch_size=b,
            activation_bytes=dtype_bytes,
            link=run.link,
            latency_s=run.hop_latency_s or 0.0,
        )
        for reading, per_rank_gbps in (("own memory", bandwidth_gbps), ("one shared bus", bandwidth_gbps / num_ranks)):
            step = tensor_parallel_decode(num_devices=num_ranks, bandwidth_gbps=per_rank_gbps, **shape)
            run.modelled.append(ModelledStep(reading, num_ranks, b, step))
    return run


def format_tensor_parallel(run: TensorParallelRun) -> str:
    """The measured steps, the all-reduce sweep and fit, and the model beside the measurement (ms)."""
    lines = [
        "decode step, measured (medians; ms)",
        f"{'p':>3} {'batch':>5} {'TPOT':>8} {'forward':>8} {'compute':>8} {'all-reduce':>10} {'collectives':>11}",
    ]
    for s in run.steps:
        lines.append(
            f"{s.num_ranks:>3} {s.batch_size:>5} {s.tpot_s * 1e3:>8.2f} {s.forward_s * 1e3:>8.2f} "
            f"{s.compute_s * 1e3:>8.2f} {s.comm_s * 1e3:>10.2f} {s.collectives_per_step:>11.0f}"
        )
    if run.all_reduce_s:
        lines += [
            "",
            "all-reduce on the engine's group (us per call)",
            f"  {'bytes':>9}  {'median':>8}  {'25th pct':>8}",
        ]
        lines += [
            f"  {n:>9,}  {t * 1e6:>8.1f}  {q * 1e6:>8.1f}"
            for n, t, q in zip(run.sizes_bytes, run.all_reduce_s, run.all_reduce_p25_s)
        ]
        lines.append(
            f"  ring model fitted to the 25th percentiles: {run.hop_latency_s * 1e6:.1f} us per hop, "
            f"{run.link.bandwidth_gbps:.2f} GB/s per link"
        )
    if run.modelled:
        lines += ["", "paper model fed the measured bandwidth and link, against the measured forward pass (ms)"]
        for m in run.modelled:
            measured = run.step(m.num_ranks, m.batch_size).forward_s
            lines.append(
                f"  p={m.num_ranks} batch={m.batch_size:<3} {m.reading:<15} modelled {m.step.step_s * 1e3:7.2f} "
                f"(read {m.step.read_s * 1e3:.2f} + link {m.step.link_s * 1e3:.2f})   measured {measured * 1e3:7.2f}"
            )
    return "\n".join(lines)
