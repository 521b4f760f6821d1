"""Notebook 12's closing claims table: S6's scheduler half (continuous against static batching on
the same arrivals) and the KV pool's cap on concurrency."""

from __future__ import annotations

from minieng.course import verdicts
from minieng.course.kit import claims_table
from minieng.lab.continuous_batching import tails


def table(*, serve, cap, noise=None):
    """The claims table of notebook 12. ``serve``: ``compare_batching``'s cached result (static and
    continuous runs); ``cap``: ``concurrency_run``'s. The serving verdict is judged with the noise
    of the run that measured it (``serve.noise``, else ``noise``)."""
    s, c = serve["runs"]["static"]["metrics"], serve["runs"]["continuous"]["metrics"]
    t = tails(serve)
    (tl, tk), (el, ek) = t["ttft_ms"], t["e2el_ms"]
    return claims_table(
        [
            (
                "S6: continuous batching beats batching whole batches",
                "admit new requests into the running batch",
                f"same Poisson arrivals: {c['output_throughput_tok_s']:.0f} vs {s['output_throughput_tok_s']:.0f} tok/s; "
                f"E2EL ({el}) {c['e2el_ms'][ek]:.0f} vs {s['e2el_ms'][ek]:.0f} ms; TTFT ({tl}) {c['ttft_ms'][tk]:.0f} vs "
                f"{s['ttft_ms'][tk]:.0f} ms",
                verdicts.s6_continuous(
                    c["output_throughput_tok_s"],
                    s["output_throughput_tok_s"],
                    c["e2el_ms"][ek] / 1e3,
                    s["e2el_ms"][ek] / 1e3,
                    noise=getattr(serve, "noise", None) or noise,
                    e2el_tail=el,
                ),
            ),
            (
                "(beyond the articles) the KV pool caps concurrency",
                "(not in the articles)",
                f"{cap['peak_running']} at once in {cap['num_blocks']} blocks (pool holds {cap['cap_at_prompt']} prompts, "
                f"{cap['cap_at_full_length']} full sequences); {cap['num_preemptions']} preemptions",
                verdicts.kv_pool_caps(
                    cap["peak_running"], cap_at_prompt=cap["cap_at_prompt"], num_preemptions=cap["num_preemptions"]
                ),
            ),
        ],
        noise=noise,
    )
