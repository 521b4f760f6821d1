"""Every figure renders headless to PNG, with realistic inputs and the awkward ones (N/A, empty)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from matplotlib.figure import Figure

from minieng import viz
from minieng.core.outputs import StepRecord
from minieng.measure.peaks import Peak

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MEASURED = Peak("measured cpu float32", 0.15, 11.0, "measured")
SHEET = Peak("H200", 989, 4800, "datasheet")


def png(fig: Figure) -> bytes:
    assert isinstance(fig, Figure)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50)
    data = buf.getvalue()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
    return data


def labels(fig: Figure) -> list[tuple[str, str]]:
    return [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes]


def test_roofline():
    points = [
        ("prefill 512", 180.0, 0.09e12),
        ("decode b1", 1.0, 0.006e12),
        ("decode b32", 30.0, 0.05e12),
        ("other", 5.0, 0.01e12),
    ]
    fig = viz.roofline([MEASURED, SHEET], points, title="Roofline test")
    png(fig)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "FLOP/byte" in ax.get_xlabel() and "FLOP/s" in ax.get_ylabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("datasheet" in t and "ridge" in t for t in legend)
    assert any("measured" in t for t in legend)
    # The x range covers every point and every ridge.
    lo, hi = ax.get_xlim()
    assert lo < 1.0 and hi > SHEET.ridge_flop_per_byte


def test_roofline_without_points():
    png(viz.roofline([MEASURED], []))


def test_latency_cdfs_with_an_empty_series_and_slos():
    series = {"TTFT": [120.0, 95.0, 300.0, 101.0], "TPOT": [], "ITL": list(np.linspace(20, 60, 50))}
    fig = viz.latency_cdfs(series, {"TTFT": 250.0, "TPOT": 50.0})
    png(fig)
    assert [x for x, _ in labels(fig)] == ["TTFT (ms)", "TPOT (ms)", "ITL (ms)"]
    assert labels(fig)[2][1] == "fraction of gaps"
    ttft_ax = fig.axes[0]
    legend = [t.get_text() for t in ttft_ax.get_legend().get_texts()]
    assert any(t.startswith("SLO 250") for t in legend) and "max of 4: 300 ms" in legend  # 4 values: no P99
    assert not any(t.startswith("P99") for t in legend) and any(t.startswith("P50") for t in legend)


def test_latency_cdfs_of_nothing():
    """A figure that draws nothing asks for no legend (matplotlib would warn "No artists with labels")."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fig in (viz.latency_cdfs({}), viz.latency_cdfs({"TTFT": []})):
            png(fig)
            assert all(ax.get_legend() is None for ax in fig.axes)


def _steps(start: float) -> list[StepRecord]:
    steps, t = [], start
    for i in range(12):
        prefill = 256 if i in (0, 5) else 0
        dur = 0.05 if prefill else 0.02
        steps.append(StepRecord(t, dur, prefill, int(prefill > 0), min(i, 4), 0, 4, 0, 10))
        t += dur
    return steps


def test_step_timeline():
    start = 1000.0
    steps = _steps(start)
    itl = [(s.start_s + s.duration_s, 1e3 * s.duration_s) for s in steps[1:]]
    fig = viz.step_timeline(steps, start, itl)
    png(fig)
    text = " ".join(x + " " + y for x, y in labels(fig))
    assert "time since start (s)" in text and "ms" in text and "tokens / step" in text
    png(viz.step_timeline(steps, start))  # no ITL points


def test_utilization_trace_leaves_na_as_gaps():
    nvml_t = [0.0, 0.1, 0.2, 0.3]
    step_t = [0.02, 0.05, 0.21]  # per-step MFU on its own time base
    fig = viz.utilization_trace(
        {
            "util.gpu %": (nvml_t, [0, 95, 100, 98]),
            "SM occupancy % (GPM)": (nvml_t, [None] * 4),
            "DRAM bandwidth % (GPM)": (nvml_t, [10.0, None, 30.0, 20.0]),
            "MFU % per step (measured peak)": (step_t, [0.4, 0.7, 0.5]),
        }
    )
    png(fig)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time since start (s)" and ax.get_ylabel() == "percent"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert np.isnan(np.asarray(lines["SM occupancy % (GPM)"].get_ydata(), dtype=float)).all()  # N/A, never 0
    dram = np.asarray(lines["DRAM bandwidth % (GPM)"].get_ydata(), dtype=float)
    assert np.isnan(dram[1]) and dram[0] == 10.0
    assert list(lines["MFU % per step (measured peak)"].get_xdata()) == step_t


def test_utilization_trace_of_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = viz.utilization_trace({})
        png(fig)
    assert fig.axes[0].get_legend() is None


def test_curve():
    fig = viz.curve(
        [32, 128, 512],
        {"minieng": [10.0, 30.0, 90.0], "transformers": [12.0, 40.0, 150.0]},
        "prompt tokens",
        "TTFT (ms)",
        "TTFT vs prompt",
        logx=True,
    )
    png(fig)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "linear"
    assert ax.get_ylabel() == "TTFT (ms)"
    assert len(ax.get_lines()) == 2


def test_phase_costs():
    fig = viz.phase_costs([16, 64, 256], [20.0, 55.0, 210.0], [8, 32, 128], [200.0, 800.0, 3200.0])
    png(fig)
    assert labels(fig) == [("prompt tokens", "TTFT (ms)"), ("output tokens", "decode time, E2EL - TTFT (ms)")]


def test_ttft_vs_hit_rate():
    point = lambda shared, hit, p50: {  # noqa: E731
        "shared_tokens": shared,
        "user_tokens": 1024 - shared,
        "hit_rate": hit,
        "ttft_ms": {"p50": p50, "p99": p50 * 1.1, "max": p50 * 1.2, "count": 8},
        "cache": True,
    }
    result = {
        "prompt_tokens": 1024,
        "block_size": 16,
        "cold": point(0, 0.0, 1100.0),
        "points": [point(0, 0.0, 1100.0), point(512, 0.5, 650.0), point(928, 0.906, 170.0)],
        "article_points": [{"hit_rate": 0.97, "ttft_s": 0.87}, {"hit_rate": 0.855, "ttft_s": 1.72}],
    }
    fig = viz.ttft_vs_hit_rate_figure(result)
    png(fig)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "prefix cache hit rate (% of prompt tokens)" and "TTFT (ms)" in ax.get_ylabel()
    assert fig.axes[1].get_ylabel() == "article's TTFT (s)"
    tail = next(line for line in ax.get_lines() if line.get_label() == "max of 8 TTFT")  # 8 requests: no P99
    assert list(tail.get_ydata()) == pytest.approx([1100.0 * 1.2, 650.0 * 1.2, 170.0 * 1.2])
    labels = [line.get_label() for line in ax.get_lines()]
    assert "nothing shared: 1100 ms" in labels  # an endpoint's cold point: its cache was on
    result["cold"] = {**result["cold"], "cache": False}  # the engine's: its cache switched off
    labels = [line.get_label() for line in viz.ttft_vs_hit_rate_figure(result).axes[0].get_lines()]
    assert "cache off: 1100 ms" in labels


def test_speculative_sweep():
    rows = [
        {
            "k": k,
            "tokens_per_step": 1 + 0.6 * k,
            "expected_tokens_per_step": 1 + 0.5 * k,
            "measured_speedup_x": 0.9,
            "predicted_speedup_x": 0.8,
        }
        for k in (1, 2, 4)
    ]
    fig = viz.speculative_sweep({"rows": rows, "drafter": "test"})
    png(fig)
    assert labels(fig) == [
        ("draft tokens per step, k", "tokens per verification step"),
        ("draft tokens per step, k", "speedup over plain decoding (x)"),
    ]


def test_top_ops_figure_draws_a_bar_per_op():
    from minieng.lab.gpu_utilization import op_shares

    s = op_shares({"aten::addmm": 500.0, "aten::add": 50.0}, wall_us=1000.0)
    fig = viz.top_ops_figure(s)
    png(fig)
    assert len(fig.axes[0].patches) == 3 and "50.0%" in fig.axes[0].get_title()


def test_request_phases_draws_each_phase_that_happened():
    none = dict.fromkeys(["transfer_ready_s", "transfer_start_s", "transfer_end_s", "decode_admitted_s"])
    handed_off = {
        "arrival_s": 0.0,
        "first_scheduled_s": 0.1,
        "first_token_s": 0.3,
        "last_token_s": 1.0,
        "transfer_ready_s": 0.3,
        "transfer_start_s": 0.35,
        "transfer_end_s": 0.4,
        "decode_admitted_s": 0.5,
    }
    colocated = {"arrival_s": 0.2, "first_scheduled_s": 0.2, "first_token_s": 0.6, "last_token_s": 0.9, **none}
    one_token = {"arrival_s": 0.3, "first_scheduled_s": 0.4, "first_token_s": 0.5, "last_token_s": 0.5, **none}
    fig = viz.request_phases([colocated, handed_off, one_token])
    png(fig)
    ax = fig.axes[0]
    # waiting x2 (the colocated one starts at once), prefill x3, link wait, transfer, decode wait, decode x2
    assert len(ax.patches) == 2 + 3 + 1 + 1 + 1 + 2
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "waiting",
        "prefill",
        "link wait",
        "KV transfer",
        "decode wait",
        "decode",
    ]
    assert ax.get_xlabel() == "time since the first arrival (s)"
    png(viz.request_phases([]))


def test_decode_bytes_and_tpot_stacks_kv_on_the_weights():
    rows = [
        {
            "context_tokens": c,
            "weight_bytes": 538e6,
            "kv_bytes": c * 46080.0,
            "tpot_s": 0.03 + c * 1e-5,
            "floor_s": (538e6 + c * 46080) / 15e9,
        }
        for c in (4096, 16, 1024)
    ]
    fig = viz.decode_bytes_and_tpot(rows)
    png(fig)
    assert labels(fig) == [
        ("context tokens per sequence", "MB read per decode step"),
        ("context tokens per sequence", "ms per decode step"),
    ]
    left = fig.axes[0]
    assert len(left.patches) == 6 and [t.get_text() for t in left.get_xticklabels()] == ["16", "1,024", "4,096"]


def test_decode_mfu_projection_names_each_device_and_marks_the_reader():
    from minieng.measure.projection import project_decode_mfu

    rows = project_decode_mfu(55.0, 1.0)
    fig = viz.decode_mfu_projection(rows, reader=("this H200", 989.0, 0.8))
    png(fig)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and "peak FLOP/s" in ax.get_xlabel() and "MFU" in ax.get_ylabel()
    names = {t.get_text() for t in ax.texts}
    assert {r["device"] for r in rows} <= names and "this H200" in names
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("projected" in t for t in legend) and any("measured" in t for t in legend)
    # The reader's point sits at its measured MFU, not on the projection.
    star = ax.collections[-1].get_offsets()
    assert tuple(star[0]) == (989.0, 0.8)
    png(viz.decode_mfu_projection(rows))  # nothing measured to mark


def test_recompute_vs_cache():
    side = lambda waits, run: {  # noqa: E731
        "token_s": waits,
        "tokens_run": run,
        "flops": [2.0 * r for r in run],
        "token_ids": [1] * len(run),
    }
    result = {
        "prompt_tokens": 16,
        "cache": side([0.05, 0.01, 0.01], [16, 1, 1]),
        "recompute": side([0.05, 0.06, 0.07], [16, 17, 18]),
    }
    fig = viz.recompute_vs_cache_figure(result, knee_tokens=17)
    png(fig)
    assert labels(fig) == [
        ("tokens in the sequence", "wait for this token (ms)"),
        ("answer length (tokens)", "time to generate it (s)"),
        ("answer length (tokens)", "token-passes through the model"),
    ]
    assert fig.axes[2].get_lines()[0].get_ydata().tolist() == [16, 33, 51]  # cumulative work, recompute


def test_block_tables_colour_held_blocks_and_list_each_table():
    snap = {
        "block_size": 4,
        "num_blocks": 10,
        "num_free_blocks": 4,
        "waiting": [],
        "sequences": [
            {"request_id": "0", "num_tokens": 9, "num_computed_tokens": 8, "block_table": [0, 1, 7]},
            {"request_id": "3", "num_tokens": 12, "num_computed_tokens": 11, "block_table": [4, 2, 9]},
        ],
    }
    fig = viz.block_tables(snap, columns=5)
    png(fig)
    pool, tables = fig.axes
    assert len(pool.patches) == 10 and len(tables.patches) == 6
    free = [p for p in pool.patches if p.get_facecolor()[:3] == (1.0, 1.0, 1.0)]
    assert len(free) == 4
    assert [p.get_hatch() for p in tables.patches] == [
        None,
        None,
        "//",
        None,
        None,
        None,
    ]  # 9 tokens: a partial last block
    texts = [t.get_text() for t in tables.texts]
    assert "request 3: 12 tokens" in texts and "9" in texts


def test_block_tables_of_an_idle_pool():
    png(viz.block_tables({"block_size": 16, "num_blocks": 3, "num_free_blocks": 3, "sequences": [], "waiting": []}))


def test_kv_concurrency():
    result = {
        "running": [6, 4, 4, 3],
        "used_blocks": [12, 12, 11, 6],
        "preempted": [0, 2, 0, 0],
        "num_blocks": 12,
        "block_size": 4,
        "max_num_seqs": 8,
        "prompt_tokens": 8,
        "output_tokens": 8,
        "cap_at_prompt": 6,
        "cap_at_full_length": 3,
    }
    fig = viz.kv_concurrency(result)
    png(fig)
    assert labels(fig)[0] == ("step", "sequences")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "max_num_seqs: 8" in legend and "preemption" in legend and any("16-token" in t for t in legend)
    fig = viz.kv_concurrency(result | {"max_num_seqs": 64})
    png(fig)
    assert "max_num_seqs = 64, off the chart" in fig.axes[0].get_title()
    assert fig.axes[0].get_ylim()[1] < 64


def test_batch_scaling_marks_only_what_is_in_reach():
    rows = [
        {"batch_size": b, "tpot_s": 0.04 * (1 + b / 16), "tok_s": b / (0.04 * (1 + b / 16))} for b in (1, 2, 4, 8, 16)
    ]
    fig = viz.batch_scaling(rows, knee_batch=8, compute_bound_batch=None, pool_batch=4096)
    png(fig)
    left, right = fig.axes
    assert left.get_ylabel() == "aggregate decode tok/s" and right.get_ylabel() == "TPOT (ms)"
    legend = [t.get_text() for t in left.get_legend().get_texts()]
    assert "tok/s stops growing (8)" in legend and not any("KV pool" in t or "roofline" in t for t in legend)


def test_batching_timeline_and_compared_cdfs():
    runs = {
        "static": {
            "steps": [[0.0, 0.1, 3], [0.1, 0.1, 1]],
            "ttft_ms": [10.0, 50.0],
            "tpot_ms": [5.0],
            "e2el_ms": [100.0, 200.0],
        },
        "continuous": {
            "steps": [[0.0, 0.1, 3], [0.1, 0.1, 3]],
            "ttft_ms": [10.0, 12.0],
            "tpot_ms": [],
            "e2el_ms": [90.0, 95.0],
        },
    }
    fig = viz.batching_timeline(runs)
    png(fig)
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["static", "continuous"]
    fig = viz.compared_cdfs(runs)
    png(fig)
    assert [x for x, _ in labels(fig)] == ["TTFT (ms)", "TPOT (ms)", "E2EL (ms)"]
    ttft_legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "max of 2: 50 ms" in ttft_legend and not any("P99" in t for t in ttft_legend)  # 2 values: no P99


def test_quantization_ratios_draws_measured_bars_and_predicted_marks():
    row = lambda s, t, d: {  # noqa: E731
        "scheme": s,
        "ttft_ratio": t,
        "ttft_ratio_predicted": 1.0,
        "tpot_b1_ratio": d,
        "tpot_b1_ratio_predicted": 0.26,
        "tpot_b16_ratio": d,
        "tpot_b16_ratio_predicted": 0.3,
    }
    result = {
        "config": {"batch_sizes": [1, 16], "prompt_tokens": 512},
        "rows": [row("none", 1.0, 1.0), row("int8", 0.8, 0.43), row("w8a8", 0.5, 0.38)],
    }
    fig = viz.quantization_ratios(result)
    png(fig)
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * 3  # two schemes (the float row is the baseline) x three phases
    assert [t.get_text() for t in ax.get_xticklabels()] == ["int8", "w8a8"]
    assert ax.get_ylabel() == "time / float model's time"


def _chunked_run(budget, worst, ttft):
    return {
        "budget_tokens": budget,
        "worst_itl_ms": worst,
        "ttft_ms": ttft,
        "baseline_itl_ms": 40.0,
        "long_prompt_tokens": 640,
        "traces": [[[-0.08, 40.0], [-0.04, 41.0], [1.3, worst], [1.34, 40.0]]] * 3,
    }


def test_chunked_itl_traces_one_panel_per_run():
    fig = viz.chunked_itl_traces([_chunked_run(None, 1300.0, 1250.0), _chunked_run(96, 220.0, 1500.0)])
    png(fig)
    assert len(fig.axes) == 2 and labels(fig)[-1] == ("time since the long prompt arrived (s)", "ITL (ms)")
    assert fig.axes[0].get_title().startswith("chunking off") and "budget 96 tokens" in fig.axes[1].get_title()
    png(viz.chunked_itl_traces([_chunked_run(None, 1.0, 1.0) | {"traces": [[]]}]))  # a decoder with no gap


def test_chunked_prefill_tradeoff():
    sweep = {
        "long_prompt_tokens": 640,
        "num_decoders": 4,
        "off": _chunked_run(None, 1300.0, 1250.0),
        "on": [_chunked_run(b, 100.0 + b, 1250.0 + 4000 / b) for b in (32, 64, 128)],
    }
    fig = viz.chunked_prefill_tradeoff(sweep)
    png(fig)
    assert [x for x, _ in labels(fig)] == ["token budget per step, max_num_batched_tokens"] * 2
    assert fig.axes[0].get_xscale() == "log" and [t.get_text() for t in fig.axes[0].get_xticklabels()] == [
        "32",
        "64",
        "128",
    ]


FIGURES = [
    "roofline",
    "latency_cdfs",
    "step_timeline",
    "request_phases",
    "utilization_trace",
    "curve",
    "phase_costs",
    "ttft_vs_hit_rate_figure",
    "speculative_sweep",
    "top_ops_figure",
    "goodput_sweep",
    "decode_bytes_and_tpot",
    "decode_mfu_projection",
    "recompute_vs_cache_figure",
    "block_tables",
    "kv_concurrency",
    "batch_scaling",
    "batching_timeline",
    "compared_cdfs",
    "quantization_ratios",
    "chunked_itl_traces",
    "chunked_prefill_tradeoff",
]


@pytest.mark.parametrize("name", FIGURES)
def test_every_public_figure_function_is_covered(name):
    """The list above is the module's figure functions: a new one should get a test here."""
    import importlib

    modules = [importlib.import_module(f"minieng.viz.{m}") for m in ("phases", "batching", "levers", "serving")]
    public = {
        n
        for mod in modules
        for n, f in vars(mod).items()
        if callable(f) and getattr(f, "__module__", "") == mod.__name__ and not n.startswith("_")
    }
    assert name in public
    assert public == set(FIGURES)


def test_goodput_sweep_marks_both_bests():
    point = dict(
        max_num_seqs=1,
        max_num_batched_tokens=64,
        output_throughput_tok_s=10.0,
        goodput_req_s=0.5,
        num_good_requests=5,
        num_requests=8,
    )
    result = {
        "points": [
            point,
            dict(point, max_num_seqs=8, output_throughput_tok_s=40.0, goodput_req_s=0.1, num_good_requests=1),
            dict(point, max_num_seqs=16, output_throughput_tok_s=None, goodput_req_s=None, num_good_requests=0),
        ],
        "best_throughput": 1,
        "best_goodput": 0,
    }
    fig = viz.goodput_sweep(result)
    png(fig)
    left, right = fig.axes
    assert [round(p.get_height(), 1) for p in left.patches] == [10.0, 40.0, 0.0]
    assert left.patches[1].get_edgecolor()[:3] == (0.0, 0.0, 0.0) and right.patches[0].get_edgecolor()[:3] == (0, 0, 0)
    assert "goodput" in right.get_ylabel() and "tok/s" in left.get_ylabel()
