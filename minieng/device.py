"""Where minieng runs and in what: the device, the dtype and why, waiting for queued GPU work, the host's
memory and CPU. A leaf: it imports nothing of minieng, so the engine and the instruments both stand on it.

Dtype policy: fp32 on CPU (CPUs without bf16 units run bf16 matmuls pathologically slowly), bf16 on
CUDA GPUs of compute capability 8.0 or newer, fp16 on older GPUs (a T4: torch reports bf16 as
supported there, but only through emulation).
"""

from __future__ import annotations

import os
import platform

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def has_native_bf16(device: torch.device) -> bool:
    """True on CUDA devices of compute capability >= 8.0 (Ampere and newer)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8


def select_device(name: str = "auto") -> torch.device:
    """``"auto"``: the current CUDA device when one is available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but torch sees no CUDA GPU; use device='cpu' or 'auto'")
    return device


def select_dtype(name: str, device: torch.device) -> torch.dtype:
    """``"auto"``: float32 on CPU, bfloat16 on GPUs with native bf16, float16 on older GPUs."""
    return DTYPES[name] if name != "auto" else DTYPES[dtype_choice(device)[0]]


def dtype_choice(device: torch.device) -> tuple[str, str]:
    """The automatic dtype for ``device`` and the reason for it."""
    if device.type != "cuda":
        return "float32", "CPU: fp32 (bf16 matmuls are emulated and pathologically slow on most CPUs)"
    major, minor = torch.cuda.get_device_capability(device)
    if major >= 8:
        return "bfloat16", f"compute capability {major}.{minor} >= 8.0: native bf16"
    return "float16", (
        f"compute capability {major}.{minor} < 8.0: no native bf16 (torch may report it, through emulation), so fp16"
    )


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a wall-clock time covers it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_memory_bytes() -> tuple[int | None, int | None]:
    """(total, available) host RAM in bytes, from /proc/meminfo where it exists."""
    total = avail = None
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        total, avail = info.get("MemTotal"), info.get("MemAvailable")
    except OSError:
        if hasattr(os, "sysconf"):
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total, avail


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` knows (often only the
    architecture, e.g. "x86_64")."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity where the OS reports one, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
