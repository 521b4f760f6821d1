"""The integer arithmetic of minieng's quantization schemes, shared by the kernels (``quant_kernels``) and
the dequantized reference they are tested against (``quantization.ReferenceLinear``): symmetric int8 per
output channel, int4 in groups with a scale and a zero, and per-token activation rounding.
"""

from __future__ import annotations

import torch


def quantize_per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: weight [out, in] -> (q [out, in] int8 in [-127, 127],
    scale [out] float32 = max|w| of the row / 127), so that |w - q scale| <= scale / 2."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_per_channel_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q [out, in] int8, scale [out] -> float32 weights [out, in]."""
    return q.float() * scale.float()[:, None]


def quantize_int4_grouped(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit in groups of ``group_size`` consecutive inputs (tinygemm's convention).

    weight [out, in] -> (q [out, in] uint8 in 0..15, scale [out, groups], zero [out, groups]),
    scale and zero in the weight's dtype, w ~ (q - 8) scale + zero: scale = (max - min) / 15 of
    the group and zero = min + 8 scale, so |w - w~| <= scale / 2 (plus the dtype's rounding of
    scale and zero). Raises ``ValueError`` when ``group_size`` does not divide ``in``.
    """
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise ValueError(f"group_size={group_size} does not divide in_features={in_features}")
    g = weight.float().reshape(out_features, in_features // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    zero = lo + 8 * scale
    return q.reshape(out_features, in_features), scale.to(weight.dtype), zero.to(weight.dtype)


def dequantize_int4_grouped(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """q [out, in] (0..15), scale and zero [out, groups] -> float32 weights [out, in]."""
    out_features, in_features = q.shape
    g = q.float().reshape(out_features, -1, group_size)
    return ((g - 8) * scale.float()[..., None] + zero.float()[..., None]).reshape(out_features, in_features)


def quantize_per_token(x: torch.Tensor, levels: int) -> torch.Tensor:
    """Fake-quantize activations per token: each row of x [rows, in] rounded to ``levels``
    steps of its own max|x| / ``levels`` on each side (127 for 8 bits, 63 for 7)."""
    s = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-30) / levels
    return (torch.round(x.float() / s) * s).to(x.dtype)
