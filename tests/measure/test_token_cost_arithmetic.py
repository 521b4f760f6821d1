"""J/token and price per million tokens against numbers worked by hand."""

from __future__ import annotations

import pytest

from minieng.measure.energy import EnergyReading
from minieng.measure.token_cost import (
    EXAMPLE_PRICE_PER_DEVICE_HOUR,
    cost_per_million_tokens,
    cost_per_thousand_requests,
    joules_per_token,
    kwh_per_million_tokens,
    phase_cost,
    price_note,
    ratio,
)


def test_joules_per_token():
    assert joules_per_token(10.0, 4) == 2.5
    assert joules_per_token(None, 4) is None
    with pytest.raises(ValueError, match="at least one token"):
        joules_per_token(1.0, 0)


def test_price_per_million_tokens_by_hand():
    # $3.60 an hour = $0.001 a second; at 1,000 tok/s a token costs $1e-6: $1 per million
    assert cost_per_million_tokens(1_000.0, 3.6) == pytest.approx(1.0)
    # 95 tok/s (the article's batch-1 decode) at $2/h: 2 / (95 x 3600) x 1e6 = 5.848 per million
    assert cost_per_million_tokens(95.0, 2.0) == pytest.approx(5.8480, rel=1e-4)
    assert cost_per_million_tokens(12_968.6, 2.0) == pytest.approx(0.042838, rel=1e-4)  # its prefill
    assert cost_per_thousand_requests(0.5, 3.6) == pytest.approx(2.0)  # 1,800 requests an hour
    assert cost_per_thousand_requests(0.0, 3.6) is None
    with pytest.raises(ValueError, match="positive"):
        cost_per_million_tokens(0.0, 2.0)
    with pytest.raises(ValueError, match=">= 0"):
        cost_per_million_tokens(10.0, -1.0)


def test_kwh_per_million_tokens():
    assert kwh_per_million_tokens(3.6) == pytest.approx(1.0)  # 3.6 MJ = 1 kWh
    assert kwh_per_million_tokens(None) is None


def test_a_phase_cost_by_hand():
    # 4 s at 300 W (idle 100 W) for 2,000 tokens: 1,200 J, 0.6 J/token, above idle 800 J = 0.4 J/token
    reading = EnergyReading(joules=1_200.0, seconds=4.0, idle_watts=100.0, source="nvml-counter")
    c = phase_cost("decode", 8, 2_000, reading, price_per_device_hour=3.6)
    assert c.tok_s == pytest.approx(500.0)
    assert c.j_per_token == pytest.approx(0.6)
    assert c.j_per_token_above_idle == pytest.approx(0.4)
    assert c.kwh_per_mtok == pytest.approx(0.6 / 3.6)
    assert c.cost_per_mtok == pytest.approx(2.0)  # 1 / (500 x 3600) $/token... x 3.6 x 1e6
    assert c.to_dict()["batch_size"] == 8
    unmeasured = phase_cost("prefill", 1, 100, EnergyReading(None, 0.5, None, None, "no RAPL"), 3.6)
    assert unmeasured.j_per_token is None and unmeasured.cost_per_mtok == pytest.approx(3.6 / (200 * 3600) * 1e6)
    with pytest.raises(ValueError, match="no throughput"):
        phase_cost("prefill", 1, 100, EnergyReading(None, 0.0, None, None), 3.6)


def test_ratio_and_the_price_note():
    assert ratio(6.0, 0.05) == pytest.approx(120.0)
    assert ratio(None, 1.0) is None and ratio(1.0, 0.0) is None
    price, note = price_note(None)
    assert price == EXAMPLE_PRICE_PER_DEVICE_HOUR and "EXAMPLE" in note and "not a quote" in note
    assert "replace" in note
    price, note = price_note(1.25)
    assert price == 1.25 and "EXAMPLE" not in note and "as you set it" in note
