"""One module per lesson's experiment: each drives engines, measures with ``measure`` and formats its own
tables. What the notebooks and ``python -m minieng bench`` run; the names below are what the notebooks use.
"""

from minieng.lab.batching import (
    batch_sweep,
    compare_batching,
    compute_bound_batch,
    decode_point,
    format_batch_sweep,
    limiting_factor,
    near_linear_batch,
    sustainable_rate,
)
from minieng.lab.bench import estimate_s, minieng_decode, minieng_prefill, probe_speed
from minieng.lab.chunked_prefill import (
    budget_for,
    budget_sweep,
    choice_in_words,
    choose_long_prompt,
    estimate_sweep_s,
    long_prompt_run,
    predict_prefill_s,
    read_result,
    s7_verdict,
)
from minieng.lab.disaggregation import compare_disaggregation, estimate_comparison_s, format_comparison
from minieng.lab.goodput import batch_cap_sweep, format_sweep
from minieng.lab.gpu_utilization import (
    decode_for,
    decode_ops,
    decode_utilization,
    format_utilization,
    profile_decode,
    trace_series,
    utilization_rows,
)
from minieng.lab.kv_cache_lab import (
    concurrency_run,
    live_block_tables,
    recompute_budget_tokens,
    recompute_estimate_s,
    recompute_vs_cache,
    sequences_that_fit,
)
from minieng.lab.prefix_caching import measure_point, multi_turn, ttft_vs_hit_rate
from minieng.lab.quant_quality import activation_outliers, quality, reference_sequences
from minieng.lab.quantization_lab import (
    QuantBenchConfig,
    device_schemes,
    format_predicted,
    layer_decode_times,
    predicted_table,
    run_quantization,
)
from minieng.lab.report import format_quantization
from minieng.lab.speculative import break_even_acceptance, k_sweep, run_k, speculative_batch_sweep
from minieng.lab.tensor_parallel import TensorParallelRun, format_tensor_parallel, measure_tensor_parallel
from minieng.lab.work_tables import format_kv_bytes, format_prefill_work, format_step_work
from minieng.lab.model_for_device import CourseModel, course_model, downloads_allowed

__all__ = [
    "activation_outliers",
    "batch_cap_sweep",
    "batch_sweep",
    "break_even_acceptance",
    "budget_for",
    "budget_sweep",
    "choice_in_words",
    "choose_long_prompt",
    "compare_batching",
    "compare_disaggregation",
    "compute_bound_batch",
    "concurrency_run",
    "course_model",
    "CourseModel",
    "decode_for",
    "decode_ops",
    "decode_point",
    "decode_utilization",
    "downloads_allowed",
    "device_schemes",
    "estimate_comparison_s",
    "estimate_s",
    "estimate_sweep_s",
    "format_batch_sweep",
    "format_comparison",
    "format_kv_bytes",
    "format_predicted",
    "format_prefill_work",
    "format_quantization",
    "format_step_work",
    "format_sweep",
    "format_tensor_parallel",
    "format_utilization",
    "k_sweep",
    "layer_decode_times",
    "limiting_factor",
    "live_block_tables",
    "long_prompt_run",
    "measure_point",
    "measure_tensor_parallel",
    "minieng_decode",
    "minieng_prefill",
    "multi_turn",
    "near_linear_batch",
    "predict_prefill_s",
    "predicted_table",
    "probe_speed",
    "profile_decode",
    "quality",
    "QuantBenchConfig",
    "read_result",
    "recompute_budget_tokens",
    "recompute_estimate_s",
    "recompute_vs_cache",
    "reference_sequences",
    "run_k",
    "run_quantization",
    "s7_verdict",
    "sequences_that_fit",
    "speculative_batch_sweep",
    "sustainable_rate",
    "TensorParallelRun",
    "trace_series",
    "ttft_vs_hit_rate",
    "utilization_rows",
]
