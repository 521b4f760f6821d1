"""Notebook 10's closing table: S9 (disaggregated prefill and decode), S10 (the batch cap judged by
goodput and P99), S15 (TTFT and TPOT from the stream) and the two clocks agreeing. Through an API
the rows that need the engine in this kernel say why they are not testable (``backend.why_not``)."""

from __future__ import annotations

from minieng.course import verdicts
from minieng.course.kit import claims_table
from minieng.measure.metrics import ServingMetrics, common_tail


def _s9(disagg) -> tuple[str, str]:
    runs = {r["name"]: r for r in disagg["runs"]}
    replicas = next(r for name, r in runs.items() if name.startswith("colocated_x"))
    split = runs["disaggregated"]
    tail, key = common_tail([split["metrics"]["itl_ms"], replicas["metrics"]["itl_ms"]])
    here = (
        f"goodput per device {split['goodput_per_device_req_s']:.3f} disaggregated vs "
        f"{replicas['goodput_per_device_req_s']:.3f} for {replicas['num_devices']} replicas; ITL ({tail}) "
        f"{split['metrics']['itl_ms'][key]:.0f} vs {replicas['metrics']['itl_ms'][key]:.0f} ms "
        "(a measured model on one machine, link assumed)"
    )
    noise = getattr(disagg, "noise", None)
    return here, verdicts.s9_disaggregation(
        split["goodput_per_device_req_s"], replicas["goodput_per_device_req_s"], noise=noise
    )


def _s10(sweep) -> tuple[str, str]:
    """Every cap (at most four, the P99 term's limit), each point's TPOT P99 from its own TPOT count."""
    pts = sweep["points"][:4]
    best_tp, best_gp = sweep["points"][sweep["best_throughput"]], sweep["points"][sweep["best_goodput"]]
    tail, key = common_tail([p["tpot_ms"] for p in pts])
    here = (
        f"{pts[0]['num_requests']} requests a cap; cap {pts[0]['max_num_seqs']} -> {pts[-1]['max_num_seqs']}: "
        f"{pts[0]['output_throughput_tok_s']:.1f} -> {pts[-1]['output_throughput_tok_s']:.1f} tok/s, TPOT ({tail}) "
        f"{pts[0]['tpot_ms'][key]:.0f} -> {pts[-1]['tpot_ms'][key]:.0f} ms; most tok/s at cap "
        f"{best_tp['max_num_seqs']} ({best_tp['goodput_req_s']:.2f} req/s good), most goodput at cap "
        f"{best_gp['max_num_seqs']} ({best_gp['goodput_req_s']:.2f} req/s good)"
    )
    return here, verdicts.s10_goodput_cap(
        [p["output_throughput_tok_s"] or 0.0 for p in pts],
        [p["goodput_req_s"] or 0.0 for p in pts],
        caps=[p["max_num_seqs"] for p in pts],
        noise=getattr(sweep, "noise", None),
        p99_s=[(p["tpot_ms"]["p99"] or 0.0) / 1e3 for p in pts],
        requests=[p["tpot_ms"]["count"] for p in pts],
        latency="TPOT",
    )


def closing(backend, client: ServingMetrics, engine: ServingMetrics | None, sweep=None, disagg=None):
    """The claims table of the recorded HTTP run (``client``: the load generator's figures;
    ``engine``: the engine's own, None through an API), the batch-cap sweep (``lab.batch_cap_sweep``'s
    cached result) and the disaggregation model (``lab.compare_disaggregation``'s); each None where
    ``backend`` could not run it. Each verdict is judged with the noise of the run that measured it."""
    where = "" if backend.has_steps else f"{backend.label} through the API: "
    s9 = (
        _s9(disagg)
        if disagg is not None
        else ("not measured", verdicts.not_testable(backend.why_not("disaggregation")))
    )
    s10 = _s10(sweep) if sweep is not None else ("not measured", verdicts.not_testable(backend.why_not("caps")))
    mean_ttft_s, mean_tpot_s = client.ttft_ms["mean"] / 1e3, client.tpot_ms["mean"] / 1e3
    mean_output_tokens = client.total_output_tokens / client.completed
    s15 = (
        verdicts.s15_total_latency(mean_ttft_s, mean_tpot_s, mean_output_tokens=mean_output_tokens, noise=backend.noise)
        if mean_output_tokens >= 2
        else verdicts.not_testable("the requests averaged under 2 output tokens: no TPOT")
    )
    if engine is not None:
        clocks_here = (
            f"TPOT P50 {client.tpot_ms['p50']:.1f} vs {engine.tpot_ms['p50']:.1f} ms; TTFT P50 "
            f"{client.ttft_ms['p50']:.0f} vs {engine.ttft_ms['p50']:.0f} ms"
        )
        clocks = verdicts.clocks_agree(client.tpot_ms["p50"], engine.tpot_ms["p50"])
    else:
        clocks_here = f"client TPOT P50 {client.tpot_ms['p50']:.1f} ms, TTFT P50 {client.ttft_ms['p50']:.0f} ms"
        clocks = verdicts.not_testable(backend.why_not("two_clocks"))
    qualitative = "(qualitative in the article)"
    return claims_table(
        [
            ("S9: disaggregating prefill and decode helps at scale", qualitative, *s9),
            (
                "S10: a bigger batch buys throughput with per-request latency: judge by goodput and P99",
                qualitative,
                *s10,
            ),
            (
                "S15: time TTFT and inter-token gaps from the stream, not the total latency",
                qualitative,
                f"{where}{client.completed} streamed requests: mean TTFT {mean_ttft_s * 1e3:.0f} ms, mean TPOT "
                f"{mean_tpot_s * 1e3:.1f} ms, {mean_output_tokens:.1f} output tokens on average",
                s15,
            ),
            (
                "(beyond the articles) client and engine agree on TPOT; TTFT differs by the HTTP path",
                "(method, not in the articles)",
                where + clocks_here,
                clocks,
            ),
        ],
        noise=backend.noise,
    )
