"""The roofline's floors and ridge: S3 (no decode step beats bytes / bandwidth), the KV cache's bytes
joining the weights', S4 (two devices' bandwidth), S13 (the ridge splits the phases) and S17 (more
FLOP/s speeds prefill, not decode).
"""

from __future__ import annotations

from minieng.course.claims import verdict
from minieng.course.verdicts.wording import FAILS, HOLDS


def s3_floor(tpot_s: float, *, floor_s: float, noise, note: str = "") -> str:
    """S3: no decode step beats bytes read / bandwidth (``tpot_floor_s``). Fails when the measured
    TPOT is under the floor: a wrong byte count or a ceiling measured low. ``note`` is appended to
    a verdict that holds (why the step sits above its floor)."""

    def judge(tpot_s):
        if tpot_s < floor_s:
            return f"{FAILS}: TPOT beat the bytes / bandwidth floor (check the bandwidth ceiling)"
        return f"{HOLDS}: no step beat the floor" + (f"; {note}" if note else "")

    return verdict(judge, noise, tpot_s=tpot_s)


# Beyond the articles (notebook 03): the KV read must add at least this factor to the floor to be timed,
# and the measured TPOT must grow by at least KV_FOLLOWS of the floor's growth.
KV_VISIBLE_X = 1.2
KV_FOLLOWS = 0.5


def kv_joins_weights(
    tpot_first_s: float, tpot_last_s: float, *, floor_first_s: float, floor_last_s: float, limit_first: str, noise
) -> str:
    """Beyond the articles: the KV cache's bytes join the weights' as the context grows, so TPOT
    grows with them. ``tpot_*``: the measured TPOT at the sweep's shortest and longest context;
    ``floor_*``: bytes / bandwidth there (computed); ``limit_first``: what bounds the shortest
    context's step (``roofline_bound``). Not testable when the floor grew less than
    ``KV_VISIBLE_X``; holds when TPOT grew by at least ``KV_FOLLOWS`` of the floor's growth."""
    floor_grew = floor_last_s / floor_first_s
    if floor_grew < KV_VISIBLE_X:
        return f"not testable here: the sweep's KV added only {100 * (floor_grew - 1):.0f}% to the floor"

    def judge(tpot_first_s, tpot_last_s):
        grew = tpot_last_s / tpot_first_s
        if grew - 1 >= KV_FOLLOWS * (floor_grew - 1):
            return f"{HOLDS}: TPOT grew {grew:.2f}x where the floor grew {floor_grew:.2f}x"
        why = "the step is limited by overhead" if limit_first == "overhead" else "TPOT barely moved"
        return f"{FAILS}: TPOT grew {grew:.2f}x where the floor grew {floor_grew:.2f}x: {why}"

    return verdict(judge, noise, tpot_first_s=tpot_first_s, tpot_last_s=tpot_last_s)


def s4_tensor_parallel(speedup_x: float, *, two_devices: bool, noise) -> str:
    """S4: two ranks' batch-1 step against one rank's (``speedup_x`` = one rank's time / two's).
    Holds when faster, and less than 2x (the link costs). ``two_devices``: two GPUs; else two
    processes on one CPU, which share one memory bus."""

    def judge(speedup_x):
        if speedup_x >= 2:
            return f"{FAILS}: {speedup_x:.2f}x, more than two devices' bandwidth (check the timing)"
        if speedup_x > 1:
            return f"{HOLDS}: {speedup_x:.2f}x, less than 2x"
        why = "the all-reduces cost more than the split saves" if two_devices else "the ranks share one memory bus"
        return f"{FAILS}: {speedup_x:.2f}x, {why}"

    return verdict(judge, noise, speedup_x=speedup_x)


def s13_roofline_split(*, prefill_intensity: float, decode_intensity: float, ridge: float, noise) -> str:
    """S13 on the roofline: prefill's arithmetic intensity (FLOP/byte, counted) right of the ridge
    (the measured peak / bandwidth: noisy), batch-1 decode's left of it."""

    def judge(ridge):
        if prefill_intensity > ridge > decode_intensity:
            return f"{HOLDS}: prefill {prefill_intensity:.0f}, decode {decode_intensity:.2f}, ridge {ridge:.1f} FLOP/B"
        return f"{FAILS}: ridge {ridge:.1f} FLOP/B does not split prefill ({prefill_intensity:.0f}) from decode"

    return verdict(judge, noise, ridge=ridge)


# S17: prefill must gain this many times more than decode from the extra FLOP/s.
PHASE_GAIN_X = 1.2


def s17_flops_knob(
    ttft_few_s: float,
    ttft_many_s: float,
    tpot_few_s: float,
    tpot_many_s: float,
    *,
    noise,
    flops_few: float | None = None,
    flops_many: float | None = None,
    bandwidth_few: float | None = None,
    bandwidth_many: float | None = None,
) -> str:
    """S17: the same model with fewer and with more FLOP/s (on a CPU, 1 thread against all: the
    matmul ceiling multiplies, the copy bandwidth barely moves). Holds when the extra FLOP/s made
    prefill faster (TTFT few / many above 1) and prefill's speed-up is at least ``PHASE_GAIN_X``
    times decode's (TPOT few / many).

    ``flops_*`` and ``bandwidth_*`` (optional, measured: FLOP/s and bytes/s of the two settings'
    ceilings) check the knob itself: when it did not raise the FLOP/s ``PHASE_GAIN_X`` times more
    than the bandwidth, the run cannot tell the phases apart and the claim is not testable there
    (a machine so busy that more threads only fight for the cores)."""

    def judge(ttft_few_s, ttft_many_s, tpot_few_s, tpot_many_s, flops_few, flops_many, bandwidth_few, bandwidth_many):
        if None not in (flops_few, flops_many, bandwidth_few, bandwidth_many):
            flops_x, bandwidth_x = flops_many / flops_few, bandwidth_many / bandwidth_few
            if flops_x < PHASE_GAIN_X * bandwidth_x:
                return (
                    f"not testable here: the knob moved the FLOP/s {flops_x:.2f}x and the bandwidth "
                    f"{bandwidth_x:.2f}x, not more compute than bandwidth"
                )
        prefill_x, decode_x = ttft_few_s / ttft_many_s, tpot_few_s / tpot_many_s
        said = f"prefill {prefill_x:.2f}x faster, decode {decode_x:.2f}x"
        if prefill_x <= 1:
            return f"{FAILS}: {said}: more FLOP/s did not speed prefill"
        if prefill_x >= PHASE_GAIN_X * decode_x:
            return f"{HOLDS}: {said}"
        return f"{FAILS}: {said}"

    return verdict(
        judge,
        noise,
        ttft_few_s=ttft_few_s,
        ttft_many_s=ttft_many_s,
        tpot_few_s=tpot_few_s,
        tpot_many_s=tpot_many_s,
        flops_few=flops_few,
        flops_many=flops_many,
        bandwidth_few=bandwidth_few,
        bandwidth_many=bandwidth_many,
    )
