"""Weight-only int8 for the linear layers: per-output-channel symmetric int8, dynamic activations.

Each output channel's weights are scaled by max|w| / 127 and rounded to int8; at run time the
activations are quantized per batch and the product runs in int8 with int32 accumulation
(torch's ``quantized::linear_dynamic``, fbgemm/x86 on CPU). A quarter of the fp32 bytes per
weight: the lever that helps memory-bound decode. Used for the quantized self-draft of
speculative decoding, where the target checks every token, so the draft's error costs speed,
never correctness.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from .model import Linear, LlamaForCausalLM


class Int8Linear(nn.Module):
    """y = x @ W.T (+ b) with W [out, in] stored as per-channel int8; same interface as ``model.Linear``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        w = weight.detach().contiguous().float()  # [out, in]
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            # torch 2.13 deprecates its quantized tensors in favour of torchao; the kernels still
            # run, and this module is the one place to change when they go.
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            qw = torch.quantize_per_channel(w, scales, zero, 0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(qw, None if bias is None else bias.detach().float())
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x.float(), self.packed).to(x.dtype)


def quantize_int8(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """A copy of ``model`` whose linear layers and LM head are int8 (embedding and norms stay).

    CPU only (torch's dynamic int8 kernels); raises ``ValueError`` on another device.
    """
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"draft_quantization='int8' runs on the CPU only (model on {device}); on a GPU "
                         "use a smaller draft_model instead")
    draft = copy.deepcopy(model)
    for parent in list(draft.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Linear):
                setattr(parent, name, Int8Linear(child.weight, child.bias))
    return draft
