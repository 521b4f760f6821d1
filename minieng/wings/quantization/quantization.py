"""Quantization: fewer bytes per weight, the lever aimed at decode (bandwidth-bound), not prefill.

Decode rereads every weight each step, so its floor is weight bytes / bandwidth (TPOT_min,
docs/architecture.md, FLOPs and bytes); prefill is compute-bound, and bytes barely move it. The schemes
(``EngineConfig.quantization``) quantize every linear layer and the LM head; the embedding and
the norms keep the model's dtype, and so does the KV cache:

- ``"int8"``, weight-only: per output channel, w ~ q s with q in [-127, 127] and s = max|w| / 127
  of the channel's row. The activations keep (at least) 16-bit precision.
- ``"int4"``, weight-only: 4-bit codes in groups of ``group_size`` consecutive inputs, each group
  with a scale and a zero, w ~ (q - 8) s + z with q in 0..15 (tinygemm's convention). The group
  size must divide every layer's inputs (576 and 1,536 for the default model: 64 does, 128 does
  not) and be one tinygemm has (32, 64, 128, 256); anything else is refused, never skipped.
- ``"w8a8"``: int8 weights as ``"int8"``, and int8 activations quantized per token at run time
  (each token's own max|x|): the products run in integer math, so prefill can gain too, and the
  activations' outliers cost accuracy. One scale for a whole batch or sequence ("per tensor")
  would let one outlier token coarsen every other token's codes; per token, it coarsens only its own.
  Rounding to codes amplifies float noise: on the default model a 1e-6 relative nudge to the
  embeddings moves W8A8's logits by units (float32's by ~1e-4) and flips some greedy choices, so
  its greedy tokens can change with the batch or the compiler (``lab.quant_quality``).
  8-bit codes, except on a CPU whose int8 GEMM would overflow them (AVX2 without VNNI): 7 there
  (``quant_kernels.fbgemm_activation_levels``). The bit matters: with 7-bit codes, greedy agreement
  with the float SmolLM2-135M (``bench --quantization``) fell by about 8 points
  (docs/measurements.md, ``wings/quantization/quantization.py``).

What runs where (``KERNELS``), and why. On a CPU the weight-only kernels torch and torchao offer
lose to fp32 (``torch._weight_int8pack_mm`` took 2.8x fp32's time at batch 1 on a 2-core AMD EPYC,
Zen 4 with AVX-512 VNNI; docs/measurements.md has the whole table), while fbgemm's int8 GEMM
(``quantized::linear_*``) beats fp32: so both int8 schemes run in fbgemm (``FbgemmLinear``), W8A8
directly and weight-only int8 by writing each token's activations as two int8 digits through the
same GEMM.
int4 has no CPU kernel that pays and is refused there; its accuracy can still be measured with the
dequantized reference (``reference_model``). CUDA (``benchmarks/gpu_check.py`` measures it): int4
is tinygemm, ``torch._weight_int4pack_mm`` (bfloat16 only), the kernel behind gpt-fast's int4;
int8 is ``torch._weight_int8pack_mm`` (compiled, gpt-fast's form, left to Inductor:
``quant_kernels.Int8WeightOnlyLinear`` says what is observed of it); W8A8 is ``torch._int_mm``
(cuBLASLt), 8 dispatched ops a call at one row (``quant_kernels.W8A8Linear``). minieng calls
torch's ops directly and needs no torchao (whose tinygemm layout pads the default model's 576
inputs to 1,024: 78% more bytes read). A CUDA kernel this torch lacks is refused at load.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from minieng.config import INT4_GROUP_SIZES, QUANTIZATION_SCHEMES, ModelConfig
from minieng.wings.quantization import quant_kernels
from minieng.core.llama import Linear
from minieng.wings.quantization.quant_codes import (
    dequantize_int4_grouped,
    dequantize_per_channel_int8,
    quantize_int4_grouped,
    quantize_per_channel_int8,
    quantize_per_token,
)
from minieng.wings.quantization.quant_kernels import fbgemm_activation_levels
from minieng.model.weight_bytes import MatmulBytes

SCHEMES = QUANTIZATION_SCHEMES
DEFAULT_GROUP_SIZE = 64  # divides 576 and 1,536 (the default model), 2,048 and 8,192 (1.7B)


KERNELS: dict[tuple[str, str], str] = {  # (scheme, device type) -> what runs
    ("int8", "cpu"): "fbgemm int8 GEMM, activations in two int8 digits per token",
    ("w8a8", "cpu"): "fbgemm int8 GEMM, 8-bit activations per token (7-bit on CPUs without AVX-512 VNNI)",
    ("int8", "cuda"): "torch._weight_int8pack_mm (compile=True: gpt-fast's cast, product, scale)",
    ("int4", "cuda"): "torch._weight_int4pack_mm (tinygemm; bfloat16)",
    ("w8a8", "cuda"): "torch._int_mm (cuBLASLt int8), 8-bit activations per token",
}
REFUSED: dict[tuple[str, str], str] = {
    ("int4", "cpu"): (
        "no CPU int4 kernel beats fp32: torch's _weight_int4pack_mm_for_cpu took 5.8x fp32's time on "
        "the default model's layers at batch 1 (measured: docs/measurements.md)"
    ),
}


def what_runs_where() -> str:
    """The table of ``KERNELS`` as one line per device, for error messages."""
    lines = []
    for device in ("cpu", "cuda"):
        runs = [f"{s} ({KERNELS[s, device]})" for s in SCHEMES if (s, device) in KERNELS]
        lines.append(f"{device}: " + "; ".join(runs))
    return " | ".join(lines)


def check_supported(scheme: str, device: torch.device, dtype: torch.dtype) -> str:
    """What ``scheme`` runs on ``device`` in ``dtype`` (``KERNELS``); ``ValueError`` (saying what
    runs where) for an unknown scheme or an unsupported pair."""
    if scheme not in SCHEMES:
        raise ValueError(f"quantization={scheme!r} is invalid: use None or one of {', '.join(SCHEMES)}")
    kind = device.type
    if (scheme, kind) in REFUSED or (scheme, kind) not in KERNELS:
        why = REFUSED.get((scheme, kind), f"no {scheme} kernel for {kind}")
        raise ValueError(f"quantization={scheme!r} does not run on {kind}: {why}. What runs where: {what_runs_where()}")
    if kind == "cpu":
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise ValueError(
                f"quantization={scheme!r} on a CPU needs fbgemm (an x86-64 CPU); this torch has "
                f"{torch.backends.quantized.supported_engines}"
            )
        if dtype != torch.float32:
            raise ValueError(f"quantization={scheme!r} on a CPU takes float32 activations; use dtype='float32' (auto)")
    if scheme == "int4" and dtype != torch.bfloat16:
        raise ValueError(
            f"quantization='int4' needs dtype bfloat16 (tinygemm's kernel), not {dtype}: on a GPU "
            "without bf16 (a T4) use 'int8'"
        )
    if kind == "cuda":
        _probe_kernel(scheme, device, dtype)
    return KERNELS[scheme, kind]


# How far a kernel's output may sit from its dequantized reference, relative to the reference's
# largest value: the dtype's rounding over a 64-term sum, with room to spare. A wrong layout or a
# kernel that misreads its operands is off by the order of the values themselves.
PROBE_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _probe_kernel(scheme: str, device: torch.device, dtype: torch.dtype) -> None:
    """Run ``scheme``'s kernel once on a small layer and compare it with its dequantized reference
    (``ReferenceLinear``): a torch build without the kernel, a GPU it does not support, or a
    kernel that runs but computes something else is refused here, with what went wrong, not in the
    middle of a step. Raises ``ValueError``."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 128, generator=gen).to(device, dtype)
    x = torch.randn(5, 128, generator=gen).to(device, dtype)
    where = f"quantization={scheme!r}: {KERNELS.get((scheme, device.type), scheme)}"
    try:
        y = make_linear(scheme, device.type, weight, None, 32)(x).float()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # an asynchronous launch error surfaces here, not later
    except RuntimeError as e:  # NotImplementedError included: no kernel for this device in this torch
        raise ValueError(
            f"{where} does not run here (torch {torch.__version__}: {type(e).__name__}: "
            f"{str(e).splitlines()[0]}). What runs where: {what_runs_where()}"
        ) from e
    ref = make_linear(scheme, device.type, weight, None, 32, reference=True)(x).float()
    err = ((y - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()
    if not err <= PROBE_TOLERANCE.get(dtype, 3e-2):  # NaN fails too
        raise ValueError(
            f"{where} runs here but disagrees with its dequantized reference (largest error "
            f"{err:.2g} of the largest output, tolerance {PROBE_TOLERANCE.get(dtype, 3e-2):g}): this "
            f"torch {torch.__version__} build's kernel is not usable on this device. What runs where: "
            f"{what_runs_where()}"
        )


class ReferenceLinear(nn.Module):
    """A scheme's dequantized reference: the dequantized weights in the model's dtype and, for
    W8A8, the rounding of the activations (each token on its own scale, or with
    ``per_tensor=True`` one scale for every row of the call), through a plain ``F.linear``.
    What every kernel is tested against, and how a scheme's accuracy is measured where its
    kernel does not run.

    Shapes: x [rows, in_features] -> [rows, out_features].
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        scheme: str,
        group_size: int,
        activation_levels: int | None,
        per_tensor: bool = False,
    ):
        super().__init__()
        w = weight.detach()
        if scheme == "int4":
            deq = dequantize_int4_grouped(*quantize_int4_grouped(w, group_size), group_size)
        else:
            deq = dequantize_per_channel_int8(*quantize_per_channel_int8(w))
        self.register_buffer("weight", deq.to(w.dtype))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.activation_levels = activation_levels
        self.per_tensor = per_tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation_levels:
            x = quantize_per_token(x.reshape(1, -1) if self.per_tensor else x, self.activation_levels).reshape(x.shape)
        return torch.nn.functional.linear(x, self.weight, self.bias)


def activation_levels(scheme: str, device_type: str) -> int | None:
    """Per-token activation levels (a side) of ``scheme``'s kernel on a device type: None unless
    W8A8; 127 (8 bits), or on a CPU whose int8 GEMM would overflow them 63 (7 bits:
    ``quant_kernels.fbgemm_activation_levels``)."""
    if scheme != "w8a8":
        return None
    if device_type == "cpu":
        return fbgemm_activation_levels()
    return 127


def make_linear(
    scheme: str,
    device_type: str,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    group_size: int,
    reference: bool = False,
) -> nn.Module:
    """The quantized layer of ``scheme`` on ``device_type`` for a float weight [out, in] (the
    kernel from ``KERNELS``, or with ``reference=True`` its ``ReferenceLinear``). No check of
    the pair: ``check_supported`` is the engine's gate. A CUDA layer built on CPU tensors keeps
    CUDA's rules where it has its own (W8A8's padding: ``quant_kernels.INT_MM_MIN_ROWS``)."""
    if reference:
        return ReferenceLinear(weight, bias, scheme, group_size, activation_levels(scheme, device_type))
    if scheme == "int4":  # on a CPU: tinygemm's CPU twin, which the engine refuses (timing it shows why)
        return quant_kernels.Int4Linear(weight, bias, group_size)
    if device_type == "cpu":
        return quant_kernels.FbgemmLinear(weight, bias, digits=2 if scheme == "int8" else 1)
    if scheme == "int8":
        return quant_kernels.Int8WeightOnlyLinear(weight, bias)
    return quant_kernels.W8A8Linear(weight, bias, device_type=device_type)


# -- the model ------------------------------------------------------------------------------------


def linear_shapes(model_config: ModelConfig) -> dict[str, tuple[int, int, int]]:
    """Every linear layer kind of the model: name -> (out_features, in_features, how many)."""
    c = model_config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    n = c.num_hidden_layers
    return {
        "qkv_proj": (q + 2 * kv, c.hidden_size, n),
        "o_proj": (c.hidden_size, q, n),
        "gate_up_proj": (2 * c.intermediate_size, c.hidden_size, n),
        "down_proj": (c.hidden_size, c.intermediate_size, n),
        "lm_head": (c.vocab_size, c.hidden_size, 1),
    }


def check_group_size(model_config: ModelConfig, group_size: int, kernel: bool = True) -> None:
    """Raise ``ValueError`` unless int4's ``group_size`` is one tinygemm has and divides every
    layer's inputs, and (for the ``kernel``, not the reference) every layer's outputs are a
    multiple of 8 (tinygemm's tiles): a layer that does not fit is refused, never left
    unquantized."""
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(
            f"quantization_group_size={group_size} is invalid: int4 kernels take one of {INT4_GROUP_SIZES}"
        )
    shapes = linear_shapes(model_config)
    bad = {name: k for name, (_, k, _) in shapes.items() if k % group_size}
    if bad:
        fits = [g for g in INT4_GROUP_SIZES if all(k % g == 0 for _, k, _ in shapes.values())]
        raise ValueError(
            f"quantization_group_size={group_size} does not divide the inputs of "
            + ", ".join(f"{n} ({k})" for n, k in bad.items())
            + f": use one that divides every layer ({', '.join(map(str, fits)) or 'none does'})"
        )
    odd = {name: n for name, (n, _, _) in shapes.items() if n % 8}
    if odd and kernel:
        raise ValueError(
            "int4 needs every layer's outputs in a multiple of 8 (tinygemm's tiles): "
            + ", ".join(f"{n} ({k})" for n, k in odd.items())
            + " are not"
        )


def check_quantization(
    scheme: str | None, group_size: int, model_config: ModelConfig, device: torch.device, dtype: torch.dtype
) -> None:
    """Everything about a scheme that can be refused before a weight is loaded (``ValueError``)."""
    if scheme is None:
        return
    check_supported(scheme, device, dtype)
    if scheme == "int4":
        check_group_size(model_config, group_size)


def matmul_bytes(model_config: ModelConfig, scheme: str | None, group_size: int, dtype_bytes: float) -> MatmulBytes:
    """Bytes the matrix products read per step, scales included: the decoder layers' weights
    and the LM head's, for ``flops_bytes.step_work`` and the memory plan.

    None: parameters x ``dtype_bytes``. int8 and W8A8: 1 byte per weight and one scale per
    output channel. int4: half a byte per weight and a scale and a zero per group of
    ``group_size`` inputs. Scales and zeros are kept in the model's dtype (``dtype_bytes``; on a
    CPU float32, as fbgemm keeps them).
    """

    def nbytes(out: int, inp: int) -> float:
        if scheme is None:
            return out * inp * dtype_bytes
        if scheme == "int4":
            return out * inp / 2 + out * (inp // group_size) * 2 * dtype_bytes
        return out * inp + out * dtype_bytes

    shapes = linear_shapes(model_config)
    layers = sum(count * nbytes(out, inp) for name, (out, inp, count) in shapes.items() if name != "lm_head")
    out, inp, _ = shapes["lm_head"]
    return MatmulBytes(layers=layers, lm_head=nbytes(out, inp))


def model_quantization(model: nn.Module) -> tuple[str, int | None] | None:
    """``(scheme, group_size)`` of a model ``quantize_model`` made (group size None but for
    int4), or None for a float model."""
    return getattr(model, "quantization", None)


def apply_quantization(model: nn.Module, scheme: str | None, group_size: int) -> tuple[nn.Module, str | None, int]:
    """The model an engine of ``quantization=scheme`` runs, with the scheme and group size it runs:
    ``quantize_model``'s copy; with None, ``model`` itself and the scheme ``quantize_model`` gave
    it, if any (a dequantized reference runs as a float model: its bytes are its dtype's).
    Raises ``ValueError`` as ``quantize_model``."""
    if scheme is not None:
        return quantize_model(model, scheme, group_size), scheme, group_size
    done = model_quantization(model)
    if done is None or done[0] not in SCHEMES:
        return model, None, group_size
    return model, done[0], done[1] or group_size


def quantize_model(
    model: nn.Module, scheme: str, group_size: int = DEFAULT_GROUP_SIZE, reference: bool = False
) -> nn.Module:
    """A copy of ``model`` whose linear layers and LM head are ``scheme``'s layers.

    The copy shares every other tensor with ``model`` (the embedding, the norms, the RoPE
    tables) and leaves ``model`` untouched, so one loaded model serves engines of several
    schemes. ``reference=True`` builds the dequantized reference of the device's kernel instead
    (``ReferenceLinear``; any scheme on any device, for accuracy). A model already quantized
    with the same scheme and group size is returned as it is.

    Raises:
        ValueError: an unsupported scheme/device/dtype (``check_supported``), an int4 group size
            that does not divide a layer, or a model already quantized otherwise.
    """
    key = (scheme + (" reference" if reference else ""), group_size if scheme == "int4" else None)
    done = model_quantization(model)
    if done == key:
        return model
    if done is not None:
        raise ValueError(f"the model is already quantized ({done[0]}); quantize the float model")
    param = next(model.parameters())
    if not reference:
        check_supported(scheme, param.device, param.dtype)
    elif scheme not in SCHEMES:
        raise ValueError(f"quantization={scheme!r} is invalid: use one of {', '.join(SCHEMES)}")
    if scheme == "int4":
        check_group_size(model.config, group_size, kernel=not reference)
    device_type = param.device.type
    return _swap_linears(model, key, lambda w, b: make_linear(scheme, device_type, w, b, group_size, reference))


def reference_model(
    model: nn.Module,
    scheme: str,
    group_size: int = DEFAULT_GROUP_SIZE,
    activation_levels: int | None = None,
    per_tensor: bool = False,
) -> nn.Module:
    """``model`` with ``ReferenceLinear`` layers of explicit activation rounding (``levels`` per
    side, per token or per tensor): the variants a kernel does not run, for the accuracy lesson
    (W8A8 with one activation scale per call against one per token)."""
    if scheme == "int4":
        check_group_size(model.config, group_size, kernel=False)
    where = "per tensor" if per_tensor else "per token"
    key = (f"{scheme} reference, activations {activation_levels} {where}", group_size)
    return _swap_linears(
        model, key, lambda w, b: ReferenceLinear(w, b, scheme, group_size, activation_levels, per_tensor)
    )


def _swap_linears(model: nn.Module, key: tuple, make) -> nn.Module:
    """A copy of ``model`` (modules copied, tensors shared) with every ``llama.Linear`` replaced by
    ``make(weight, bias)``, tagged ``key`` (``model_quantization``). Raises ``ValueError`` for a
    linear layer that carries a forward hook (a rank's all-reduce: ``RankShard`` splits last)."""
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    memo[id(model.config)] = model.config
    out = copy.deepcopy(model, memo)
    with torch.no_grad():
        for parent in list(out.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, Linear):
                    if child._forward_hooks:
                        raise ValueError(f"{name} carries a forward hook: quantize before the tensor-parallel split")
                    setattr(parent, name, make(child.weight, child.bias))
    out.quantization = key
    return out
