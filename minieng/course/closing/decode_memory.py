"""Notebook 03's closing claims table: S3 (no decode step beats bytes / bandwidth), the KV cache's
bytes joining the weights' as context grows (beyond the articles) and S16 (a bigger batch does not
speed a compute-bound prefill)."""

from __future__ import annotations

from minieng.course import verdicts
from minieng.course.kit import claims_table
from minieng.measure.roofline import format_percent, tpot_floor_s


def table(*, b1, kv_res, kv_batch: int, batched, probe: dict, lesson_model, measured, article_gb: float, noise=None):
    """The claims table of notebook 03. ``b1``, ``kv_res``, ``batched``: ``decode_runs``' batch-1
    decode, context sweep (of ``kv_batch`` sequences) and prefill batches (each judged on its own
    ``.noise``); ``measured``:
    the machine's measured ``Peak``; ``article_gb``: the article's model size (GB)."""
    u1 = b1["measured"]
    tpot_s = b1["seconds"] / b1["num_steps"]
    step_bytes = b1["bytes"] / b1["num_steps"]
    floor_s = tpot_floor_s(step_bytes, measured.bandwidth_gbps * 1e9)
    notes = (["the step is limited by overhead, not bytes"] if u1["limit"] == "overhead" else []) + (
        [lesson_model.why] if lesson_model.bytes_dominate is False else []
    )
    first, last = kv_res["rows"][0], kv_res["rows"][-1]
    kv_share = last["kv_bytes"] / (last["kv_bytes"] + last["weight_bytes"])
    rows = batched["rows"]
    tok_s, batches, tokens = [r["tok_s"] for r in rows], [r["batch_size"] for r in rows], rows[0]["prompt_tokens"]
    past_knee = probe["knee_reached"] and tokens >= probe["knee_tokens"]
    article_tok_s = 1 / tpot_floor_s(article_gb * 1e9, measured.bandwidth_gbps * 1e9)
    return claims_table(
        [
            (
                "S3: TPOT_min = bytes per step / bandwidth",
                "RTX 3060: 10.8 GB / 360 GB/s, ~33 tok/s",
                f"floor {floor_s * 1e3:.2f} ms ({step_bytes / 1e6:.0f} MB / {measured.bandwidth_gbps:.3g} GB/s), measured "
                f"{tpot_s * 1e3:.2f} ms, MBU {format_percent(u1['mbu_percent'])}; the article's {article_gb} GB here: "
                f"at most {article_tok_s:.1f} tok/s",
                verdicts.s3_floor(tpot_s, floor_s=floor_s, noise=b1.noise, note="; ".join(notes)),
            ),
            (
                "(beyond the articles) KV bytes join weight bytes at long context",
                "MBU must count the KV cache",
                f"batch {kv_batch} at {last['context_tokens']:,} tokens: "
                f"KV {100 * kv_share:.0f}% of the bytes; TPOT grew {last['tpot_s'] / first['tpot_s']:.2f}x against the "
                f"floor's {last['floor_s'] / first['floor_s']:.2f}x",
                verdicts.kv_joins_weights(
                    first["tpot_s"],
                    last["tpot_s"],
                    floor_first_s=first["floor_s"],
                    floor_last_s=last["floor_s"],
                    limit_first=first["limit"],
                    noise=kv_res.noise,
                ),
            ),
            (
                "S16: a bigger batch does not speed prefill once it is compute-bound",
                "(qualitative)",
                f"{tokens}-token prompts ({'past' if past_knee else 'not past'} the probe's knee), one step per batch: "
                + ", ".join(f"{b}: {t:,.0f} tok/s" for b, t in zip(batches, tok_s)),
                verdicts.s16_prefill_batch(tok_s, batch_sizes=batches, noise=batched.noise),
            ),
        ],
        noise=noise,
    )
