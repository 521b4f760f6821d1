"""The instruments: timing (``harness``), peaks and ceilings, NVML, FLOPs and bytes of a step (``work``),
MFU/MBU and the roofline, napkin math (a shape's floors on a device), serving metrics, workloads, sweep
planning and the tensor-parallel paper model. They read the engine's records (``StepRecord``, ``RequestOutput``) as data; none builds or steps
an engine. The names below are what the notebooks use.
"""

from minieng.measure.ceilings import machine_ceilings
from minieng.measure.flops_bytes import (
    attention_crossover_tokens,
    decode_ridge_batch,
    decode_work,
    prefill_work,
    step_work,
)
from minieng.measure.energy import EnergyMeter, EnergyReading, energy_source
from minieng.measure.harness import smoke_mode
from minieng.measure.logged_throughput import LoggedStats, logged_intervals
from minieng.measure.metrics import (
    SLO,
    common_tail,
    labeled_percentile,
    percentile_label,
    request_metrics,
    serving_metrics,
    summarize_ms,
    tail_text,
)
from minieng.measure.model_choice import ModelChoice, choose_model
from minieng.measure.napkin import DeviceSpec, NapkinEstimate, datasheet_devices, napkin_estimate
from minieng.measure.speculative_pair import PairChoice, choose_pair
from minieng.measure.nvml import TelemetrySampler, nvml_status, summarize
from minieng.measure.peaks import Peak, check_environment, datasheet_peak
from minieng.measure.projection import (
    datasheet_peaks,
    phase_projection_reading,
    project_decode_mfu,
    project_phase_times,
)
from minieng.measure.roofline import (
    attainable_flops,
    format_percent,
    phase_ratio_floor,
    phase_utilization,
    roofline_bound,
    tpot_floor_s,
)
from minieng.measure.sweep_plan import (
    decode_sweep_batches,
    fit_ttft,
    kv_sweep_plan,
    predict_decode_step_s,
    predict_ttft_s,
    prefill_batch_length,
    prefill_sweep_lengths,
)
from minieng.measure.tp_estimate import LINKS, fit_link, tensor_parallel_decode
from minieng.measure.workloads import (
    poisson_workload,
    read_trace,
    sampled_trace_workload,
    scale_workload,
    spread_output_lengths,
    text_prompts,
    workload_prompts,
)

__all__ = [
    "attainable_flops",
    "attention_crossover_tokens",
    "check_environment",
    "datasheet_devices",
    "datasheet_peaks",
    "choose_model",
    "choose_pair",
    "common_tail",
    "datasheet_peak",
    "decode_ridge_batch",
    "decode_sweep_batches",
    "decode_work",
    "EnergyMeter",
    "EnergyReading",
    "energy_source",
    "DeviceSpec",
    "fit_ttft",
    "format_percent",
    "kv_sweep_plan",
    "labeled_percentile",
    "tail_text",
    "LINKS",
    "logged_intervals",
    "LoggedStats",
    "machine_ceilings",
    "ModelChoice",
    "napkin_estimate",
    "NapkinEstimate",
    "nvml_status",
    "PairChoice",
    "Peak",
    "percentile_label",
    "phase_projection_reading",
    "phase_ratio_floor",
    "phase_utilization",
    "poisson_workload",
    "predict_decode_step_s",
    "predict_ttft_s",
    "prefill_batch_length",
    "prefill_sweep_lengths",
    "project_decode_mfu",
    "project_phase_times",
    "prefill_work",
    "read_trace",
    "request_metrics",
    "roofline_bound",
    "sampled_trace_workload",
    "scale_workload",
    "serving_metrics",
    "SLO",
    "smoke_mode",
    "spread_output_lengths",
    "step_work",
    "summarize",
    "summarize_ms",
    "TelemetrySampler",
    "tensor_parallel_decode",
    "fit_link",
    "text_prompts",
    "tpot_floor_s",
    "workload_prompts",
]
