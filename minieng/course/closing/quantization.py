"""Notebook 08's closing claims table: S13 (quantization helps decode more than prefill), S3 (decode
follows the bytes), W8A8's prefill, the outliers' price, W8A8's amplified float noise, and the
engine's own target."""

from __future__ import annotations

from minieng.course import verdicts
from minieng.course.kit import claims_table

ACCURACY_KEYS = ("w8a8, 8-bit per token (simulated)", "w8a8, 8-bit per tensor (simulated)")


def _noise_row(amp: dict, no_kernel: str):
    claim = ("(beyond the articles) W8A8 amplifies float noise", "(not in the articles)")
    if "w8a8" not in amp["nudge"]:
        return (*claim, "no W8A8 run", verdicts.not_testable(no_kernel))
    nf, nw = amp["nudge"]["none"], amp["nudge"]["w8a8"]
    bf, bw = amp["batched"]["none"], amp["batched"]["w8a8"]
    here = (
        f"a {amp['epsilon']:.0e} nudge moves logits {nw['max_dlogit']:.2g} (float {nf['max_dlogit']:.2g}), flips "
        f"{nw['flips']} of {nw['positions']} greedy choices (float {nf['flips']}); together vs alone, {bw['differ']} "
        f"of {bw['requests']} requests differ (float {bf['differ']})"
    )
    return (
        *claim,
        here,
        verdicts.amplifies_float_noise(
            nw["max_dlogit"],
            nf["max_dlogit"],
            flips=nw["flips"],
            positions=nw["positions"],
            requests_changed=bw["differ"],
            requests=bw["requests"],
        ),
    )


def table(*, res, acc: dict, amp: dict, batch: int, no_w8a8_kernel: str = "no W8A8 kernel here"):
    """The claims table of notebook 08. ``res``: ``run_quantization``'s cached result (its ``.noise``
    judges every timing verdict: the noise of the run that timed the schemes); ``acc``: ``quality``'s
    result (the two simulated W8A8 variants included); ``amp``: ``float_noise_amplification``'s;
    ``batch``: the decode batch the TPOT verdicts read."""
    noise = getattr(res, "noise", None)
    rows = {r["scheme"]: r for r in res["rows"]}
    tpot = f"tpot_b{batch}_ratio"
    schemes = res["rows"][1:]
    weight_only = [s for s in ("int8", "int4") if s in rows]
    best_wo = min(weight_only, key=lambda s: rows[s][tpot]) if weight_only else None
    fastest = min(schemes, key=lambda r: r[tpot]) if schemes else None
    accurate = [r for r in schemes if r["agreement"] >= verdicts.TARGET_AGREEMENT]
    best = min(accurate, key=lambda r: r[tpot]) if accurate else None
    tok, ten = (acc[k] for k in ACCURACY_KEYS)
    out = []
    if best_wo:
        w = rows[best_wo]
        out.append(
            (
                "S13: quantization helps decode much more than prefill",
                "no figure (in words: large for decode, modest for prefill)",
                f"{best_wo}: batch-{batch} TPOT {w[tpot]:.2f}x, TTFT {w['ttft_ratio']:.2f}x of float's",
                verdicts.s13_quantization(w["ttft_ratio"], w[tpot], noise=noise),
            )
        )
    if fastest:
        f = fastest
        out.append(
            (
                "S3: decode time follows the bytes (TPOT_min = bytes / bandwidth)",
                "TPOT_min = P b / BW",
                f"{f['scheme']}: bytes {f[tpot + '_predicted']:.2f}x, TPOT {f[tpot]:.2f}x of float's",
                verdicts.s3_bytes_ratio(f[tpot], bytes_ratio=f[tpot + "_predicted"], scheme=f["scheme"], noise=noise),
            )
        )
    if "w8a8" in rows and best_wo:
        out.append(
            (
                "W8A8 speeds prefill too (integer arithmetic)",
                "(not in the articles)",
                f"TTFT w8a8 {rows['w8a8']['ttft_ratio']:.2f}x vs {best_wo} {rows[best_wo]['ttft_ratio']:.2f}x of "
                "float's",
                verdicts.w8a8_prefill(
                    rows["w8a8"]["ttft_ratio"], rows[best_wo]["ttft_ratio"], weight_only=best_wo, noise=noise
                ),
            )
        )
    out.append(
        (
            "activation outliers are W8A8's price",
            "(not in the articles)",
            f"8-bit per token {tok['agreement']:.1%} vs per tensor {ten['agreement']:.1%} agreement (KL "
            f"{tok['kl_nats']:.3f} vs {ten['kl_nats']:.3f} nats)",
            verdicts.outliers_price(tok, ten),
        )
    )
    out.append(_noise_row(amp, no_w8a8_kernel))
    out.append(
        (
            "engine target: a scheme at <= 0.5x batch-1 TPOT with >= 90% agreement",
            "(the engine's own target, not the article)",
            f"{best['scheme']}: {best[tpot]:.2f}x TPOT, {best['agreement']:.1%} agreement"
            if best
            else "no scheme reached 90% agreement",
            verdicts.quantization_target(
                best[tpot] if best else None,
                agreement=best["agreement"] if best else None,
                scheme=best["scheme"] if best else None,
                noise=noise,
            ),
        )
    )
    return claims_table(out, noise=noise)
