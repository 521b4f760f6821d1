"""``benchmarks/llama_cpp_side_by_side.py`` without llama.cpp: its rounds alternate the contenders,
its table's ratios are to llama.cpp's row, its verdicts read the best compiled quantized row, and
without llama-cpp-python it stops at once with the command that installs it."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "llama_cpp_side_by_side.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("llama_cpp_side_by_side", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Racer:
    """A contender whose decode and prefill take fixed times, and which logs its calls."""

    def __init__(self, name, tpot_s, prefill_s, calls):
        self.name, self.tpot_s, self.prefill, self.calls = name, tpot_s, prefill_s, calls

    def decode_tpot_s(self, prompt, output_tokens):
        self.calls.append((self.name, "decode", output_tokens))
        return self.tpot_s

    def prefill_s(self, prompt):
        self.calls.append((self.name, "prefill", len(prompt)))
        return self.prefill


def test_rounds_alternate_and_the_table_is_relative_to_llama_cpp(script):
    calls = []
    racers = [
        Racer(script.LlamaCpp.name, 0.010, 1.0, calls),
        Racer("minieng w8a8", 0.025, 0.5, calls),
        Racer("minieng w8a8, compiled", 0.014, 0.25, calls),
        Racer("minieng float32, compiled", 0.012, 2.0, calls),
    ]
    args = argparse.Namespace(rounds=2, output_tokens=8)
    runs = script.measure(racers, [1] * 16, [1] * 512, args)
    assert calls[: 2 * len(racers)] == [c for r in racers for c in ((r.name, "decode", 4), (r.name, "prefill", 512))]
    timed = calls[2 * len(racers) :]  # after each one's untimed warm-up
    assert [c[0] for c in timed[::2]] == [r.name for r in racers] * 2  # round by round, in turn
    assert {c[2] for c in timed if c[1] == "decode"} == {8}
    assert runs["minieng w8a8"] == {"tpot_s": [0.025, 0.025], "prefill_s": [0.5, 0.5]}
    rows = {r["name"]: r for r in script.summarize(runs, 512)}
    assert rows["minieng w8a8"]["tpot_ratio"] == pytest.approx(2.5)
    assert rows["minieng w8a8"]["prefill_ratio"] == pytest.approx(2.0)  # 1,024 against 512 tokens/s
    assert rows[script.LlamaCpp.name]["tpot_ms"] == pytest.approx(10.0)
    # the best compiled quantized row (float32 is not quantized, however fast): 1.4x and 4x
    verdicts = script.verdicts(list(rows.values()))
    assert verdicts[0].startswith("PASS minieng w8a8, compiled: batch-1 TPOT 1.40x")
    assert verdicts[1].startswith("PASS minieng w8a8, compiled: prefill 4.00x")
    slow = [dict(r, tpot_ratio=1.6) if "compiled" in r["name"] else r for r in rows.values()]
    assert script.verdicts(slow)[0].startswith("MISS")
    assert "no compiled quantized engine ran" in script.verdicts([rows["minieng w8a8"]])[0]


@pytest.mark.parametrize("argv", [["--output-tokens", "1"], ["--rounds", "0"], ["--schemes", ","]])
def test_arguments_that_measure_nothing_are_refused(script, argv, capsys):
    with pytest.raises(SystemExit):
        script.parse_args(argv)
    assert "--" in capsys.readouterr().err


def test_without_llama_cpp_it_says_how_to_install_it(script, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    assert script.main(["--rounds", "1"]) == 2
    assert "pip install llama-cpp-python==0.3.36" in capsys.readouterr().err
