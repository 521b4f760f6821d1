"""Derive the Azure LLM inference trace 2023's quantiles, the figures the course keeps of it.

The trace's licence (CC BY 4.0) would allow a copy, but the course keeps only figures derived
from it, as the workshop's data README asks: per service, the quantiles of prompt length, output
length and inter-arrival gap, and the request rate. ``minieng.measure.workloads.sampled_trace_workload``
draws trace-shaped requests from them wherever the CSVs are absent.

    python benchmarks/trace_quantiles.py [--source ../shared/data/azure-llm-trace-2023] [--out data/azure-llm-trace-2023]

writes ``quantiles.json`` and ``README.md`` into ``--out`` (tests/test_workload.py checks that the
committed files are what this script writes, where the CSVs are present).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

from minieng.measure.workloads import TRACE_PROBABILITIES, TRACE_SERVICES, read_trace, trace_quantiles

REPO = Path(__file__).resolve().parents[1]
SOURCE = "Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_{conv,code}.csv"
LICENSE = "Creative Commons Attribution 4.0 International (CC BY 4.0)"
ATTRIBUTION = 'Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024'
SERVICE_NAMES = {"conv": "conversation", "code": "code completion"}


def derive(source_dir: Path) -> dict:
    """The quantiles document of the two services' CSVs in ``source_dir`` (conv.csv, code.csv)."""
    return {
        "source": SOURCE,
        "license": LICENSE,
        "attribution": ATTRIBUTION,
        "derived_with": "benchmarks/trace_quantiles.py (numpy.quantile, linear interpolation)",
        "probabilities": list(TRACE_PROBABILITIES),
        "services": {s: trace_quantiles(read_trace(source_dir / f"{s}.csv")) for s in TRACE_SERVICES},
    }


def readme(doc: dict) -> str:
    """The folder's README: source, licence, attribution, what was derived and how, a summary table."""
    probs = doc["probabilities"]
    at = [probs.index(p) for p in (0.5, 0.9, 0.99)]
    rows = [
        f"| {service} | {name} | " + " | ".join(f"{q[name][i]:g}" for i in at) + " |"
        for service, q in doc["services"].items()
        for name in ("prompt_tokens", "output_tokens", "interarrival_s")
    ]
    table = "\n".join(["| service | figure | p50 | p90 | p99 |", "| --- | --- | --- | --- | --- |", *rows])
    rates = "; ".join(
        f"{s}: {q['num_requests']:,} requests over {q['duration_s']:,.0f} s, {q['rate_per_s']:.3f} req/s"
        for s, q in doc["services"].items()
    )
    services = " and ".join(f"`{s}` ({SERVICE_NAMES[s]})" for s in doc["services"])
    bullets = [
        f"**Source:** {doc['source']}: November 2023, one hour of each service, {services}.",
        f"**Licence:** {doc['license']}.",
        f"**Attribution:** {doc['attribution']}.",
    ]
    bullets = "\n".join(textwrap.fill(b, 98, initial_indent="- ", subsequent_indent="  ") for b in bullets)
    return f"""# Azure LLM inference trace 2023: derived quantiles

This folder holds figures derived from the Azure LLM inference trace 2023, not the trace itself.
No request of the trace is stored here.

{bullets}

**How they were derived.** `python benchmarks/trace_quantiles.py` read the two CSV files and took
numpy's `quantile` (linear interpolation) of each service's prompt lengths (`ContextTokens`),
output lengths (`GeneratedTokens`) and gaps between successive arrivals (from `TIMESTAMP`), at the
{len(probs)} probabilities listed in `quantiles.json`: every percentile, finer in the top one. Also
the number of requests, the span from first to last arrival, and the rate (gaps per second of
that span). Tokens are rounded to 0.001, seconds to 0.000001.

**How the course uses them.** `minieng.measure.workloads.sampled_trace_workload` draws requests from these
quantiles by inverse-CDF sampling (`python -m minieng bench --workload trace` without `--trace`;
notebook 10 without the CSV). Each request's prompt length, output length and gap are drawn
independently: the workload has the trace's distributions of sizes and gaps, not the correlations
between them (bursts, a long prompt paired with a long answer). Where you have the CSV, replay
the real trace with `--trace PATH`.

{table}

{rates}.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--source",
        type=Path,
        default=REPO.parent / "shared" / "data" / "azure-llm-trace-2023",
        help="folder with conv.csv and code.csv",
    )
    parser.add_argument("--out", type=Path, default=REPO / "data" / "azure-llm-trace-2023")
    args = parser.parse_args(argv)
    doc = derive(args.source)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quantiles.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (args.out / "README.md").write_text(readme(doc), encoding="utf-8")
    print(f"wrote quantiles.json and README.md into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
