"""The GPU path's checks: what ``benchmarks/gpu_check.py`` (``make gpu-check``) runs on one CUDA GPU.
A maintainer's harness beside the package, not in it: nothing in ``minieng`` imports it.

In a few minutes and with no network, on random-weight checkpoints of three real shapes made on
the device (``checkpoints``: SmolLM2-135M, SmolLM2-1.7B, and a 7B Llama with head_dim 64):

- ``parity``: logits and greedy tokens against transformers, fp32 and bf16;
- ``speed``: TTFT and prefill MFU at 512, 4,096 and 16,384 prompt tokens, and what the first
  request of a new length pays over a warm one; TPOT and MBU at batch 1, 8, 64 and 256, with CUDA
  graphs and eager; NVML util.gpu and GPM SM occupancy / DRAM bandwidth during batch-1 decode;
- ``decode_paths``: the 1.7B shape's decode eager, with graphs, compiled and with the Triton
  attention kernel, and the kernels one step launches;
- ``features``: the prefix cache (TTFT against the hit rate at 16,384-token prompts, and the cold
  baseline), speculative decoding (the 1.7B shape with the 135M shape as draft: c, v and the
  machinery), quantization (per scheme TTFT and TPOT at batch 1 and 16 as ratios to bf16, beside
  the bytes and FLOP-rate predictions), tensor parallelism (decode at 1 and 2 ranks, the step
  split into compute and all-reduces; needs two GPUs, skipped with one);
- ``targets``: the GPU path's targets, each PASS or MISS with the figures it compares;
- ``predictions``: issue 33's predictions of what a GPU will do, each CONFIRMED, REFUTED or
  UNTESTED by a measurement (``--sections pred`` runs them alone, in about 3 minutes on an H200):
  the table and its verdicts in ``verdicts``, the measurements in ``memory_peaks``, ``path_checks``,
  ``step_dispatch``, ``kernel_times`` and ``compiled_regions``.

``run.run_gpu_check`` runs them (``smoke=True``: tiny shapes, every section in seconds on any
device, what the CPU tests run) and ``report.summary_lines`` prints the result.
"""

from .report import summary_lines
from .run import SECTIONS, pick_device, run_gpu_check

__all__ = ["pick_device", "run_gpu_check", "SECTIONS", "summary_lines"]
