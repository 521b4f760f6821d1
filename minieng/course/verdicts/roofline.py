"""The roofline's floors and ridge: S3 (no decode step beats bytes / bandwidth), the KV cache's bytes
joining the weights', S4 (two devices' bandwidth), S13 (the ridge splits the phases) and S17 (more
FLOP/s speeds prefill, not decode).
"""

from __future__ import annotations

from minieng.course.claims import verdict
from minieng.course.verdicts.wording import COMPUTED, FAILS, HOLDS, not_testable
from minieng.measure.roofline import OVERHEAD_BOUND_BELOW


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


def s4_tensor_parallel(speedup_x: float, *, devices: int, noise) -> str:
    """S4: two ranks' batch-1 step against one rank's (``speedup_x`` = one rank's time / two's).
    Holds on two devices when faster, and less than 2x (the link costs); fails at 1x or less (the
    all-reduces cost more than the split saves) and at 2x or more (more than two devices' bandwidth:
    check the timing). ``devices``: the devices the two ranks ran on. On one device (a CPU's two
    processes, or two on one GPU) the ranks share one memory bus: nothing adds bandwidth, so the
    claim is not testable there, whatever the speedup."""
    if devices < 2:
        return not_testable(
            f"both ranks ran on one device and share its memory bus, so no bandwidth can add "
            f"(measured {speedup_x:.2f}x: the split's work and its all-reduces on one bus)"
        )

    def judge(speedup_x):
        if speedup_x >= 2:
            return f"{FAILS}: {speedup_x:.2f}x, more than two devices' bandwidth (check the timing)"
        if speedup_x > 1:
            return f"{HOLDS}: {speedup_x:.2f}x, less than 2x"
        return f"{FAILS}: {speedup_x:.2f}x, the all-reduces cost more than the split saves"

    return verdict(judge, noise, speedup_x=speedup_x)


# S13 on the roofline: a phase is bound by its own resource when that resource's floor explains at least
# this share of its measured time (``measure.roofline.OVERHEAD_BOUND_BELOW``, as notebook 02's ``bound``).
OWN_FLOOR_SHARE = OVERHEAD_BOUND_BELOW


def s13_roofline_split(
    *,
    prefill_intensity: float,
    decode_intensity: float,
    ridge: float,
    noise,
    prefill_explained_percent: float | None = None,
    decode_explained_percent: float | None = None,
) -> str:
    """S13 on the roofline: prefill compute-bound, batch-1 decode memory-bound.

    On paper: prefill's arithmetic intensity (FLOP/byte, counted) right of the ridge (the measured
    peak / bandwidth: noisy), batch-1 decode's left of it; a ridge that does not split them fails.
    Measured: ``prefill_explained_percent`` and ``decode_explained_percent``, the share of each
    phase's timed steps its own floor explains (``phase_utilization(...)[peak]["explained_percent"]``
    with the peak the ridge is made of: FLOPs / peak for prefill, bytes / bandwidth for decode). A
    phase under ``OWN_FLOOR_SHARE`` is bound by overhead, not by its resource: fails. Without both,
    no phase was timed and the split on paper reads "computed" (any ridge between the two
    intensities passes), not "holds"."""
    timed = None not in (prefill_explained_percent, decode_explained_percent)

    def judge(ridge, prefill_explained_percent, decode_explained_percent):
        said = f"prefill {prefill_intensity:.0f}, decode {decode_intensity:.2f}, ridge {ridge:.1f} FLOP/B"
        if not prefill_intensity > ridge > decode_intensity:
            return f"{FAILS}: ridge {ridge:.1f} FLOP/B does not split prefill ({prefill_intensity:.0f}) from decode"
        if not timed:
            return f"{COMPUTED}: {said} (counted intensities; no phase timed here)"
        for phase, share, resource in (
            ("prefill", prefill_explained_percent, "FLOPs at the peak"),
            ("decode", decode_explained_percent, "bytes at the bandwidth"),
        ):
            if share < 100 * OWN_FLOOR_SHARE:
                return f"{FAILS}: {phase}'s {resource} explain only {share:.0f}% of its time: bound by overhead"
        return (
            f"{HOLDS}: {said}; the FLOPs explain {prefill_explained_percent:.0f}% of prefill's time, "
            f"the bytes {decode_explained_percent:.0f}% of decode's"
        )

    return verdict(
        judge,
        noise,
        ridge=ridge,
        prefill_explained_percent=prefill_explained_percent,
        decode_explained_percent=decode_explained_percent,
    )


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
