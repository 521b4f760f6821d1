"""What a token costs: the driver on the tiny model, with a meter that reads known watts and with
this machine's own (here: no RAPL), its tables, and the bench's line."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import make_engine

from minieng.lab.report import format_table
from minieng.lab.token_cost import (
    format_cap_costs,
    format_token_cost,
    format_token_cost_by_scheme,
    measure_token_cost,
    measure_token_cost_by_scheme,
    reprice,
)
from minieng.measure.energy import EnergyReading, energy_source


class SteadyMeter:
    """A started meter whose device draws ``watts`` under any work (``idle_watts`` idle): every
    interval's joules = watts x its real seconds, so J/token = watts / tok/s exactly."""

    source, reason, domains = "nvml-counter", None, ["fake GPU"]

    def __init__(self, watts=50.0, idle_watts=20.0):
        self.watts, self.idle_watts, self.calls = watts, idle_watts, 0

    def measure(self, fn, *args):
        import time

        start = time.perf_counter()
        value = fn(*args)
        seconds = time.perf_counter() - start
        self.calls += 1
        return value, EnergyReading(self.watts * seconds, seconds, self.idle_watts, self.source)

    def describe(self):
        return f"energy: a steady {self.watts} W"


# 22 decode steps counted a run: well above this shared machine's timing noise
SMALL = dict(prompt_tokens=16, decode_batches=(1, 4), output_tokens=24, decode_prompt_tokens=8)


def test_joules_per_token_follow_the_meter_by_hand(worded):
    engine = make_engine(worded)
    meter = SteadyMeter()
    result = measure_token_cost(engine, meter=meter, min_interval_s=0.0, price_per_device_hour=3.6, **SMALL)
    pre, b1, b4 = result["rows"]
    assert [(r["phase"], r["batch_size"]) for r in result["rows"]] == [("prefill", 1), ("decode", 1), ("decode", 4)]
    assert meter.calls == 1 + 2 * 2  # the prefill; each batch's full run and its 2-token run
    assert (pre["tokens"], b1["tokens"], b4["tokens"]) == (16, 1 * (24 - 2), 4 * (24 - 2))
    for r in result["rows"]:
        assert r["repeats"] == 1
        assert r["tok_s"] == pytest.approx(r["tokens"] / r["seconds"])
        assert r["j_per_token"] == pytest.approx(50.0 / r["tok_s"])  # W / (tok/s) = J/token
        assert r["j_per_token_above_idle"] == pytest.approx((50.0 - 20.0) / r["tok_s"])
        assert r["cost_per_mtok"] == pytest.approx(3.6 / (r["tok_s"] * 3600) * 1e6)
    # at a steady draw, a decode token costs what the throughputs say: prefill tok/s / decode tok/s
    assert b1["j_per_token_vs_prefill_x"] == pytest.approx(pre["tok_s"] / b1["tok_s"])
    assert b4["cost_vs_prefill_x"] == pytest.approx(pre["tok_s"] / b4["tok_s"])
    assert result["price_is_example"] is False and result["price_per_device_hour"] == 3.6
    text = format_token_cost(result)
    assert "decode batch 4" in text and "x the joules of a prefill token at batch 1" in text
    assert "as you set it" in text and "EXAMPLE" not in text
    # another price, the same measurement: every price scales, the joules and throughputs stay
    cheaper = reprice(result, 1.8)
    assert [r["cost_per_mtok"] for r in cheaper["rows"]] == pytest.approx(
        [r["cost_per_mtok"] / 2 for r in result["rows"]]
    )
    assert [r["j_per_token"] for r in cheaper["rows"]] == [r["j_per_token"] for r in result["rows"]]
    assert result["price_per_device_hour"] == 3.6, "the original is left as it was"
    assert reprice(result, None)["price_is_example"] is True and "EXAMPLE" in format_token_cost(reprice(result, None))


def test_intervals_repeat_until_they_last(worded):
    engine = make_engine(worded)
    result = measure_token_cost(engine, meter=SteadyMeter(), min_interval_s=60.0, max_repeats=3, **SMALL)
    pre, b1, _ = result["rows"]
    assert pre["repeats"] == b1["repeats"] == 3
    assert (pre["tokens"], b1["tokens"]) == (3 * 16, 3 * 22)


def test_this_cpu_gives_throughput_and_price_and_says_why_not_joules(worded):
    """On this machine (no RAPL) the joules are missing with the reason; tok/s and the example
    price are there, the price labelled as an example to replace."""
    engine = make_engine(worded)
    source, _ = energy_source("cpu")
    result = measure_token_cost(engine, min_interval_s=0.0, idle_s=0.05, **SMALL)
    assert result["price_is_example"] is True
    assert all(r["tok_s"] > 0 and r["cost_per_mtok"] > 0 for r in result["rows"])
    text = format_token_cost(result)
    assert "EXAMPLE" in text and "not a quote" in text and "replace it" in text
    if source is None:
        assert result["energy"]["source"] is None and "RAPL" in result["energy"]["reason"]
        assert all(r["j_per_token"] is None for r in result["rows"])
        assert "not measurable on this machine" in text and "n/a" in text
    else:
        assert all(r["j_per_token"] is not None for r in result["rows"])


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(output_tokens=3), "must be >= 4"),
        (dict(decode_batches=(65,)), "max_num_seqs"),
        (dict(prompt_tokens=256), "max_model_len"),
        (dict(decode_batches=(64,), decode_prompt_tokens=200, output_tokens=40), "KV pool"),
    ],
)
def test_bad_sizes_are_refused(worded, overrides, match):
    with pytest.raises(ValueError, match=match):
        measure_token_cost(make_engine(worded), meter=SteadyMeter(), **(SMALL | overrides))


def test_by_scheme_shares_one_meter_and_compares_with_float(worded, monkeypatch):
    from minieng.lab import token_cost as module

    meter = SteadyMeter()
    monkeypatch.setattr(module, "EnergyMeter", lambda *a, **k: _Started(meter))
    result = measure_token_cost_by_scheme(make_engine(worded), schemes=["int8"], min_interval_s=0.0, **SMALL)
    assert [e["scheme"] for e in result["schemes"]] == ["none", "int8"]
    text = format_token_cost_by_scheme(result)
    assert "int8   decode batch 4" in text and "x float" in text
    float_row = next(line for line in text.splitlines() if line.startswith("  none   prefill"))
    assert float_row.split()[-1] == "1.00"  # the float model against itself
    assert "as you set it" in format_token_cost_by_scheme(reprice(result, 4.0))


class _Started:
    """A context manager handing out an already started meter."""

    def __init__(self, meter):
        self.meter = meter

    def __enter__(self):
        return self.meter

    def __exit__(self, *exc):
        return None


def test_cap_costs_from_a_goodput_sweep_by_hand():
    def point(seqs, tok_s, good):
        return {
            "max_num_seqs": seqs,
            "max_num_batched_tokens": 512,
            "output_throughput_tok_s": tok_s,
            "goodput_req_s": good,
        }

    sweep = {"points": [point(4, 100.0, 0.5), point(32, 1_000.0, 0.0)], "best_throughput": 1, "best_goodput": 0}
    text = format_cap_costs(sweep, price_per_device_hour=3.6)
    low, high = (line for line in text.splitlines() if line.strip().startswith(("4 ", "32 ")))
    # $3.60/h at 100 tok/s: $10 per million; 0.5 good req/s: $2 per thousand
    assert low.split()[3] == "10" and low.split()[5] == "2" and "most goodput" in low
    assert high.split()[3] == "1" and high.split()[5] == "n/a" and "most throughput" in high
    assert "as you set it" in text
    assert "EXAMPLE" in format_cap_costs(sweep)


def test_the_bench_prints_joules_per_token_or_why_not():
    env = {
        "model": "m",
        "device_name": "d",
        "device": "cpu",
        "dtype": "float32",
        "torch_threads": 1,
        "torch_version": "2",
        "transformers_version": "5",
    }
    base = {"environment": env, "config": {}, "prefill": [], "decode": []}
    why = {"energy": {"source": None, "description": "energy: not measurable on this machine: no RAPL: ..."}}
    text = format_table(base | {"token_cost": why})
    assert "J/token per phase: not measured; energy: not measurable on this machine: no RAPL" in text
    row = {
        "phase": "decode",
        "batch_size": 1,
        "tokens": 30,
        "tok_s": 70.0,
        "j_per_token": 5.0,
        "j_per_token_above_idle": 3.0,
        "kwh_per_mtok": 1.4,
        "cost_per_mtok": 7.9,
        "cost_vs_prefill_x": 100.0,
        "j_per_token_vs_prefill_x": 120.0,
        "j_per_token_above_idle_vs_prefill_x": 150.0,
    }
    prefill = row | {
        "phase": "prefill",
        "prompt_tokens": 512,
        "tokens": 512,
        "tok_s": 7000.0,
        "j_per_token": 0.04,
        "j_per_token_above_idle": 0.02,
        "cost_per_mtok": 0.079,
    }
    cost = {
        "device": "cuda",
        "energy": {"source": "nvml-counter", "description": "energy: NVML's counter"},
        "price_note": "price: an EXAMPLE ...",
        "config": {"decode_prompt_tokens": 64, "output_tokens": 32},
        "rows": [prefill, row],
    }
    text = format_table(base | {"token_cost": cost})
    assert "What a token costs on cuda" in text and "120x the joules of a prefill token at batch 1" in text
    assert "prefill 512-token prompt" in text


def test_a_noisy_machine_still_gets_a_decode_throughput(worded, monkeypatch):
    """When the 2-token twins take longer than the n-token runs (a loaded machine stalled them), the
    decode row keeps a throughput from its steps' own time and says why it has no joules."""
    import minieng.lab.token_cost as token_cost

    real = token_cost._decode_reading

    def stalled(full, short, step_seconds):
        return real(full, replace(short, seconds=full.seconds + 5.0), step_seconds)

    monkeypatch.setattr(token_cost, "_decode_reading", stalled)
    engine = make_engine(worded)
    result = measure_token_cost(engine, meter=SteadyMeter(), min_interval_s=0.0, **SMALL)
    for r in result["rows"][1:]:
        assert r["tok_s"] > 0 and r["seconds"] > 0
        assert r["joules"] is None and "noise" in r["energy"]["reason"]
