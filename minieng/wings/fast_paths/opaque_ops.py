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
