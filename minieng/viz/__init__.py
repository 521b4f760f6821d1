"""The course's figures (matplotlib), split by the course's arc: the two phases (``phases``), the KV cache
and batching (``batching``), the scheduling levers (``levers``), serving (``serving``). Each returns a ``Figure``; notebooks display it, the bench saves it
(``bench_figures``, ``--plot DIR``).
"""

from minieng.viz.batching import (
    batch_scaling,
    batching_timeline,
    block_tables,
    compared_cdfs,
    kv_concurrency,
    recompute_vs_cache_figure,
)
from minieng.viz.levers import (
    chunked_itl_traces,
    chunked_prefill_tradeoff,
    speculative_sweep,
    ttft_vs_hit_rate_figure,
)
from minieng.viz.logged_ratio import logged_ratio_figure
from minieng.viz.phases import (
    curve,
    decode_bytes_and_tpot,
    decode_mfu_projection,
    phase_costs,
    quantization_ratios,
    roofline,
    top_ops_figure,
    utilization_trace,
)
from minieng.viz.primer import forward_pass_diagram, two_phases_diagram
from minieng.viz.serving import goodput_sweep, latency_cdfs, request_phases, step_timeline

__all__ = [
    "batch_scaling",
    "batching_timeline",
    "block_tables",
    "chunked_itl_traces",
    "chunked_prefill_tradeoff",
    "compared_cdfs",
    "curve",
    "decode_bytes_and_tpot",
    "decode_mfu_projection",
    "forward_pass_diagram",
    "goodput_sweep",
    "kv_concurrency",
    "latency_cdfs",
    "logged_ratio_figure",
    "phase_costs",
    "quantization_ratios",
    "recompute_vs_cache_figure",
    "request_phases",
    "roofline",
    "speculative_sweep",
    "step_timeline",
    "top_ops_figure",
    "two_phases_diagram",
    "ttft_vs_hit_rate_figure",
    "utilization_trace",
]
