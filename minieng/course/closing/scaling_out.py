"""Notebook 11's closing claims table: S18 (bigger GPUs sit idler in decode), S17 (more FLOP/s speeds
prefill, more bandwidth speeds decode) and S4 (tensor parallelism adds two devices' bandwidth)."""

from __future__ import annotations

from minieng.course import verdicts
from minieng.course.kit import claims_table
from minieng.measure.roofline import format_percent


def _s17(knob: dict) -> tuple[str, str]:
    if knob["knob"] is not None:
        many, few = knob["knob"]["rows"][0], knob["knob"]["rows"][-1]
        here = (
            f"{many['threads']} threads against {few['threads']}: matmul {many['matmul_flop_s'] / few['matmul_flop_s']:.2f}x, "
            f"copy {many['copy_bytes_s'] / few['copy_bytes_s']:.2f}x; TTFT {few['ttft_s'] / many['ttft_s']:.2f}x, "
            f"TPOT {few['tpot_s'] / many['tpot_s']:.2f}x faster"
        )
        return here, verdicts.s17_flops_knob(
            few["ttft_s"], many["ttft_s"], few["tpot_s"], many["tpot_s"], noise=knob["knob"].noise,
            flops_few=few["matmul_flop_s"], flops_many=many["matmul_flop_s"],
            bandwidth_few=few["copy_bytes_s"], bandwidth_many=many["copy_bytes_s"],
        )  # fmt: skip
    if knob["projection"] is None:
        return "torch runs one thread here", verdicts.not_testable("one thread")
    rows = knob["projection"]["rows"]
    why = verdicts.not_testable("one GPU: a projection on datasheets, not a measurement")
    return (
        f"projected on {len(rows)} datasheets from the MFU and MBU measured here",
        f"{why}; {knob['projection']['reading']}",
    )


def table(
    *,
    b1,
    projection: dict,
    knob: dict,
    tp,
    tp_noise,
    tp_gpus: bool,
    tp_where: str,
    cases: dict,
    hop_latency_us: float,
    noise=None,
):
    """The claims table of notebook 11. ``b1``: ``decode_runs.decode_b1_run``'s batch-1 decode (its
    ``.noise`` judges S18's measured MFU); ``projection``: ``decode_floor.decode_projection`` of it;
    ``knob``: ``decode_runs.flops_knob``; ``tp``: the measured ``TensorParallelRun`` (``tp_noise``
    its run's noise, ``tp_gpus`` whether over GPUs, ``tp_where`` where in words); ``cases``:
    ``tp_paper.article_cases`` at ``hop_latency_us``."""
    projected, here = projection["projected"], projection["here"]
    tp_one, tp_two = tp.step(1, 1), tp.step(tp.steps[-1].num_ranks, 1)
    tp_speedup = tp_one.forward_s / tp_two.forward_s
    tp_own = tp.modelled_step("own memory", tp_two.num_ranks, 1)
    s17_here, s17_verdict = _s17(knob)
    return claims_table([
        ("S18: bigger GPUs sit idler in decode", "more than 90% idle",
         f"projected from MBU {format_percent(projection['mbu_percent'])} measured here, {projection['intensity']:.2f} "
         f"FLOP/byte in bf16: batch-1 decode MFU {format_percent(projected[0]['mfu_percent'])} on the "
         f"{projected[0]['device']} ({projected[0]['peak_tflops']:.0f} TFLOP/s) to "
         f"{format_percent(projected[-1]['mfu_percent'])} on the {projected[-1]['device']} "
         f"({projected[-1]['peak_tflops']:.0f}); measured here {format_percent(here[2])}",
         verdicts.s18_idler([r["peak_tflops"] for r in projected], [r["mfu_percent"] for r in projected],
                            measured_mfu_percent=here[2], measured_mbu_percent=projection["mbu_percent"], noise=b1.noise)),
        ("S17: more FLOP/s speeds prefill, more bandwidth speeds decode", "(qualitative)", s17_here, s17_verdict),
        ("S4: tensor parallel over 2 GPUs sums bandwidth, ~66 tok/s, less in practice", "~66 tok/s, less in practice",
         f"computed: {cases['two, an ideal link'].tok_s:.1f} tok/s with an ideal link, "
         f"{cases['two, PCIe 4.0 x16'].tok_s:.1f} over PCIe 4.0 x16 ({hop_latency_us} us hops assumed). Measured on "
         f"{tp_where}: a batch-1 step {tp_two.forward_s * 1e3:.2f} ms against {tp_one.forward_s * 1e3:.2f} ms on one rank "
         f"({tp_speedup:.2f}x), {tp_two.comm_s * 1e3:.2f} ms of it in collectives; all-reduce hop "
         f"{tp.hop_latency_s * 1e6:.0f} us; modelled with that link {tp_own.step_s * 1e3:.2f} ms",
         verdicts.s4_tensor_parallel(tp_speedup, devices=2 if tp_gpus else 1, noise=tp_noise)),
    ], noise=noise)  # fmt: skip
