"""report: the bench's tables print every utilization with the digits that tell 0.03% from 0.3%."""

from minieng.lab.report import format_serving, format_table


def utilization(mfu, mbu, suspect=False):
    return {
        "num_steps": 3,
        "flops": 1e9,
        "bytes": 1e9,
        "seconds": 0.1,
        "arithmetic_intensity_flop_per_byte": 1.0,
        "achieved_tflops": 0.01,
        "achieved_gbps": 10.0,
        "measured": {"mfu_percent": mfu, "mbu_percent": mbu, "suspect": suspect},
    }


def bench_result():
    env = {
        "model": "m",
        "device_name": "H200",
        "device": "cuda",
        "dtype": "bfloat16",
        "torch_threads": 1,
        "torch_version": "2",
        "transformers_version": "5",
    }
    return {
        "environment": env,
        "load_s": None,
        "config": {"compare_transformers": False, "decode_prompt_len": 64, "output_tokens": 8},
        "peaks": [{"source": "measured", "peak_tflops": 790.0, "bandwidth_gbps": 4300.0, "ridge_flop_per_byte": 183.7}],
        "prefill": [
            {
                "prompt_tokens": 1024,
                "minieng_ttft_ms": 13.0,
                "minieng_prefill_tok_s": 78000.0,
                "utilization": utilization(2.5, 1.2),
            }
        ],
        "decode": [
            {
                "batch_size": 1,
                "minieng_tpot_ms": 13.6,
                "minieng_decode_tok_s": 73.5,
                "utilization": utilization(0.031, 0.29),
            }
        ],
        "phase_ratio": {
            "article_vllm_prefill_tok_s": 12968.6,
            "article_vllm_decode_tok_s": 95.0,
            "article_ratio_x": 136.5,
        },
    }


def test_small_mfu_and_mbu_keep_two_significant_digits():
    table = format_table(bench_result())
    row = next(line for line in table.splitlines() if "decode batch 1" in line)
    assert "0.031%" in row and "0.29%" in row and "0.0%" not in row
    assert "reaches 0.29% of the measured bandwidth" in table
    assert "2.5%" in next(line for line in table.splitlines() if "prefill 1024 tok" in line)


def test_the_noise_read_at_the_start_is_printed_and_qualifies_the_targets():
    result = bench_result() | {
        "noise_lines": ["noise now: 3 more runs of each ...", "=> a timing here may be off by about 40% (busy)"],
        "noise": {"level": "busy", "relative": 0.4},
        "targets": [{"target": "batch-1 TPOT vs transformers", "measured_x": 1.3, "goal": "<= 0.8x", "met": False}],
    }
    lines = format_table(result).splitlines()
    assert lines[1] == "noise now: 3 more runs of each ..."
    caveat = lines.index("Targets, measured in this run:") + 1
    assert "busy" in lines[caveat] and "40%" in lines[caveat] and lines[caveat + 1].startswith("  MISS")
    quiet = format_table(result | {"noise": {"level": "quiet", "relative": 0.05}})
    assert "rerun on a quiet machine" not in quiet


def test_the_decode_step_section_prints_its_ops_and_where_its_time_went():
    result = bench_result() | {
        "decode_ops": {"batch_size": 1, "step_ops": 763, "computing_per_layer": 14.0, "ops_per_layer": 24.0},
        "decode_profile": {
            "step_ms": 41.0,
            "cpu": {"matmul_share": 0.71, "other_ops_share": 0.2, "outside_ops_share": 0.09},
            "device": None,
        },
    }
    table = format_table(result)
    assert "dispatches 763 ops: 14 computing (a kernel each on a GPU) and 24 in all per layer" in table
    assert "matrix products 71% of its host time, other ops 20%, outside any op 9%" in table


def test_serving_section_prints_utilization_and_na():
    report = {
        "workload": {
            "kind": "fixed",
            "num_requests": 1,
            "last_arrival_s": 0.0,
            "prompt_tokens_total": 8,
            "output_tokens_total": 8,
        },
        "metrics": {
            "completed": 1,
            "aborted": 0,
            "failed": 0,
            "duration_s": 1.0,
            "num_preemptions": 0,
            "output_throughput_tok_s": 8.0,
            "prefill_throughput_tok_s": 8.0,
            "request_throughput_req_s": 1.0,
            **{k: {"count": 0} for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")},
            "num_excluded_from_tpot": 0,
        },
        "decode_only_steps": utilization(0.012, 0.8),
        "telemetry": {"util_gpu_percent_median": 37.0, "sm_occupancy_percent_median": None, "reliable": True},
    }
    text = "\n".join(format_serving(report))
    assert "MFU 0.012%, MBU 0.80%" in text
    assert "util.gpu median 37.0%, SM occupancy median N/A" in text


def test_quantization_section_prints_ratios_beside_predictions():
    from minieng.lab.report import format_quantization

    def row(scheme, bpw, ttft, tpot):
        return {
            "scheme": scheme,
            "kernel": f"{scheme} kernel",
            "weight_bytes": 2.5e8,
            "bytes_per_weight": bpw,
            "ttft_ms": 600.0,
            "ttft_ratio": ttft,
            "ttft_ratio_predicted": 0.7,
            "tpot_b1_ms": 30.0,
            "tpot_b1_ratio": tpot,
            "tpot_b1_ratio_predicted": 0.26,
            "agreement": 0.965,
            "kl_nats": 0.0027,
            "positions": 256,
        }

    result = {
        "device": "cpu",
        "dtype": "torch.float32",
        "config": {"batch_sizes": [1], "prompt_tokens": 512, "quality_prompts": 4, "quality_tokens": 64},
        "rows": [row("none", 4.0, 1.0, 1.0), row("int8", 1.006, 0.8, 0.4)],
    }
    text = "\n".join(format_quantization(result))
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("int8 "))
    assert "1.006" in line and "0.80x (0.70)" in line and "0.40x (0.26)" in line and "2.00x" in line
    assert "96.5%" in line and "int8: int8 kernel" in text


def test_serving_section_names_a_p99_over_too_few_requests_the_max():
    from minieng.measure.metrics import summarize_ms

    few = summarize_ms([0.1, 0.2, 0.3, 0.4] * 6)  # 24 requests: no sample lies above a P99
    many = summarize_ms([0.01 * (i % 7 + 1) for i in range(120)])  # 120 gaps: a real P99
    report = {
        "workload": {
            "kind": "poisson",
            "num_requests": 24,
            "last_arrival_s": 3.0,
            "prompt_tokens_total": 240,
            "output_tokens_total": 144,
        },
        "metrics": {
            "completed": 24,
            "aborted": 0,
            "failed": 0,
            "duration_s": 5.0,
            "num_preemptions": 0,
            "output_throughput_tok_s": 28.8,
            "prefill_throughput_tok_s": 48.0,
            "request_throughput_req_s": 4.8,
            "ttft_ms": few,
            "tpot_ms": few,
            "itl_ms": many,
            "e2el_ms": few,
            "num_excluded_from_tpot": 0,
        },
    }
    lines = format_serving(report)
    ttft = next(line for line in lines if line.strip().startswith("TTFT"))
    itl = next(line for line in lines if line.strip().startswith("ITL"))
    assert ttft.split()[1:] == ["24", "250.0", "250.0", "400.0", "-", "400.0"]  # P90 supported by 24, P99 not
    assert "-" not in itl.split() and f"{many['p99']:.1f}" in itl
    assert "TTFT max of 24, TPOT max of 24, E2EL max of 24" in "\n".join(lines)
    assert "ITL max of" not in "\n".join(lines)


def test_prefix_section_shows_each_points_max_when_it_has_too_few_requests_for_a_p99():
    from minieng.lab.report import format_prefix
    from minieng.measure.metrics import summarize_ms

    def point(shared, hit, ttft_s):
        return {"shared_tokens": shared, "hit_rate": hit, "ttft_ms": summarize_ms(ttft_s)}

    result = {
        "prompt_tokens": 256,
        "block_size": 16,
        "cold": {"ttft_ms": summarize_ms([0.1, 0.1, 0.1, 0.5])},
        "points": [point(128, 0.5, [0.05, 0.05, 0.05, 0.3]), point(240, 0.94, [0.01, 0.01, 0.01, 0.2])],
        "article_points": [{"hit_rate": 0.97, "ttft_s": 0.87}],
    }
    lines = format_prefix(result)
    assert "max TTFT ms" in lines[1] and "P99" not in lines[1]
    assert lines[2].split()[-2] == "500.0" and lines[4].split()[-2] == "200.0"  # the maxima, not interpolations
    assert "  (max: the max of 4 requests a point, too few for a P99)" in lines


def test_two_clocks_table_names_each_tail_by_its_sample():
    from minieng.lab.report import format_two_clocks
    from minieng.measure.metrics import RequestMetrics, serving_metrics

    def run(offset_s):  # 24 requests of 50 tokens: 24 TTFTs (no P99), 1,176 gaps (a P99)
        reqs = [
            RequestMetrics.from_emissions(i, [(i + offset_s + 0.01 * k, 1) for k in range(1, 51)], 8) for i in range(24)
        ]
        return serving_metrics(reqs)

    lines = format_two_clocks(run(0.002), run(0.0))  # the client sees every token 2 ms later
    ttft = next(line for line in lines if line.strip().startswith("TTFT"))
    itl = next(line for line in lines if line.strip().startswith("ITL"))
    assert ttft.split()[1:4] == ["24", "12.0", "10.0"] and ttft.endswith("max of 24")
    assert itl.endswith("P99") and itl.split()[1] == "1176"
