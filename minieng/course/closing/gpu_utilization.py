"""Notebook 04's closing claims table: S12 (what util.gpu reads during decode) and, beyond the
articles, CUDA graphs against a small model's launch-bound batch-1 decode."""

from __future__ import annotations

from functools import partial

from minieng.course import verdicts
from minieng.course.claims import verdict
from minieng.course.kit import claims_table
from minieng.lab.decode_overhead import matmul_share, util_gpu
from minieng.lab.gpu_utilization import graphs_verdict
from minieng.measure.roofline import format_percent


def table(*, batch1: dict, modes: dict, prof: dict, cuda: bool, noise=None):
    """The claims table of notebook 04. ``batch1``: the batch-1 ``decode_utilization`` run;
    ``modes``: the eager, default and compiled runs by label (``decode_overhead.engine_modes``'
    order); ``prof``: ``profile_decode``'s result. Nothing here is cached: every figure was
    measured in this run, under ``noise``."""
    u = batch1["utilization"]["measured"]
    util = util_gpu(batch1)
    if util is None:
        s12_here = f"util.gpu N/A here (no NVML); MFU {format_percent(u['mfu_percent'])}, MBU {format_percent(u['mbu_percent'])}"
    else:
        occupancy = batch1["nvml_summary"].get("sm_occupancy_percent_median")
        s12_here = f"util.gpu {format_percent(util)}, SM occupancy {format_percent(occupancy)}, MFU {format_percent(u['mfu_percent'])}"
    eager, graphs, _ = (r["decode_step_ms"] for r in modes.values())
    return claims_table(
        [
            (
                "S12: GPU utilization during decode reads 4-6%",
                "4-6%",
                s12_here,
                verdicts.s12_utilization(util, mfu_percent=u["mfu_percent"]),
            ),
            (
                "(beyond the articles) small-model batch-1 decode is bound by launch overhead; CUDA graphs remove it",
                "launch-bound before bandwidth-bound",
                f"TPOT eager {eager:.2f} ms vs default {graphs:.2f} ms ({eager / graphs:.2f}x); outside the matrix products: "
                f"{format_percent(100 * (1 - matmul_share(prof)))} of a profiled step",
                verdict(partial(graphs_verdict, cuda=cuda), noise, eager_step_ms=eager, graphs_step_ms=graphs),
            ),
        ],
        noise=noise,
    )
