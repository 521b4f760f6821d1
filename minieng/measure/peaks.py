"""The machine: which device and dtype to run in and why, its datasheet peaks, its measured ceilings.

Dtype policy: fp32 on CPU (CPUs without bf16 units run bf16 matmuls pathologically slowly),
bf16 on CUDA GPUs of compute capability 8.0 or newer, fp16 on older GPUs (a T4: torch reports
bf16 as supported there, but only through emulation).

Peaks come in two kinds, and every MFU/MBU says which it used:
- datasheet: the vendor's dense bf16/fp16 tensor peak and memory bandwidth (docs/architecture.md, FLOPs and bytes;
  sparse "2x" figures are not peaks); unknown devices (every CPU) have none;
- measured: the best this machine reaches on a large matmul in the engine's dtype and on a large
  device-to-device copy (bytes read + bytes written), measured by ``measure_ceilings`` (and kept
  per machine by ``ceilings.machine_ceilings``). On a GPU their buffers are sized from the memory
  free at the time (``ceiling_sizes``), so they fit beside an engine's KV pool.

A device as the napkin calculator sees it (``DeviceSpec``) adds the memory a program can use
(``DEVICE_MEMORY_MIB``: nvidia-smi's figures, not the product page's) less the CUDA context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


import torch

from minieng.device import cpu_name, dtype_choice, has_native_bf16, host_memory_bytes, select_device
from minieng.measure.harness import Measurement, measure
from minieng.measure.nvml import nvml_status
from minieng.measure.roofline import ridge_point
from minieng.core.llama import linear
from minieng.units import GIB

# Dense bf16/fp16 tensor peak (TFLOP/s) and memory bandwidth (GB/s), from vendor datasheets.
# Matched against torch's device name, most specific first ("A100" must not match "A10").
DATASHEET: list[tuple[tuple[str, ...], str, float, float]] = [
    (("H200",), "H200", 989, 4800),
    (("H100", "PCIe"), "H100 PCIe", 756, 2000),
    (("H100",), "H100 SXM", 989, 3350),
    (("A100", "80GB"), "A100 80GB SXM", 312, 2039),
    (("A100",), "A100 40GB", 312, 1555),
    (("L40S",), "L40S", 362, 864),
    (("A10",), "A10", 125, 600),
    (("L4",), "L4", 121, 300),
    (("T4",), "T4", 65, 320),
    (("RTX", "4090"), "RTX 4090", 165, 1008),
    (("RTX", "3090"), "RTX 3090", 71, 936),
    (("RTX", "3060"), "RTX 3060", 25, 360),
]

# The memory of each ``DATASHEET`` device that a program can use, MiB, and where the figure comes from:
# "nvidia-smi" is the total NVML reports, published from real machines (below the product page's
# "GB": a T4 sold as 16 GB shows 15,360 MiB, an L40S sold as 48 GB 46,068 MiB; ECC and the driver
# keep the rest); "nominal" is the product page's figure read as GiB, where no nvidia-smi figure was
# found: an upper bound. Sources: Modal's table of nvidia-smi totals (thundergolfer.com/blog/
# nvidia-gpu-memory-capacity; github.com/modal-labs/modal-client/pull/2797) for the H200, H100 80GB
# HBM3 (SXM), A100 80GB and 40GB, A10, L40S, L4 and T4; nvidia-smi outputs posted in GitHub issues for
# the RTX 4090 (RLinf/RLinf#255), 3090 (noonghunna/club-3090#390) and 3060
# (geerlingguy/raspberry-pi-pcie-devices#790).
DEVICE_MEMORY_MIB: dict[str, tuple[int, str]] = {
    "H200": (143_771, "nvidia-smi"),
    "H100 PCIe": (81_920, "nominal"),  # 80 GB; none published found
    "H100 SXM": (81_559, "nvidia-smi"),
    "A100 80GB SXM": (81_920, "nvidia-smi"),
    "A100 40GB": (40_960, "nvidia-smi"),
    "L40S": (46_068, "nvidia-smi"),
    "A10": (23_028, "nvidia-smi"),
    "L4": (23_034, "nvidia-smi"),
    "T4": (15_360, "nvidia-smi"),
    "RTX 4090": (24_564, "nvidia-smi"),
    "RTX 3090": (24_576, "nvidia-smi"),
    "RTX 3060": (12_288, "nvidia-smi"),
}
# What of nvidia-smi's total a program's tensors never get, on any GPU: the CUDA context (the driver's
# state and the kernels it loads: ~300 MB since CUDA 11.7 loads modules lazily, over 1 GB before;
# pytorch/pytorch#107667) and what the driver keeps out of the total it hands torch (a Colab T4: 15,360
# MiB to nvidia-smi, "14.75 GiB total capacity" = 15,104 MiB in torch's out-of-memory message;
# googlecolab/colabtools#3439). About 256 + 300 MiB: an estimate, rounded to 512 MiB.
CUDA_CONTEXT_BYTES = 512 * 1024**2
# The share of what the context leaves that the weights and the KV cache may take; the rest holds the
# activations and the allocator's slack. The engine's (``engine.memory_plan.HEADROOM``, which the instruments
# may not import: a test keeps the two equal) and vLLM's default ``gpu_memory_utilization``.
MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class Peak:
    """A compute peak and a bandwidth, and where they come from ("datasheet" or "measured")."""

    name: str
    peak_tflops: float
    bandwidth_gbps: float
    source: str

    def to_dict(self) -> dict:
        """JSON form, with the ridge point (``from_dict`` reads it back)."""
        return {
            "name": self.name,
            "peak_tflops": self.peak_tflops,
            "bandwidth_gbps": self.bandwidth_gbps,
            "source": self.source,
            "ridge_flop_per_byte": self.ridge_flop_per_byte,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Peak":
        return cls(d["name"], d["peak_tflops"], d["bandwidth_gbps"], d["source"])

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity where the roofline turns: peak FLOP/s / bytes/s."""
        return ridge_point(self.peak_tflops * 1e12, self.bandwidth_gbps * 1e9)


def datasheet_peak(device_name: str) -> Peak | None:
    """The datasheet entry for a GPU name as torch reports it, or None if unknown.

    Names are compared word by word ("NVIDIA L40" is not an L4, "NVIDIA T400" not a T4).
    """
    words = set(re.split(r"[\s\-_]+", device_name))
    for keys, name, tflops, gbps in DATASHEET:
        if all(k in words for k in keys):
            return Peak(name, tflops, gbps, "datasheet")
    return None


# The dtypes the calculator knows: name -> (bytes per element of the model's float tensors: embedding,
# norms, activations and the KV cache; the weight-only quantization of the matrix products, or None).
# Weight-only schemes read integer codes and their scales (``quantization.matmul_bytes``, groups of
# ``quantization.DEFAULT_GROUP_SIZE`` for int4) and compute in the device's float dtype, so their compute peak is that dtype's.
NAPKIN_DTYPES: dict[str, tuple[float, str | None]] = {
    "bf16": (2, None),
    "fp16": (2, None),
    "fp32": (4, None),
    "int8 weights, bf16 KV": (2, "int8"),
    "int4 weights, bf16 KV": (2, "int4"),
}
TORCH_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}  # torch's names -> the table's


@dataclass(frozen=True)
class DeviceSpec:
    """A device as the calculator sees it: its dense peak, its bandwidth and its memory.

    Attributes:
        name: "H100 SXM", or "this machine (...)" for measured ceilings.
        peak_tflops: dense tensor peak, TFLOP/s, for ``peak_dtype``.
        bandwidth_gbps: memory bandwidth, GB/s (1e9 bytes/s).
        memory_bytes: the device's memory as a program sees it (``peaks.DEVICE_MEMORY_MIB``: a GPU's
            nvidia-smi total; torch's total on this machine's GPU; a CPU's host RAM), bytes.
        source: "datasheet" or "measured".
        peak_dtype: the dtype the peak is for: "bf16/fp16" for a datasheet (its dense tensor
            figure), the measured dtype's table name ("fp32") for this machine's ceilings.
        context_bytes: what the CUDA context holds of it before anything is allocated
            (``peaks.CUDA_CONTEXT_BYTES`` on a GPU, 0 on a CPU).
        memory_source: where ``memory_bytes`` comes from ("nvidia-smi", "nominal", "torch", "host RAM").
    """

    name: str
    peak_tflops: float
    bandwidth_gbps: float
    memory_bytes: float
    source: str
    peak_dtype: str = "bf16/fp16"
    context_bytes: float = 0
    memory_source: str = "nvidia-smi"

    @property
    def ridge_flop_per_byte(self) -> float:
        """Peak FLOP/s / bandwidth bytes/s: the arithmetic intensity where the roofline turns."""
        return ridge_point(self.peak_tflops * 1e12, self.bandwidth_gbps * 1e9)

    @property
    def budget_bytes(self) -> float:
        """What the weights and the KV cache may take: ``MEMORY_UTILIZATION`` (90%) of the memory
        after the CUDA context. The engine refuses a plan past it."""
        return MEMORY_UTILIZATION * (self.memory_bytes - self.context_bytes)

    def covers(self, dtype: str) -> bool:
        """Whether the peak is the one ``dtype``'s products run at. Weight-only schemes (int8, int4)
        compute in the device's own float dtype (their codes are dequantized to it): always covered."""
        if NAPKIN_DTYPES[dtype][1]:
            return True
        if self.peak_dtype == "bf16/fp16":
            return dtype == "fp16" if self.name == "T4" else dtype in ("bf16", "fp16")
        return dtype == self.peak_dtype

    def native_dtype(self) -> str:
        """The dtype its peak is for: fp16 on a T4 (no bf16 units), bf16 on other datasheet GPUs, the
        measured dtype for this machine."""
        if self.peak_dtype == "bf16/fp16":
            return "fp16" if self.name == "T4" else "bf16"
        return self.peak_dtype


def datasheet_devices() -> list[DeviceSpec]:
    """Every device of ``peaks.DATASHEET`` with the memory a program can use (``peaks.DEVICE_MEMORY_MIB``)
    and the CUDA context's share of it, in the table's order."""
    return [
        DeviceSpec(name, tflops, gbps, mib * 1024**2, "datasheet", context_bytes=CUDA_CONTEXT_BYTES, memory_source=src)
        for _, name, tflops, gbps in DATASHEET
        for mib, src in [DEVICE_MEMORY_MIB[name]]
    ]


def measured_device(peak: Peak, memory_bytes: float, dtype: str, gpu: bool = False) -> DeviceSpec:
    """This machine as the calculator sees it: the measured ceilings (``ceilings.Ceilings.peak``: the
    best matmul's FLOP/s and the best copy's bytes/s), its memory in bytes (a GPU's total as torch
    reports it, less the CUDA context when ``gpu``; or the host's RAM on a CPU), and the dtype the
    ceilings were measured in (torch's name, "float32", or the table's, "fp32"). Raises ``ValueError``
    for a dtype the table does not know."""
    name = TORCH_DTYPE_NAMES.get(dtype, dtype)
    if name not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype={dtype!r}: the ceilings are measured in one of {', '.join(TORCH_DTYPE_NAMES)}")
    context, source = (CUDA_CONTEXT_BYTES, "torch") if gpu else (0, "host RAM")
    return DeviceSpec(
        f"this machine ({peak.name})", peak.peak_tflops, peak.bandwidth_gbps, memory_bytes, "measured", name,
        context, source,
    )  # fmt: skip


def this_machine_device(ceilings) -> DeviceSpec | None:
    """This machine as a ``DeviceSpec``: its ``ceilings`` (a ``ceilings.Ceilings``, from
    ``machine_ceilings``) and the memory of their device (a GPU's total, or the host's RAM; None
    where the OS does not say)."""
    import torch  # lazy: the arithmetic of this module needs no torch

    device = torch.device(ceilings.device)
    if device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        memory = host_memory_bytes()[0] or 0
    if not memory:
        return None
    return measured_device(ceilings.peak, memory, ceilings.dtype, gpu=device.type == "cuda")


@dataclass
class Environment:
    """What ``check_environment`` found, and the configuration it picked."""

    device: str
    device_name: str
    compute_capability: str | None
    native_bf16: bool
    gpu_memory_bytes: int | None
    host_ram_bytes: int | None
    host_ram_available_bytes: int | None
    nvml: str
    torch_threads: int
    dtype: str
    dtype_reason: str
    datasheet: Peak | None

    def lines(self) -> list[str]:
        gib = lambda b: "N/A" if b is None else f"{b / 1024**3:.1f} GiB"  # noqa: E731
        ds = self.datasheet
        return [
            f"device            {self.device} ({self.device_name})",
            f"compute capability {self.compute_capability or 'N/A'}; native bf16: {self.native_bf16}",
            f"GPU memory        {gib(self.gpu_memory_bytes)}",
            f"host RAM          {gib(self.host_ram_bytes)} ({gib(self.host_ram_available_bytes)} available)",
            f"NVML              {self.nvml}",
            f"torch threads     {self.torch_threads}",
            f"dtype             {self.dtype}: {self.dtype_reason}",
            "datasheet peak    "
            + (
                f"{ds.name}: {ds.peak_tflops:g} TFLOP/s dense, {ds.bandwidth_gbps:g} GB/s"
                if ds
                else "none for this device: measured ceilings only"
            ),
        ]


def check_environment(device: str = "auto") -> Environment:
    """Inspect the machine and pick the device and dtype, saying why."""
    dev = select_device(device)
    dtype, reason = dtype_choice(dev)
    total, avail = host_memory_bytes()
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        name, cc, mem = props.name, f"{props.major}.{props.minor}", props.total_memory
    else:
        name, cc, mem = cpu_name() or "CPU", None, None
    return Environment(
        str(dev),
        name,
        cc,
        has_native_bf16(dev),
        mem,
        total,
        avail,
        nvml_status(dev) if dev.type == "cuda" else "N/A (no CUDA device)",
        torch.get_num_threads(),
        dtype,
        reason,
        datasheet_peak(name) if dev.type == "cuda" else None,
    )


# -- the ceilings' buffers: sized from what the device has free ------------------------------------

GPU_MATMUL_N = 8192  # the matmul's side on a GPU with room for it: large enough to fill an H200
CPU_MATMUL_N = 2048
GPU_COPY_BYTES = 2 * GIB  # each of the copy's two buffers, on a GPU with room for them
CPU_COPY_BYTES = 256 * 1024**2
# The share of the device's free memory the ceilings may take (the matmul's three matrices and the
# copy's two buffers together): the rest stays for whatever else is resident (an engine's pool).
CEILINGS_MEMORY_SHARE = 0.5
MIN_MATMUL_N = 1024
# The smallest copy buffer that still measures DRAM, not the cache: well past the largest L2 (H100/H200: 50 MB).
MIN_COPY_BYTES = 128 * 1024**2


def device_free_bytes(device: torch.device) -> int:
    """Bytes the CUDA device has free now (``torch.cuda.mem_get_info``), after torch hands back the
    blocks its allocator keeps cached but unused."""
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


def ceiling_sizes(device: torch.device, dtype: torch.dtype, free_bytes: int | None = None) -> tuple[int, int]:
    """``(matmul_n, copy_bytes)``: the side of the matmul's square matrices and the bytes of each
    of the copy's two buffers.

    On a CPU: 2048 and 256 MiB. On CUDA, at most 8192 and 2 GiB, within ``CEILINGS_MEMORY_SHARE``
    of ``free_bytes`` (default: the device's free memory now), the matmul taking at most a quarter
    of that share (in steps of 1024), the copy the rest. So a T4 whose memory an engine's KV pool
    already holds gets smaller buffers, not an out-of-memory error.

    Raises:
        RuntimeError: too little free memory for a 1024-cube matmul and two 128 MiB buffers (the
            smallest copy that still measures memory, not the cache), with what to do about it.
    """
    if device.type != "cuda":
        return CPU_MATMUL_N, CPU_COPY_BYTES
    free = device_free_bytes(device) if free_bytes is None else free_bytes
    share = int(CEILINGS_MEMORY_SHARE * free)
    n = min(GPU_MATMUL_N, int((share / 4 / (3 * dtype.itemsize)) ** 0.5) // 1024 * 1024)
    copy_bytes = min(GPU_COPY_BYTES, (share - 3 * n * n * dtype.itemsize) // 2 // 1024**2 * 1024**2)
    if n < MIN_MATMUL_N or copy_bytes < MIN_COPY_BYTES:
        raise RuntimeError(
            f"only {free / GIB:.2f} GiB free on {device}: the ceilings need at least "
            f"{(3 * MIN_MATMUL_N**2 * dtype.itemsize + 2 * MIN_COPY_BYTES) / CEILINGS_MEMORY_SHARE / GIB:.2f} GiB "
            "free (a 1024-cube matmul and two 128 MiB copy buffers, in half the free memory). Measure them before "
            "building an engine (ceilings.machine_ceilings keeps them per machine), or give the engine a smaller KV "
            "pool (kv_cache_memory_gib, or a lower gpu_memory_utilization)"
        )
    return n, copy_bytes


def measure_matmul(device: torch.device, dtype: torch.dtype, n: int | None = None, repeats: int = 5) -> Measurement:
    """FLOP/s of an n x n x n matrix product (2 n^3 FLOPs) in ``dtype``: the compute ceiling.

    ``n`` defaults to ``ceiling_sizes``' (2048 on a CPU; on a GPU up to 8192, as free memory allows).
    The product is ``llama.linear``, the kernel the engine's linear layers run, so that MFU
    compares the engine's products with the best its own kernel does. On an x86-64 CPU in float32
    that is oneDNN, which ran a 2048-cube at 0.18-0.19 TFLOP/s on a 2-core AMD EPYC (Zen 4) where
    ``a @ b`` (MKL's sgemm) ran at 0.12-0.14: with the slower kernel as
    the ceiling, a long prefill read 90% MFU. Elsewhere it is ``F.linear`` (cuBLAS on CUDA). The
    measurement's fingerprint records ``matmul_n``.
    """
    n = n or ceiling_sizes(device, dtype)[0]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    m = measure(lambda: linear(a, b), device, repeats=repeats).rate(2 * n**3, "FLOP/s")
    m.fingerprint["matmul_n"] = n
    return m


def measure_copy(device: torch.device, nbytes: int | None = None, repeats: int = 5) -> Measurement:
    """Bytes/s of a large copy, counting bytes read plus bytes written: the bandwidth ceiling.

    ``nbytes`` (each of the two buffers) defaults to ``ceiling_sizes``' (256 MiB on a CPU; on a GPU
    up to 2 GiB, as free memory allows). The fingerprint records ``copy_bytes``."""
    nbytes = nbytes or ceiling_sizes(device, torch.float32)[1]
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    m = measure(lambda: dst.copy_(src), device, repeats=repeats).rate(2 * src.nbytes, "B/s")
    m.fingerprint["copy_bytes"] = src.nbytes
    return m


def measure_ceilings(
    device: torch.device, dtype: torch.dtype, repeats: int = 5, rounds: int = 3
) -> tuple[Peak, Measurement, Measurement]:
    """Measured peak (matmul) and bandwidth (copy) as a ``Peak``, with the raw measurements.

    ``rounds`` rounds of ``repeats`` matmuls, then ``repeats`` copies, alternating, so that a
    burst of other work on the machine slows some of each, not all of one. A ceiling is the best
    rate the machine sustains, and other work only ever slows a run, so the ``Peak`` takes the
    best run of each (their ``max``); the measurements keep every run, so their ``spread`` says
    how steady the machine was. The buffers are sized once (``ceiling_sizes``: on CUDA from the
    free memory) and handed back to the device afterwards.
    """
    n, nbytes = ceiling_sizes(device, dtype)
    mm, cp = [], []
    for _ in range(rounds):
        mm.append(measure_matmul(device, dtype, n=n, repeats=repeats))
        cp.append(measure_copy(device, nbytes=nbytes, repeats=repeats))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    matmul, copy = Measurement.pooled(mm), Measurement.pooled(cp)
    return (
        Peak(
            f"measured {device.type} {str(dtype).removeprefix('torch.')}", matmul.max / 1e12, copy.max / 1e9, "measured"
        ),
        matmul,
        copy,
    )
