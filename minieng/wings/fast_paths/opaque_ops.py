"""Operators that ``torch.compile`` calls as they are: the products and the paged attention.

Compiled code (``LLMEngine(compile=True)``) fuses the small operations around a layer's matrix
products and its attention, but must not trace into them: oneDNN's product wants its weights frozen
into constants to be lowered, fbgemm's takes packed weights that are not a tensor (either breaks
the graph), and attention over the paged pool reads block tables that change every step. Each is
declared here as an operator of the ``minieng`` namespace, with a kernel and a fake implementation
that gives the compiler only its output's shape (vLLM declares its attention the same way).

They are declared with ``torch.library.Library`` (a schema and a kernel) rather than
``torch.library.custom_op``: both are opaque to the compiler, but custom_op's Python wrapper costs
more per call, and a decode step makes one call per product and per attention. Declared this way,
the default model's compiled W8A8 decode step on a 2-core AMD EPYC (Zen 4) spent about 4 ms less in
the wrappers (docs/measurements.md, ``wings/fast_paths/opaque_ops.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from minieng.core.llama import ONEDNN_LINEAR, Linear, linear

_LIB = torch.library.Library("minieng", "FRAGMENT")


def opaque_op(schema: str, kernel: Callable, fake: Callable, dispatch_key: str = "CompositeExplicitAutograd"):
    """Declare ``minieng::<name>`` from ``schema`` (torch's schema language, e.g.
    ``"f(Tensor x, int n) -> Tensor"``; ``Tensor(a!)`` marks an argument the kernel writes), run by
    ``kernel`` on ``dispatch_key`` (every device by default) and described to the compiler by
    ``fake`` (same arguments; returns an empty tensor of the output's shape and dtype).
    Returns the operator (an ``OpOverload``), called like ``kernel``."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, kernel, dispatch_key)
    torch.library.register_fake(f"minieng::{name}", fake, lib=_LIB)
    return getattr(torch.ops.minieng, name).default


# ``llama.linear``'s oneDNN product as an opaque operator (inductor lowers the oneDNN op only for
# weights frozen into constants).
onednn_linear = opaque_op(
    "onednn_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
    lambda x, weight, bias: torch.ops.mkldnn._linear_pointwise.default(x, weight, bias, "none", [], ""),
    lambda x, weight, bias: x.new_empty(x.shape[0], weight.shape[0]),
    "CPU",
)


class OpaqueLinear(Linear):
    """A ``llama.Linear`` whose oneDNN product compiled code calls as ``onednn_linear``; eager, the same
    ``linear`` as any ``Linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if torch.compiler.is_compiling() and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2:
            return onednn_linear(x, w, b)
        return linear(x, w, b)


def use_opaque_linears(model: nn.Module) -> None:
    """Give every ``Linear`` of ``model`` the ``OpaqueLinear`` forward, its parameters kept (where
    ``llama.ONEDNN_LINEAR``: an x86-64 CPU's oneDNN; elsewhere compiled code's ``F.linear`` is the
    product already). Eager steps, and other engines sharing the model, run as before."""
    if ONEDNN_LINEAR:
        for module in model.modules():
            if type(module) is Linear:
                module.__class__ = OpaqueLinear
