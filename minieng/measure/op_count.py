"""How many operations a step dispatches: the count that bounds a small model's decode step.

Every aten op torch dispatches costs host time (Python, the dispatcher) and, on a GPU, a kernel
launch; a decode step of a small model can spend more time dispatching than reading its weights.
``OpCounter`` is a ``TorchDispatchMode`` that counts each op by name, split into *views* (ops that
only reshape metadata: no kernel, no bytes moved) and *computing* ops (everything else: each a
kernel on a GPU). Within a model, ``count_layer_ops`` counts only the ops run inside its decoder
layers, so a per-layer figure does not mix in the step's own (embedding, sampling).

Deterministic: the same step dispatches the same ops on every run, so tests hold a budget, not a
timing.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that return a view or alias (or split one into views): metadata only, no kernel.
VIEW_OPS = frozenset(
    {
        "alias",
        "as_strided",
        "detach",
        "expand",
        "narrow",
        "permute",
        "reshape",
        "select",
        "slice",
        "split",
        "split_with_sizes",
        "squeeze",
        "t",
        "transpose",
        "unbind",
        "unsqueeze",
        "view",
        "view_as_complex",
        "view_as_real",
        "_reshape_alias",
        "_unsafe_view",
    }
)


@dataclass(frozen=True)
class OpCount:
    """Ops counted by name (``ops``), and their split: ``views`` and ``computing``."""

    ops: Counter

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def views(self) -> int:
        return sum(n for name, n in self.ops.items() if name in VIEW_OPS)

    @property
    def computing(self) -> int:
        return self.total - self.views


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched while active (``with OpCounter() as c: ...; c.result()``).
    ``enabled`` switches counting without leaving the mode (``count_layer_ops`` toggles it)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.enabled = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.enabled:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    def result(self) -> OpCount:
        return OpCount(Counter(self.ops))


@contextmanager
def count_layer_ops(layers: list[nn.Module]):
    """Count only the ops dispatched inside ``layers``' forwards (a model's decoder layers):
    ``with count_layer_ops(model.layers) as counter: <one step>``; ``counter.result()`` then holds
    the layers' ops, to divide by ``len(layers)``."""
    counter = OpCounter()
    counter.enabled = False

    def start(module, args):
        counter.enabled = True

    def stop(module, args, output):
        counter.enabled = False

    handles = [
        h for layer in layers for h in (layer.register_forward_pre_hook(start), layer.register_forward_hook(stop))
    ]
    try:
        with counter:
            yield counter
    finally:
        for h in handles:
            h.remove()
