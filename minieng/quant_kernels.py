"""The quantized linear layers: one class per kernel, each ``y = x @ W.T + b`` with W [out, in].

Each is built from a float weight [out_features, in_features] (and an optional bias) and keeps
only what its kernel reads: the integer weights and their scales. Which class serves which
scheme on which device, and why, is ``quantization.py``'s table; the quantization arithmetic
(scales, rounding, groups) is there too, so that every kernel here and the dequantized reference
it is tested against share it. Every class has ``weight_bytes``: the bytes its kernel reads per
call, scales included (the bytes model, ``quantization.matmul_bytes``, is tested against it).

``FbgemmLinear`` is the one user of torch's quantized tensors (``torch.quantize_per_channel``'s
kind and ``quantized::linear_*``), which torch 2.13 deprecates in favour of torchao: they hold
the CPU's fast int8 kernel (fbgemm), and this class is the one place to change when they go.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .quantization import (ACTIVATION_LEVELS_7BIT, CPU_DIGIT_BASE, quantize_int4_grouped, quantize_per_channel_int8)


# The op itself rather than its packet: the packet's call checks its arguments in Python first.
_FBGEMM_LINEAR = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32.default


class FbgemmLinear(nn.Module):
    """int8 weights (per output channel) and int8 activations (per token) in fbgemm's int8 GEMM
    (x86 CPUs, int32 accumulation): ``digits=1`` is W8A8; ``digits=2`` keeps 16-bit-class
    activations for the weight-only ``"int8"`` scheme.

    The activations are quantized here, not by fbgemm: each row (token) gets its own scale s =
    max|x| / 63, and ``quantized::linear_with_input_q_dq_qweight_dq_output_fp32`` is given the
    rows x / s with input scale 1 and zero point 64, so its own rounding *is* the per-token
    quantization, exactly (``linear_dynamic`` would pick one scale for the whole batch from its
    min and max: the outlier-prone per-tensor scheme, and a token's output that depends on its
    batch-mates). Seven bits, not eight, as torch's ``nn.quantized.dynamic.Linear`` does with
    ``reduce_range``: the AVX2 kernel sums pairs of u8 x s8 products in int16, which 255 x 127 x 2
    overflows; 127 x 127 x 2 does not.

    With ``digits=2`` each token is written in two 7-bit digits, x ~ s (q1 + q2 / 126) with
    q1 = round(x / s) and q2 the rounded remainder times 126 (|q2| <= 63): both digit rows go
    through one GEMM (the weights are read once), and the outputs recombine as
    s (y1 + y2 / 126). The activation error is at most max|x| / 15,876 (about 14 bits), the
    class of bf16/fp16 activations, so the scheme's accuracy is weight-only int8's.

    Shapes: x [rows, in_features] (any float dtype; computed in float32) -> [rows, out_features].
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, digits: int):
        super().__init__()
        if digits not in (1, 2):
            raise ValueError(f"digits={digits} must be 1 (W8A8) or 2 (16-bit-class activations)")
        q, scale = quantize_per_channel_int8(weight.detach().float())  # [out, in] int8, [out] float32
        zeros = torch.zeros(q.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            # torch 2.13 deprecates its quantized tensors in favour of torchao; the kernels still
            # run, and this class is the one place to change when they go.
            warnings.filterwarnings("ignore", message=".*quantized tensor.*")
            qw = torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)
            self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.digits = digits
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.weight_bytes = q.numel() + 4 * q.shape[0]  # int8 weights, float32 scales (fbgemm's)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Few, in-place ops, each called as directly as torch allows: at one row an op's dispatch
        # (and Python's share of it) costs about what its arithmetic does, 121 times a step.
        rows = x.shape[0]
        x32 = x if x.dtype == torch.float32 else x.float()
        s = torch.linalg.vector_norm(x32, float("inf"), -1, keepdim=True).clamp_(min=1e-30)  # [rows, 1] max|x|
        s.div_(ACTIVATION_LEVELS_7BIT)  # the per-token scale
        u = x32 / s  # each row within [-63, 63]; fbgemm rounds it
        if self.digits == 2:
            q1 = torch.round(u)
            u = torch.cat([q1, u.sub_(q1).mul_(CPU_DIGIT_BASE)])  # [2 rows, in]: the two digits
        y = _FBGEMM_LINEAR(u, 1.0, 64, self.packed)
        if self.digits == 2:
            y = y[:rows].add_(y[rows:], alpha=1 / CPU_DIGIT_BASE)
        y = y.mul_(s)
        if self.bias is not None:
            y = y + self.bias
        return y if x.dtype == torch.float32 else y.to(x.dtype)


class Int8WeightOnlyLinear(nn.Module):
    """int8 weights per output channel, activations as they are: ``torch._weight_int8pack_mm``
    reads the int8 weights and scales them inside the product (CUDA; on a CPU it runs too, for
    tests, far slower than fp32). Scales in the activations' dtype, as the op asks.

    Shapes: x [rows, in_features] -> [rows, out_features], in x's dtype.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        q, scale = quantize_per_channel_int8(weight.detach())
        self.register_buffer("qweight", q)  # [out, in] int8
        self.register_buffer("scale", scale.to(weight.dtype))  # [out]
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.weight_bytes = q.numel() + scale.numel() * weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(x.contiguous(), self.qweight, self.scale)
        return y if self.bias is None else y + self.bias


def _inner_k_tiles(in_features: int) -> int:
    """tinygemm's inner_k_tiles: the largest of 8, 4, 2 whose 16 x tiles divide ``in_features``
    (torchao fixes 8, so it pads 576 inputs to 1,024 and reads 78% more bytes)."""
    for tiles in (8, 4, 2):
        if in_features % (16 * tiles) == 0:
            return tiles
    raise ValueError(f"in_features={in_features} is not a multiple of 32: tinygemm's int4 layout needs one")


class Int4Linear(nn.Module):
    """4-bit weights in groups of ``group_size`` inputs, each group with a scale and a zero
    (w ~ (q - 8) scale + zero, q in 0..15), in tinygemm's layout: ``torch._weight_int4pack_mm``
    on CUDA (bfloat16 activations), ``_weight_int4pack_mm_for_cpu`` on a CPU (tests only: there
    it is slower than fp32, see ``quantization.py``).

    Shapes: x [rows, in_features] -> [rows, out_features], in x's dtype.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int):
        super().__init__()
        q, scale, zero = quantize_int4_grouped(weight.detach(), group_size)  # [out, in] uint8, [out, groups] x2
        out_features, in_features = q.shape
        if weight.device.type == "cuda":  # two 4-bit values per byte, the first in the high nibble
            packed = torch.ops.aten._convert_weight_to_int4pack(
                (q[:, ::2] << 4 | q[:, 1::2]).contiguous(), _inner_k_tiles(in_features))
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 2)
        self.register_buffer("packed", packed)
        # [groups, out, 2]: scale and zero side by side, in the activations' dtype
        scales_and_zeros = torch.stack([scale, zero], -1).transpose(0, 1).contiguous()
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(weight.dtype))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.group_size = group_size
        self.weight_bytes = out_features * in_features // 2 + self.scales_and_zeros.numel() * weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if x.device.type == "cuda":
            y = torch.ops.aten._weight_int4pack_mm(x, self.packed, self.group_size, self.scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)
        return y if self.bias is None else y + self.bias


class W8A8Linear(nn.Module):
    """int8 weights per output channel, int8 activations per token (8 bits: s = max|x| / 127),
    the product in ``torch._int_mm`` (cuBLASLt's int8 GEMM on CUDA, int32 accumulation), then
    both scales. cuBLASLt wants more than 16 rows, in multiples of 8: the rows are padded with
    zeros. Runs on a CPU too (tests).

    Shapes: x [rows, in_features] -> [rows, out_features], in x's dtype.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        q, scale = quantize_per_channel_int8(weight.detach())
        self.register_buffer("qweight", q)  # [out, in] int8; the product reads its transpose, column-major
        self.register_buffer("scale", scale.to(weight.dtype))  # [out], in the model's dtype
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.weight_bytes = q.numel() + scale.numel() * weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        x32 = x.float()
        s = x32.abs().amax(-1, keepdim=True).clamp(min=1e-30) / 127  # [rows, 1]
        xq = torch.round(x32 / s).to(torch.int8)
        padded = max(24, -(-rows // 8) * 8)
        if padded != rows:
            xq = torch.cat([xq, xq.new_zeros(padded - rows, xq.shape[1])])
        acc = torch._int_mm(xq, self.qweight.t())[:rows]  # [rows, out] int32
        y = acc.float() * s * self.scale.float()
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)
