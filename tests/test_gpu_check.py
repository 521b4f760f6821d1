"""``benchmarks/gpu_check.py`` in smoke mode on the CPU: every section runs and its JSON holds
the figures the GPU run reports (their values mean nothing on tiny shapes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def test_gpu_check_smoke_runs_every_section(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--device", "cpu", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    errors = [s for s in [*result["parity"], *result["speed"], result["prefix_cache"], result["speculative"],
                          result["quantization"]]
              if isinstance(s, dict) and "error" in s]
    assert not errors, errors[0]["traceback"]
    fp32 = next(r for r in result["parity"] if r["dtype"] == "float32")
    assert fp32["max_abs_logit_diff"] < 1e-3 * max(1.0, fp32["logit_std"])
    assert fp32["greedy_tokens_agreeing"] == fp32["greedy_tokens"]
    for shape in result["speed"]:
        assert [r["prompt_tokens"] for r in shape["prefill"]] == [16, 64]
        assert [r["batch_size"] for r in shape["decode_graphs"]] == [1, 2] == [r["batch_size"] for r in shape["decode_eager"]]
        assert all(r["tpot_ms"] > 0 for r in shape["decode_graphs"])
    assert result["prefix_cache"]["points"][1]["hit_rate"] > 0.4
    assert [r["k"] for r in result["speculative"]["rows"]] == [1, 2]
    quant = {r["scheme"]: r for r in result["quantization"]["rows"]}
    assert set(quant) == {"none", "int8", "w8a8"}  # a CPU: int4 has no kernel that pays
    assert quant["int8"]["bytes_per_weight"] < 0.3 * quant["none"]["bytes_per_weight"]
    names = {t["target"] for t in result["targets"]}
    assert any("batch-1 TPOT" in n for n in names) and any("speculative c" in n for n in names)
    assert any("quantization int8" in n for n in names)
    assert "PASS" in run.stdout or "MISS" in run.stdout
