"""The bench's figures as PNG files (``python -m minieng bench --plot DIR``): the roofline with the
sweeps' points, and, when those runs were made, the serving run's latency CDFs, step timeline and
NVML trace, the speculative, prefix-cache and quantization sweeps. The drawing is done by
``phases``, ``levers`` and ``serving``; this module only picks the figures and writes the files."""

from __future__ import annotations

from pathlib import Path

from minieng.measure.metrics import request_metrics
from minieng.measure.peaks import Peak
from minieng.measure.roofline import phase_utilization
from minieng.viz.levers import speculative_sweep, ttft_vs_hit_rate_figure
from minieng.viz.phases import quantization_ratios, roofline, utilization_trace
from minieng.viz.serving import latency_cdfs, step_timeline


def save_figures(result: dict, directory: str, engine, run=None) -> list[str]:
    """Write the bench's figures as PNG files into ``directory``; return their paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    figures = {}
    peaks = [Peak.from_dict(p) for p in result["peaks"]]
    points = [
        (
            f"prefill {r['prompt_tokens']}",
            r["utilization"]["arithmetic_intensity_flop_per_byte"],
            r["utilization"]["achieved_tflops"] * 1e12,
        )
        for r in result["prefill"]
    ]
    points += [
        (
            f"decode b{r['batch_size']}",
            r["utilization"]["arithmetic_intensity_flop_per_byte"],
            r["utilization"]["achieved_tflops"] * 1e12,
        )
        for r in result["decode"]
    ]
    if points:
        figures["roofline"] = roofline(
            peaks, points, title=f"Roofline: minieng on {result['environment']['device_name']}"
        )
    serving = result.get("serving")
    if serving and run is not None:
        ms = [request_metrics(o) for o in run.outputs]
        slo = serving["metrics"].get("slo") or {}
        figures["latency_cdf"] = latency_cdfs(
            {
                "TTFT": [m.ttft_s * 1e3 for m in ms if m.ttft_s is not None],
                "TPOT": [m.tpot_s * 1e3 for m in ms if m.tpot_s is not None],
                "ITL": [g * 1e3 for m in ms for g in m.itl_s],
            },
            {k: slo[f"{k.lower()}_ms"] for k in ("TTFT", "TPOT") if slo.get(f"{k.lower()}_ms")},
        )
        itl_points = [
            (t, (t - prev) * 1e3)
            for o in run.outputs
            for (prev, _), (t, _) in zip(o.times.emissions, o.times.emissions[1:])
        ]
        figures["step_timeline"] = step_timeline(run.steps, run.start_s, itl_points)
        if run.telemetry:
            nvml_t = [s.time_s - run.start_s for s in run.telemetry]
            dtype_bytes = engine.dtype.itemsize
            mfu = [
                phase_utilization(engine.model_config, dtype_bytes, [s], peaks[:1])[peaks[0].source]["mfu_percent"]
                for s in run.steps
            ]
            figures["utilization"] = utilization_trace(
                {
                    "util.gpu %": (nvml_t, [s.util_gpu_percent for s in run.telemetry]),
                    "SM occupancy % (GPM)": (nvml_t, [s.sm_occupancy_percent for s in run.telemetry]),
                    "DRAM bandwidth % (GPM)": (nvml_t, [s.dram_bw_util_percent for s in run.telemetry]),
                    f"MFU % per step ({peaks[0].source} peak)": ([s.start_s - run.start_s for s in run.steps], mfu),
                },
                title="What NVML reports against what the steps achieved",
            )
    if result.get("speculative"):
        figures["speculative"] = speculative_sweep(result["speculative"])
    if result.get("prefix_cache"):
        figures["ttft_vs_hit_rate"] = ttft_vs_hit_rate_figure(result["prefix_cache"])
    if result.get("quantization"):
        figures["quantization"] = quantization_ratios(result["quantization"])
    paths = []
    for name, fig in figures.items():
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        paths.append(str(path))
    return paths
