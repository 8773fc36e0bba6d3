"""What makes a GPU's host wait, counted on a CPU: the dispatch-mode counter the decode and the update
tests share (issues 36 and 37). Imported as ``host_syncs`` (tests/ is on ``sys.path``, see tiny_run)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostSyncs(TorchDispatchMode):
    """Counts the ops that read a device tensor's value on the host: scalar reads (``.item()``, ``bool()``
    of a tensor), ``nonzero`` (its output size) and ``is_nonzero``. A subclass can split them by caller
    (:meth:`sync`) or count other ops as reads too (:meth:`other`, e.g. copies into host buffers, which
    on a CPU are told apart only by their destination)."""

    SYNCS = {
        torch.ops.aten._local_scalar_dense.default,
        torch.ops.aten.nonzero.default,
        torch.ops.aten.is_nonzero.default,
    }

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def sync(self, func, args) -> None:
        """One of :attr:`SYNCS` was dispatched."""
        self.count += 1

    def other(self, func, args) -> None:
        """Any other op was dispatched."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.SYNCS:
            self.sync(func, args)
        else:
            self.other(func, args)
        return func(*args, **(kwargs or {}))
