"""What a piece of code allocates on one device, op by op: the bytes alive at its peak, without a GPU.

``AllocationTrace`` is a ``TorchDispatchMode``: every aten op dispatched while it is active is
seen with its outputs, and each output whose storage is new (not one of the op's inputs', not one
seen before) is a fresh allocation on that storage's device. A ``weakref.finalize`` on the storage
tells when it is freed (torch keeps one Python object per live storage, so the finalizer runs when
the storage itself dies, not when one of its tensors does). So the trace knows the bytes alive at
every moment and keeps their peak: ``torch.cuda.max_memory_allocated``'s figure, counted on any
device (the caching allocator's rounding to 512-byte blocks aside), and the dtype and size of every
allocation (a float32 detour while building a bfloat16 model shows there).

Only what dispatches is seen: storages created before the trace started, or outside torch's
dispatcher (a NumPy array shared with ``torch.from_numpy``), are not counted.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class Allocation:
    """One fresh storage: the op that made it (``op``, aten's name), its ``dtype`` and ``nbytes``."""

    op: str
    dtype: torch.dtype
    nbytes: int


class AllocationTrace(TorchDispatchMode):
    """Bytes allocated on ``device_type`` ("cpu", "cuda", ...) while active:
    ``with AllocationTrace("cpu") as trace: ...``, then ``trace.peak_bytes`` (the most bytes alive
    at once from the allocations it saw, freed ones subtracted), ``trace.live_bytes`` (those still
    alive), ``trace.allocations`` (each one, in order) and ``trace.created_bytes`` (their sum)."""

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.allocations: list[Allocation] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: set[int] = set()  # data pointers of the storages allocated here and still alive

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                self._seen(func, t, inputs)
        return out

    def _seen(self, func, t: torch.Tensor, inputs: set[int]) -> None:
        storage = t.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or ptr in inputs or ptr in self._live:  # a view, an in-place op's output, or known
            return
        self._live.add(ptr)
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.allocations.append(Allocation(func.overloadpacket.__name__, t.dtype, nbytes))
        weakref.finalize(storage, self._freed, ptr, nbytes)

    def _freed(self, ptr: int, nbytes: int) -> None:
        if ptr in self._live:
            self._live.discard(ptr)
            self.live_bytes -= nbytes

    @property
    def created_bytes(self) -> int:
        return sum(a.nbytes for a in self.allocations)

    def largest(self, dtype: torch.dtype) -> int:
        """The largest single allocation of ``dtype``, bytes (0: none)."""
        return max((a.nbytes for a in self.allocations if a.dtype == dtype), default=0)
