"""What a token costs: joules per token and price per million tokens, per phase.

Pure arithmetic on measured figures (an ``energy.EnergyReading``, a token count, a throughput) and
a price per device-hour that the reader gives. There is no price here that could pass for a quote:
``EXAMPLE_PRICE_PER_DEVICE_HOUR`` is an example, and every text built on it says so and asks for
the reader's own price (a cloud's hourly rate for the instance, or a purchase price spread over the
hours of its life).

- J/token = joules of the interval / tokens it produced (prefill: prompt tokens; decode: generated
  tokens), and the same above idle (what the phase added to the idle draw);
- cost per million tokens = price per device-hour / (tok/s x 3600 s/h) x 1e6: the device's time,
  which a token pays for whether the device is busy or idle;
- kWh per million tokens = J/token x 1e6 / 3.6e6 J/kWh.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from minieng.measure.energy import EnergyReading

EXAMPLE_PRICE_PER_DEVICE_HOUR = 2.0  # an EXAMPLE to replace with your device's price, not a quote
J_PER_KWH = 3.6e6


def joules_per_token(joules: float | None, tokens: int) -> float | None:
    """``joules / tokens`` (J/token); None when the joules were not measured. Raises ``ValueError``
    for ``tokens <= 0``."""
    if tokens <= 0:
        raise ValueError(f"tokens={tokens}: J/token needs at least one token")
    return None if joules is None else joules / tokens


def cost_per_million_tokens(tok_s: float, price_per_device_hour: float) -> float:
    """Price of a million tokens at ``tok_s`` tokens per second on a device that costs
    ``price_per_device_hour`` (same currency): price / (tok_s x 3600) x 1e6. Raises ``ValueError``
    for ``tok_s <= 0`` or a negative price."""
    if tok_s <= 0:
        raise ValueError(f"tok_s={tok_s}: a throughput must be positive")
    if price_per_device_hour < 0:
        raise ValueError(f"price_per_device_hour={price_per_device_hour} must be >= 0")
    return price_per_device_hour / (tok_s * 3600) * 1e6


def cost_per_thousand_requests(req_s: float, price_per_device_hour: float) -> float | None:
    """Price of a thousand requests served at ``req_s`` per second (e.g. goodput: only the requests
    that met the SLO count); None for ``req_s <= 0`` (nothing served). Raises ``ValueError`` for a
    negative price."""
    if price_per_device_hour < 0:
        raise ValueError(f"price_per_device_hour={price_per_device_hour} must be >= 0")
    return None if not req_s or req_s <= 0 else price_per_device_hour / (req_s * 3600) * 1e3


def kwh_per_million_tokens(j_per_token: float | None) -> float | None:
    """Energy of a million tokens (kWh): J/token x 1e6 / 3.6e6."""
    return None if j_per_token is None else j_per_token * 1e6 / J_PER_KWH


def price_note(price_per_device_hour: float | None) -> tuple[float, str]:
    """(the price to use, one line saying what it is): None means the example, labelled as one."""
    if price_per_device_hour is None:
        return EXAMPLE_PRICE_PER_DEVICE_HOUR, (
            f"price: an EXAMPLE of ${EXAMPLE_PRICE_PER_DEVICE_HOUR:.2f} per device-hour, not a quote: replace it "
            "with what an hour of your device costs you (price_per_device_hour=...)"
        )
    return price_per_device_hour, f"price: {price_per_device_hour:g} per device-hour, as you set it"


@dataclass(frozen=True)
class PhaseCost:
    """One phase's cost: ``tokens`` produced in ``seconds`` (prefill: prompt tokens; decode: generated
    tokens), at ``batch_size`` sequences a step; J/token total and above idle (None: energy not
    measured); ``cost_per_mtok`` (the price's currency per million tokens) at ``tok_s``."""

    phase: str
    batch_size: int
    tokens: int
    seconds: float
    tok_s: float
    joules: float | None
    j_per_token: float | None
    j_per_token_above_idle: float | None
    kwh_per_mtok: float | None
    price_per_device_hour: float
    cost_per_mtok: float

    def to_dict(self) -> dict:
        return asdict(self)


def phase_cost(
    phase: str, batch_size: int, tokens: int, reading: EnergyReading, price_per_device_hour: float
) -> PhaseCost:
    """The cost of ``tokens`` made in the interval ``reading`` measured: throughput = tokens /
    ``reading.seconds``, so J/token and the price per token come from the same interval. Raises
    ``ValueError`` for ``tokens <= 0`` or an empty interval."""
    if reading.seconds <= 0:
        raise ValueError(f"{phase}: an interval of {reading.seconds} s has no throughput")
    tok_s = tokens / reading.seconds
    j_tok = joules_per_token(reading.joules, tokens)
    return PhaseCost(
        phase,
        batch_size,
        tokens,
        reading.seconds,
        tok_s,
        reading.joules,
        j_tok,
        joules_per_token(reading.joules_above_idle, tokens),
        kwh_per_million_tokens(j_tok),
        price_per_device_hour,
        cost_per_million_tokens(tok_s, price_per_device_hour),
    )


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, None when either is missing or the denominator is not positive
    (e.g. decode J/token over prefill J/token: how many times more a decode token costs)."""
    return None if numerator is None or denominator is None or denominator <= 0 else numerator / denominator
