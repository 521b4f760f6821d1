"""Which device and dtype the engine runs in, and why.

fp32 on CPU (CPUs without bf16 units run bf16 matmuls pathologically slowly), bf16 on CUDA
GPUs of compute capability 8.0 or newer, fp16 on older GPUs (a T4: torch reports bf16 there,
but only through emulation).
"""

from __future__ import annotations

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
    if name != "auto":
        return DTYPES[name]
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if has_native_bf16(device) else torch.float16


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a wall-clock time covers it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
