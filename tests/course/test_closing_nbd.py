"""The closing claims tables of notebooks 04, 05, 08 and 12 (``course.closing``): one call each, one
row per claim, and each can come out against the article."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "lab"))  # the lab tests' fake results
from test_decode_overhead import quant_result, run  # noqa: E402

from minieng.course.closing import continuous_batching, gpu_utilization, quantization  # noqa: E402


@pytest.fixture(autouse=True)
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIENG_RESULTS_DIR", str(tmp_path))


def rows(table) -> list[list[str]]:
    return table._repr_mimebundle_()[next(iter(table._repr_mimebundle_()))]["rows"]


def test_gpu_utilization_table_fails_when_graphs_do_not_help():
    prof = {"cpu": {"matmul_share": 0.6}, "device": None}
    modes = {"eager": run(1, 10, 5.0), "default": run(1, 10, 5.0), "compiled": run(1, 10, 4.0)}
    table = rows(
        gpu_utilization.table(batch1=run(1.0, 30.0, 5.0, util=97.0), modes=modes, prof=prof, cuda=True, noise=0.01)
    )
    assert table[0][0].startswith("S12") and "util.gpu 97.0%" in table[0][2]
    assert table[1][3].startswith("does not hold") and "40.0%" in table[1][2]


def test_continuous_batching_table_fails_when_static_wins():
    def summary(v):
        return {"p50": v, "p99": v, "max": v, "count": 24}

    def metrics(tok_s, e2el):
        return {"metrics": {"output_throughput_tok_s": tok_s, "ttft_ms": summary(100.0), "e2el_ms": summary(e2el)}}

    serve = {"runs": {"static": metrics(200.0, 500.0), "continuous": metrics(100.0, 900.0)}}
    cap = {"peak_running": 8, "num_blocks": 16, "cap_at_prompt": 8, "cap_at_full_length": 4, "num_preemptions": 3}
    table = rows(continuous_batching.table(serve=serve, cap=cap, noise=0.01))
    assert table[0][3].startswith("does not hold") and "E2EL (max of 24) 900 vs 500 ms" in table[0][2]
    assert "8 at once in 16 blocks" in table[1][2]


def test_quantization_table_reads_every_row():
    acc = {
        k: {"agreement": a, "kl_nats": kl}
        for k, a, kl in (
            ("w8a8, 8-bit per token (simulated)", 0.95, 0.01),
            ("w8a8, 8-bit per tensor (simulated)", 0.6, 0.5),
        )
    }
    amp = {"nudge": {"none": {}}, "batched": {}}
    table = rows(quantization.table(res=quant_result(), acc=acc, amp=amp, batch=1))
    claims = [r[0].split(":")[0] for r in table]
    assert claims[:3] == ["S13", "S3", "W8A8 speeds prefill too (integer arithmetic)"]
    assert table[4][3].startswith("not testable") and "w8a8: 0.30x TPOT" in table[5][2]
