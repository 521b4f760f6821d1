"""The quantized linear layers' dispatched ops at one row (a budget, not a timing; issue 33), and what
the compiler is given for int8.

Each dispatched op is a kernel launch on a GPU, and a decode step at batch 1 is launch-bound. Counted
on the CPU in float32 and in bfloat16 (every GPU's dtype), under the CPU's rules and under CUDA's
(``W8A8Linear(device_type="cuda")``: CUDA's padding of ``torch._int_mm``, run on the CPU's kernel).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minieng.wings.fast_paths.compilation import compiler_missing
from minieng.measure.op_count import OpCount, OpCounter
from minieng.wings.quantization.quant_codes import quantize_per_channel_int8
from minieng.wings.quantization.quant_kernels import (
    Int4Linear,
    Int8WeightOnlyLinear,
    W8A8Linear,
    INT_MM_MIN_ROWS,
)
from minieng.wings.quantization.quantization import make_linear

# max|x|, s = max|x| / 127, x / s, its rounding, the int8 cast, _int_mm, acc m, the weight scale (+ bias)
W8A8_OPS_AT_ONE_ROW = 8
DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]
BF16_ROUNDING = 2.0**-9  # bfloat16's relative rounding (8 significant bits)


def int_mm_padding(rows: int, device_type: str) -> int:
    """The rows of padding ``torch._int_mm`` needs for a product of ``rows`` rows: on CUDA up to 17
    (its kernel refuses 16 or fewer), elsewhere none."""
    return max(0, INT_MM_MIN_ROWS.get(device_type, 0) - rows)


def layer_inputs(dtype: torch.dtype, rows: int, seed: int = 0):
    """Weights [96, 128] with an all-zero row, a bias [96], and x [rows, 128] with an outlier and,
    from 3 rows, an all-zero token (its scale must not divide by 0)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(96, 128, generator=gen) * 0.05
    w[5] = 0.0
    bias = torch.randn(96, generator=gen)
    x = torch.randn(rows, 128, generator=gen) * 3
    x[0, 3] = 40.0
    if rows >= 3:
        x[1] = 0.0
    return w.to(dtype), bias.to(dtype), x.to(dtype)


def former_w8a8(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """W8A8Linear's arithmetic before issue 33: float32 throughout (codes, both rescales, the
    weight scale cast from the model's dtype every call), one rounding to x's dtype at the end."""
    q, scale = quantize_per_channel_int8(weight)
    x32 = x.float()
    s = x32.abs().amax(-1, keepdim=True).clamp(min=1e-30) / 127
    acc = torch._int_mm(torch.round(x32 / s).to(torch.int8), q.t())
    y = acc.float() * s * scale.to(weight.dtype).float()
    return (y if bias is None else y + bias).to(x.dtype)


def ops_of(layer: torch.nn.Module, x: torch.Tensor) -> OpCount:
    layer(x)  # any first-call work out of the count
    with OpCounter() as counter:
        layer(x)
    return counter.result()


class IntMMRows(TorchDispatchMode):
    """The rows of every ``_int_mm`` operand A dispatched while active."""

    def __init__(self):
        super().__init__()
        self.rows: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "_int_mm":
            self.rows.append(args[0].shape[0])
        return func(*args, **(kwargs or {}))


def test_int_mm_is_padded_to_17_rows_on_cuda_only():
    """torch._int_mm on CUDA refuses 16 rows or fewer (``_int_mm_out_cuda``); a CPU takes any
    number. The layer calls the kernel with exactly the rows the rule asks for."""
    assert [int_mm_padding(rows, "cuda") for rows in (1, 16, 17, 40)] == [16, 1, 0, 0]
    assert [int_mm_padding(rows, "cpu") for rows in (1, 16, 17, 40)] == [0, 0, 0, 0]
    for device_type in ("cpu", "cuda"):
        w, bias, _ = layer_inputs(torch.float32, 1)
        layer = W8A8Linear(w, bias, device_type=device_type)
        for rows in (1, 16, 17, 40):
            with IntMMRows() as seen:
                assert layer(layer_inputs(torch.float32, rows)[2]).shape == (rows, 96)
            assert seen.rows == [rows + int_mm_padding(rows, device_type)], (device_type, rows)
    # quantization.make_linear's CUDA layer keeps CUDA's rules on CPU tensors (gpu_check's smoke count)
    with IntMMRows() as seen:
        make_linear("w8a8", "cuda", layer_inputs(torch.float32, 1)[0], None, 64)(layer_inputs(torch.float32, 1)[2])
    assert seen.rows == [1 + int_mm_padding(1, "cuda")]


def test_w8a8_on_cuda_refuses_shapes_int_mm_cannot_take():
    with pytest.raises(ValueError, match=r"multiples of 8.*\[96, 100\]"):
        W8A8Linear(torch.randn(96, 100), None, device_type="cuda")
    assert W8A8Linear(torch.randn(96, 100), None, device_type="cpu")(torch.randn(2, 100)).shape == (2, 96)


@pytest.mark.parametrize("device_type", ["cpu", "cuda"], ids=["CPU's rules", "CUDA's rules"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_w8a8_at_one_row_dispatches_at_most_8_ops(dtype, with_bias, device_type):
    """Issue 33 counted 16 in bfloat16 (quantize, pad, _int_mm, rescale, casts, the weight scale
    cast every call). Now 8 computing ops, padding included (the codes are cast into the padded
    operand), and no view but the padded operand's rows and the product's real rows."""
    w, bias, x = layer_inputs(dtype, 1)
    count = ops_of(W8A8Linear(w, bias if with_bias else None, device_type=device_type), x)
    assert count.computing <= W8A8_OPS_AT_ONE_ROW, count.ops
    assert count.views <= (2 if int_mm_padding(1, device_type) else 0), count.ops
    assert count.ops["_int_mm"] == 1 and count.ops["_to_copy"] <= 1, count.ops  # no per-call scale cast
    assert not {"cat", "new_zeros", "constant_pad_nd", "t"} & set(count.ops), count.ops


@pytest.mark.parametrize("device_type", ["cpu", "cuda"], ids=["CPU's rules", "CUDA's rules"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_w8a8_matches_the_former_arithmetic(dtype, device_type):
    """Same integer codes as before (s = m / 127 and x / s in float32, as ``quantize_per_token``):
    in float32 only the order of the rescale's products differs (1e-5 of the largest output). In
    bfloat16 the new rescale rounds three times (the sum, acc m, the last product) and the former
    twice (the stored weight scale, the output): at most five roundings of a row's largest output
    apart."""
    for rows in (1, 5, 17, 40):
        w, bias, x = layer_inputs(dtype, rows, seed=rows)
        for b in (None, bias):
            got = W8A8Linear(w, b, device_type=device_type)(x)
            ref = former_w8a8(x, w, b)
            assert got.dtype == x.dtype and got.shape == ref.shape
            err = (got.float() - ref.float()).abs()
            if dtype == torch.float32:
                assert err.max() <= 1e-5 * ref.abs().max(), (rows, b is None)
            else:
                row_max = ref.float().abs().amax(-1, keepdim=True)
                assert (err <= 5 * BF16_ROUNDING * row_max).all(), (rows, b is None, (err / row_max).max())


def test_w8a8_in_float16_keeps_int32_sums_beyond_its_range_finite():
    """float16 ends at 65,504; a sum of 128 products of 127 x 127 is 2,064,512. The float16 layer
    rescales in float32 and casts back: one op more than the budget, and the former's output."""
    w = torch.full((96, 128), 0.5, dtype=torch.float16)
    x = torch.full((1, 128), 3.0, dtype=torch.float16)
    layer = W8A8Linear(w, None)
    got = layer(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, former_w8a8(x, w, None), rtol=1e-3, atol=0)
    assert ops_of(layer, x).computing <= W8A8_OPS_AT_ONE_ROW + 1


@pytest.mark.parametrize("with_bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_weight_only_layers_at_one_row_dispatch_their_product_and_the_bias(dtype, with_bias):
    """int8 (``_weight_int8pack_mm``) and int4 (tinygemm's CPU twin): one op, the product, which
    reads the integer weights and applies their scales itself; the bias, one more."""
    w, bias, x = layer_inputs(dtype, 1)
    b = bias if with_bias else None
    for layer in (Int8WeightOnlyLinear(w, b), Int4Linear(w, b, 64)):
        count = ops_of(layer, x)
        assert count.total <= 1 + with_bias, (type(layer).__name__, count.ops)


def test_int8_compiled_in_bfloat16_on_a_cpu_never_writes_the_float_weights():
    """gpt-fast's form (``int8_product_for_compiler``) in bfloat16: Inductor's weight-only int8
    pattern turns the cast, the product and the scale back into ``_weight_int8pack_mm`` (it reads
    the int8 weights once); no float matrix is written and no float matmul called. Observed on a
    CPU; the GPU's kernels are not asserted here."""
    from torch._inductor.utils import run_and_get_code

    if compiler_missing(torch.device("cpu")) is not None:
        pytest.skip("torch.compile on a CPU needs a C++ compiler")
    w, bias, x = layer_inputs(torch.bfloat16, 3)
    layer = Int8WeightOnlyLinear(w, bias)
    torch._dynamo.reset()
    got, code = run_and_get_code(torch.compile(layer.forward, dynamic=False, fullgraph=True), x)
    code = "\n".join(code)
    assert "_weight_int8pack_mm" in code and "extern_kernels.mm(" not in code
    torch.testing.assert_close(
        got, layer(x), rtol=2 * BF16_ROUNDING, atol=2 * BF16_ROUNDING * layer(x).abs().max().item()
    )


@pytest.mark.parametrize("device_type", ["cpu", "cuda"], ids=["CPU's rules", "CUDA's rules"])
def test_w8a8_compiles_as_one_graph_for_every_row_count_with_the_eager_output(device_type):
    """Compiled, CUDA's padding is a pad of max(0, 17 - rows) rows (no buffer written inside a
    graph, no guard on the rows), the CPU's none: one graph (``fullgraph``) serves 2 to 40 rows,
    across the 16/17 boundary, with the eager layer's output."""
    from torch._dynamo.testing import CompileCounterWithBackend

    if compiler_missing(torch.device("cpu")) is not None:
        pytest.skip("torch.compile on a CPU needs a C++ compiler")
    w, bias, _ = layer_inputs(torch.float32, 1)
    layer = W8A8Linear(w, bias, device_type=device_type)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(layer.forward, backend=counter, fullgraph=True, dynamic=True)
    for rows in (2, 16, 17, 40):
        x = layer_inputs(torch.float32, rows, seed=rows)[2]
        ref = layer(x)
        torch.testing.assert_close(compiled(x), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert counter.frame_count == 1
