"""The quantized linear layers: one class per kernel, each ``y = x @ W.T + b`` with W [out, in].

Each is built from a float weight [out_features, in_features] (and an optional bias) and keeps
only what its kernel reads: the integer weights and their scales. Which class serves which
scheme on which device, and why, is ``quantization.py``'s table; the quantization arithmetic
(scales, rounding, groups) is there too, so that every kernel here and the dequantized reference
it is tested against share it. Every class has ``weight_bytes``: the bytes its kernel reads per
call, scales included (the bytes model, ``quantization.matmul_bytes``, is tested against it).
Every class answers an input of zero rows with an empty output and launches no kernel.

``FbgemmLinear`` is the one user of torch's quantized tensors (``torch.quantize_per_channel``'s
kind and ``quantized::linear_*``), which torch 2.13 deprecates in favour of torchao: they hold
the CPU's fast int8 kernel (fbgemm), and this class is the one place to change when they go.
"""

from __future__ import annotations

import copy
import functools
import itertools
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from minieng.wings.fast_paths.opaque_ops import opaque_op
from minieng.wings.quantization.quant_codes import quantize_int4_grouped, quantize_per_channel_int8


# The op's C++ entry point, below its two Python layers: the packet's argument checks and, as the
# op takes a packed-weights object (a TorchBind op), torch's scan of every argument for fake
# objects. With the other trims in ``FbgemmLinear.forward`` this saved about 4% of the int8 engine's
# batch-1 decode step on a 2-core AMD EPYC (docs/measurements.md, ``wings/quantization/quant_kernels.py``).
@functools.cache
def _fbgemm_linear():
    """The op, resolved on first use (never at import: a torch without fbgemm must still import this)."""
    overload = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32.default
    return getattr(overload, "_op", overload)


_INF = float("inf")

# The same product as an operator of minieng's, for compiled code (``opaque_ops``): the compiler
# cannot take fbgemm's packed weights (a TorchBind object, not a tensor) as an input, and breaks its
# graph at every call of the op that does. This one takes a key instead, a tensor (a constant
# would be guarded on, and recompile each layer), and finds the weights in ``_PACKED``.
_PACKED: dict[int, object] = {}  # key -> fbgemm's packed weights, while their layer lives
_KEYS = itertools.count()
fbgemm_linear = opaque_op(
    "fbgemm_linear(Tensor u, Tensor key, int zero_point, int out_features) -> Tensor",
    lambda u, key, zero_point, out_features: _fbgemm_linear()(u, 1.0, zero_point, _PACKED[int(key)]),
    lambda u, key, zero_point, out_features: u.new_empty(u.shape[0], out_features),
    "CPU",
)


def _no_rows(x: torch.Tensor, out_features: int) -> torch.Tensor | None:
    """The empty output [0, out_features] when ``x`` has no rows, else None. A product is never
    launched on zero rows: on CUDA tinygemm's int4 kernel then launches a grid with a zero
    dimension ("invalid configuration argument"), and ``_weight_int8pack_mm`` makes the same launch
    unchecked, so the error surfaces later, in an unrelated kernel."""
    return x.new_empty(0, out_features) if x.shape[0] == 0 else None


def _fbgemm_pack(q: torch.Tensor, scale: torch.Tensor):
    """fbgemm's packed weights of int8 codes q [out, in] with float scales [out] (zero points 0)."""
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        # torch 2.13 deprecates its quantized tensors in favour of torchao; the kernels still
        # run, and this module is the one place to change when they go.
        warnings.filterwarnings("ignore", message=".*quantized tensor.*")
        qw = torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)
        return torch.ops.quantized.linear_prepack(qw, None)


@functools.cache
def fbgemm_activation_levels() -> int:
    """The per-token activation levels (a side) that fbgemm's int8 GEMM sums exactly on this CPU:
    127 (8 bits) or 63 (7 bits).

    Where the CPU has AVX-512 VNNI (``vpdpbusd``: Intel since Cascade Lake, AMD since Zen 4),
    every u8 x s8 product goes straight into an int32 sum. With AVX2 alone (``vpmaddubsw``),
    pairs of products are first added in int16, which saturates at 32,767: an 8-bit code
    (255 - 128 = 127 after the zero point 128) against a weight of 127 gives pairs up to
    255 x 127 x 2 = 64,770, which does not fit; 7-bit codes (zero point 64, 127 x 127 x 2 =
    32,258) do. That is why torch's ``nn.quantized.dynamic.Linear`` uses ``reduce_range``
    (7 bits) everywhere. Here the kernel itself is asked, once: the worst case goes through it,
    and 8 bits are used only if it comes back exact. A torch without fbgemm (an ARM CPU) has no
    such kernel to overflow: 127, the scheme's own 8 bits, for its dequantized reference.
    """
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return 127
    inputs = 64
    packed = _fbgemm_pack(torch.full((8, inputs), 127, dtype=torch.int8), torch.ones(8))
    y = _fbgemm_linear()(torch.full((1, inputs), 127.0), 1.0, 128, packed)
    return 127 if y[0, 0].item() == 127 * 127 * inputs else 63


class FbgemmLinear(nn.Module):
    """int8 weights (per output channel) and int8 activations (per token) in fbgemm's int8 GEMM
    (x86 CPUs, int32 accumulation): ``digits=1`` is W8A8; ``digits=2`` keeps 16-bit-class
    activations for the weight-only ``"int8"`` scheme.

    The activations are quantized here, not by fbgemm: each row (token) gets its own scale s =
    max|x| / L, with L = ``activation_levels`` codes a side, and
    ``quantized::linear_with_input_q_dq_qweight_dq_output_fp32`` is given the rows x / s with
    input scale 1 and zero point L + 1, so its own rounding *is* the per-token quantization,
    exactly (``linear_dynamic`` would pick one scale for the whole batch from its min and max:
    the outlier-prone per-tensor scheme, and a token's output that depends on its batch-mates).
    Per token, a row's codes depend on its own values alone; but those values carry the float
    rounding of everything before the product (attention over another chunk, products of another
    shape, a compiler's x / s), and a value on a code boundary turns a last-bit difference into a
    whole step: on the default model W8A8's greedy tokens can differ batched and alone, or compiled
    and eager (``lab.quant_quality.float_noise_amplification`` measures it).
    L is 127 (8 bits) where the kernel sums 8-bit codes exactly, 63 (7 bits) where it would
    overflow (AVX2 without VNNI): ``fbgemm_activation_levels``.

    With ``digits=2`` each token is written in two digits, x ~ s (q1 + q2 / 2L) with
    q1 = round(x / s) and q2 the rounded remainder times 2L (|q2| <= L): both digit rows go
    through one GEMM (the weights are read once), and the outputs recombine as
    s (y1 + y2 / 2L). The activation error is at most max|x| / 4L^2: 1 / 64,516 of the token's
    largest value with 8-bit digits (16 bits), 1 / 15,876 with 7-bit ones (14 bits), the class
    of bf16/fp16 activations, so the scheme's accuracy is weight-only int8's.

    Shapes: x [rows, in_features] (any float dtype; computed in float32) -> [rows, out_features].
    Raises ``ValueError`` for ``digits`` other than 1 or 2, or levels the kernel cannot sum.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, digits: int, activation_levels: int | None = None
    ):
        super().__init__()
        if digits not in (1, 2):
            raise ValueError(f"digits={digits} must be 1 (W8A8) or 2 (16-bit-class activations)")
        levels = fbgemm_activation_levels() if activation_levels is None else activation_levels
        if levels not in (63, fbgemm_activation_levels()):
            raise ValueError(
                f"activation_levels={levels}: fbgemm's kernel on this CPU sums "
                f"{fbgemm_activation_levels()} or 63 levels a side exactly"
            )
        q, scale = quantize_per_channel_int8(weight.detach().float())  # [out, in] int8, [out] float32
        self.packed = _fbgemm_pack(q, scale)
        self._linear = _fbgemm_linear()
        self._register_packed()
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.digits = digits
        self.activation_levels = levels
        self.zero_point = levels + 1  # codes -L..L sit at L+1 +- L within 1..2L+1 (u8)
        self.digit_base = 2 * levels  # the second digit's weight
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.weight_bytes = q.numel() + 4 * q.shape[0]  # int8 weights, float32 scales (fbgemm's)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Few ops, each called as directly as torch allows (``torch.div``, not the ``/`` operator's
        # Python wrapper): at one row an op's dispatch costs about what its arithmetic does, 121
        # times a decode step.
        if (empty := _no_rows(x, self.out_features)) is not None:
            return empty
        x32 = x if x.dtype == torch.float32 else x.float()
        s = torch.linalg.vector_norm(x32, _INF, -1, keepdim=True).clamp_(min=1e-30)  # [rows, 1] max|x|
        s.div_(self.activation_levels)  # the per-token scale
        u = torch.div(x32, s)  # each row within [-L, L]; fbgemm rounds it
        if self.digits == 1:
            y = self._product(u)
        else:
            q1 = torch.round(u)
            digits = torch.cat((q1, u.sub_(q1).mul_(self.digit_base)))  # [2 rows, in]
            high, low = self._product(digits).chunk(2)
            y = torch.add(high, low, alpha=1 / self.digit_base)
        y.mul_(s)
        if self.bias is not None:
            y.add_(self.bias)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def _register_packed(self) -> None:
        """Put the packed weights in ``_PACKED`` under a new key (the buffer ``key``), for as long as
        this layer lives: the compiled operator's way to them."""
        key = next(_KEYS)
        _PACKED[key] = self.packed
        weakref.finalize(self, _PACKED.pop, key, None)
        self.register_buffer("key", torch.tensor(key), persistent=False)

    def __deepcopy__(self, memo: dict) -> FbgemmLinear:
        """A copy with a key of its own: with the original's, it would lose its weights in the
        compiled operator's table when the original goes."""
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        clone._register_packed()
        return clone

    def _product(self, u: torch.Tensor) -> torch.Tensor:
        """fbgemm's int8 GEMM of the scaled rows u [rows, in] (it rounds them) -> float32 [rows, out];
        in compiled code, through the opaque ``minieng::fbgemm_linear`` (the scales around it fuse)."""
        if torch.compiler.is_compiling():
            return fbgemm_linear(u, self.key, self.zero_point, self.out_features)
        return self._linear(u, 1.0, self.zero_point, self.packed)


def int8_product_for_compiler(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [rows, in] @ (qweight [out, in] int8 x scale [out]).T as gpt-fast writes it for a compiler:
    the weights cast to x's dtype feed the product, and the scale multiplies its output."""
    return torch.mm(x, qweight.t().to(x.dtype)) * scale


class Int8WeightOnlyLinear(nn.Module):
    """int8 weights per output channel, activations as they are: ``torch._weight_int8pack_mm``
    reads the int8 weights and scales them inside the product (CUDA; on a CPU it runs too, for
    tests, far slower than fp32). Scales in the activations' dtype, as the op asks.

    Inside a compiled region (``LLMEngine(compile=True)``) the layer is written as gpt-fast writes
    its int8 layer (``quantize.py``, ``WeightOnlyInt8Linear``): the int8 weights cast to x's dtype,
    the product, and the scale after it, ``mm(x, q.T.to(x.dtype)) * scale``, so that the cast is
    the product's input, not a separate dequantized matrix. What Inductor makes of it, as observed
    on a CPU (``tests/wings/quantization/test_quant_ops.py``): in bfloat16 its weight-only-int8 pattern
    (``torch/_inductor/fx_passes/quantization.py``, bfloat16 activations and scales only) turns
    the whole expression back into ``_weight_int8pack_mm``; in float32 no pattern applies, and the
    compiled code writes the float weight matrix, then calls the extern matmul (a byte a weight
    read, then the float weight written and read again: more bytes than the float model's own
    product). On CUDA the same pattern admits CUDA tensors (read in torch 2.13's source; the GPU
    image runs torch 2.11); in float16 it does not apply, and the float matrix is written as on the
    CPU in float32. gpt-fast also compiles with ``coordinate_descent_tuning``, under which Inductor
    turns a one-row product into a reduction over the cast weights; minieng leaves it off (it tunes
    every kernel at compile time: unmeasured). Which kernels a GPU runs, and how fast, has not been
    measured.

    Shapes: x [rows, in_features] -> [rows, out_features], in x's dtype.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        q, scale = quantize_per_channel_int8(weight.detach())
        self.register_buffer("qweight", q)  # [out, in] int8
        self.register_buffer("scale", scale.to(weight.dtype))  # [out]
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.weight_bytes = q.numel() + scale.numel() * weight.element_size()
        self.out_features = q.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (empty := _no_rows(x, self.out_features)) is not None:
            return empty
        if torch.compiler.is_compiling():
            y = int8_product_for_compiler(x, self.qweight, self.scale)
        else:
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
                (q[:, ::2] << 4 | q[:, 1::2]).contiguous(), _inner_k_tiles(in_features)
            )
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 2)
        self.register_buffer("packed", packed)
        # [groups, out, 2]: scale and zero side by side, in the activations' dtype
        scales_and_zeros = torch.stack([scale, zero], -1).transpose(0, 1).contiguous()
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(weight.dtype))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.group_size = group_size
        self.out_features = out_features
        self.weight_bytes = out_features * in_features // 2 + self.scales_and_zeros.numel() * weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (empty := _no_rows(x, self.out_features)) is not None:
            return empty
        x = x.contiguous()
        if x.device.type == "cuda":
            y = torch.ops.aten._weight_int4pack_mm(x, self.packed, self.group_size, self.scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)
        return y if self.bias is None else y + self.bias


# torch._int_mm on CUDA takes more than 16 rows, and inputs and outputs in multiples of 8
# (``_int_mm_out_cuda`` in ``aten/src/ATen/native/cuda/Blas.cpp``: "self.size(0) needs to be
# greater than 16"); on a CPU it takes any shape.
INT_MM_MIN_ROWS = {"cuda": 17}


class W8A8Linear(nn.Module):
    """int8 weights per output channel, int8 activations per token (8 bits), the product in
    ``torch._int_mm`` (cuBLASLt's int8 GEMM on CUDA, int32 accumulation), then both scales. Runs
    on a CPU too (tests).

    Each token's scale is s = m / 127, with m its max|x| (``quantize_per_token``'s rounding, in
    float32 whatever x's dtype: a bfloat16 x / s would keep 8 bits of a code up to 127), and
    the output is (acc m) (w_scale / 127), the weights' scale over 127 precomputed in float32 at
    load. One row costs 8 dispatched ops (a kernel each on a GPU): the max (one reduction), s,
    x / s, its rounding, the int8 cast, the product, the two rescales (the bias added in the
    second); ``tests/wings/quantization/test_quant_ops.py`` holds that budget. acc m is in x's dtype: in
    bfloat16 it is rounded twice (the int32 sum, the product) before the last rescale, computed
    in float32, rounds once more (a float32 acc m would cost a cast more). In float16, whose range
    (65,504) an int32 sum can exceed, acc m is float32 and the output is cast back: one op more.

    On CUDA a product of 16 rows or fewer is padded to 17 (``INT_MM_MIN_ROWS``): the codes are
    written into the first rows of a buffer of 17 (``padded_codes``; its other rows hold whatever
    an earlier call left, harmless since a product's row depends on its own row alone) in place of
    the cast, so padding costs no op. Above 16 rows nothing is padded; nor on a CPU. The buffer is
    the layer's, so engines that share one loaded model (``LLMEngine(loaded=...)``) must step in
    turn on one stream, as the course's comparisons do: two streams at once would race on it.
    ``device_type`` picks the rules (default: the weight's device), so a CPU test can run CUDA's.

    Shapes: x [rows, in_features] -> [rows, out_features], in x's dtype. Raises ``ValueError``
    on CUDA for in or out features that are not multiples of 8.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, device_type: str | None = None):
        super().__init__()
        device_type = device_type or weight.device.type
        out_features, in_features = weight.shape
        if device_type == "cuda" and (in_features % 8 or out_features % 8):
            raise ValueError(
                f"W8A8 on CUDA needs in and out features in multiples of 8 (torch._int_mm), got "
                f"[{out_features}, {in_features}]; use 'int8' for this model"
            )
        q, scale = quantize_per_channel_int8(weight.detach())
        self.register_buffer("qweight_t", q.t())  # [in, out] int8, column-major: the product's operand as is
        # float16's range cannot hold an int32 sum: its max and rescale run in float32
        self.rescale_dtype = torch.float32 if weight.dtype == torch.float16 else weight.dtype
        self.register_buffer("out_scale", scale.float() / 127)  # [out] float32: the last rescale's operand
        # float32 operands of the scale's addcdiv, so that s and x / s are float32 (type promotion)
        self.register_buffer("tiny", torch.tensor([1e-30], device=weight.device), persistent=False)
        self.register_buffer("levels", torch.tensor([127.0], device=weight.device), persistent=False)
        self.min_rows = INT_MM_MIN_ROWS.get(device_type, 0)
        with torch.inference_mode(False):  # written in place by every call, in inference mode or not
            codes = torch.zeros(self.min_rows, in_features, dtype=torch.int8, device=weight.device)
        self.register_buffer("padded_codes", codes if self.min_rows else None, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.weight_bytes = q.numel() + scale.numel() * weight.element_size()
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (empty := _no_rows(x, self.out_features)) is not None:
            return empty
        rows = x.shape[0]
        m = torch.linalg.vector_norm(x, _INF, -1, keepdim=True, dtype=self.rescale_dtype)  # [rows, 1] max|x|
        s = torch.addcdiv(self.tiny, m, self.levels)  # float32 m / 127 (+1e-30: a zero row's stays > 0)
        u = torch.div(x, s).round_()  # float32 codes within [-127, 127]
        if self.min_rows and torch.compiler.is_compiling():
            # no buffer written in a graph, and no guard on the rows (one graph for every count): a
            # pad of max(0, 17 - rows) rows, which Inductor fuses with the cast
            pad = torch.sym_max(0, self.min_rows - rows)
            acc = torch._int_mm(F.pad(u.to(torch.int8), (0, 0, 0, pad)), self.qweight_t)[:rows]
        elif rows >= self.min_rows:
            acc = torch._int_mm(u.to(torch.int8), self.qweight_t)  # [rows, out] int32
        else:
            self.padded_codes[:rows].copy_(u)  # the cast, into the padded operand
            acc = torch._int_mm(self.padded_codes, self.qweight_t)[:rows]
        y = torch.mul(acc, m)  # [rows, out] in the rescale's dtype
        # computed in float32 (the scale's dtype), stored in y's: one rounding
        y = y.mul_(self.out_scale) if self.bias is None else torch.addcmul(self.bias, y, self.out_scale, out=y)
        return y if y.dtype == x.dtype else y.to(x.dtype)
