"""The GPU path's checks, in one script: python benchmarks/gpu_check.py [--out DIR] [--smoke].

Runs on one CUDA GPU in a few minutes with no network, and prints and writes as JSON
(``gpu_check.json`` under ``--out``, default ``$OUT`` or ``results/``): parity with transformers,
each shape's prefill and decode (graphs and eager), the decode paths, the prefix cache,
speculative decoding, NVML during decode, quantization, tensor parallelism, the GPU path's
targets as PASS or MISS, and issue 33's predictions, one line each: ``PRED <id> CONFIRMED|REFUTED
<figure> <unit> (<= bound)``, or ``PRED <id> UNTESTED (why)`` where this device cannot decide
(``gpu_checks.predictions``, their table in ``gpu_checks.verdicts``; ``--sections pred`` runs them
alone, about 3 minutes on an H200). The checks live beside this script in ``benchmarks/gpu_checks/``
(its docstring lists them); ``--notebooks`` adds notebooks 00-04 run on the device by the course
runner. ``--smoke`` runs every section on tiny shapes (CPU tests use it: ``--smoke --device cpu``);
its figures mean nothing, but the predictions a CPU can decide are decided.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gpu_checks import SECTIONS, pick_device, run_gpu_check, summary_lines  # benchmarks/gpu_checks/

COURSE_ON_DEVICE = ["00", "01", "02", "03", "04"]  # the notebooks --notebooks runs: hardware to utilization


def course_on_device(output_dir: Path) -> dict:
    """Notebooks 00-04 in smoke mode on this device, each with the model it picks here: their
    status, time and the articles' claims as they read on this device."""
    from minieng.course.runner import run_course  # lazy: nbclient is the notebooks extra's

    summary = run_course(output_dir=output_dir, only=COURSE_ON_DEVICE, smoke=True, progress=False)
    keep = ("name", "status", "wall_s", "error")
    return {
        "wall_s": summary["wall_s"],
        "notebooks": [{k: r.get(k) for k in keep} for r in summary["notebooks"]],
        "claims": summary["claims"],
        "output_dir": str(output_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "results"), help="folder for gpu_check.json")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, every section, seconds (tests)")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    parser.add_argument(
        "--notebooks",
        action="store_true",
        help="also run notebooks 00-04 in smoke mode on this device (the course runner; needs the notebooks extra)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    extra = {"notebooks": lambda: course_on_device(out / "course")} if args.notebooks else None
    result = run_gpu_check(pick_device(args.device), args.smoke, args.sections.split(","), extra)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str))
    print("\n".join(summary_lines(result)))
    print(f"wrote {out / 'gpu_check.json'} in {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
