"""oneDNN-prepacked linear weights for decoding on a CPU.

Why: a decode step multiplies 1–64 rows by every weight matrix of the model. For so few rows
``F.linear`` (MKL's sgemm) repacks the weight on every call and streams it at a fraction of the
memory's rate: on a 2-core AVX-512 CPU, the 211 products of one SmolLM2-135M decode step take
47 ms at 16 rows; the same products on weights reordered once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, what ``torch.compile``'s CPU freezing pass uses)
take 19 ms, and 14 ms at 1–4 rows against 31–46 ms (``benchmarks/NOTES.md``). With AVX-512
dispatch switched off (``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``) it was 30 against
52 ms.

How: :class:`PackedLinears` keeps one packed copy of every ``nn.Linear`` weight of a model
(a second copy of those weights in memory). :meth:`PackedLinears.invalidate` marks them all
stale (``HFRolloutEngine.sync_weights`` calls it, which the trainer does before every rollout);
besides, a weight whose tensor's version counter or storage changed since it was packed is
repacked. The version counter alone is not enough: torch's fused AdamW (the trainer's optimizer
where the device has the kernel) updates parameters without bumping it.
Inside :meth:`PackedLinears.active`, the linears' forwards run
``torch.ops.mkldnn._linear_pointwise`` on the packed weights when no gradient is needed, and
their own forward otherwise. The products are the same sums in another order: logits differ by
float rounding (``tests/rollout/test_packed.py`` checks logits, log-probs and sampled tokens
against the plain forward).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

PACKED_DTYPES = (torch.float32, torch.bfloat16)
PACKING_NEEDS = "packed weights need a float32 or bfloat16 model on a CPU and a torch built with oneDNN"


def packing_available() -> bool:
    """oneDNN is built into this torch and has the prepacked-linear ops."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


def packable(model) -> bool:
    """Whether :class:`PackedLinears` applies: a model on the CPU in float32 or bfloat16, with oneDNN."""
    p = next(model.parameters(), None)
    return p is not None and p.device.type == "cpu" and p.dtype in PACKED_DTYPES and packing_available()


class PackedLinears:
    """Packed copies of a model's ``nn.Linear`` weights, used by no-grad forwards inside :meth:`active`.

    Args:
        model: the model whose linears to pack (on the CPU, float32 or bfloat16).
        rows_hint: the batch size oneDNN tunes the packed layout for (any number of rows works).
    """

    def __init__(self, model: nn.Module, rows_hint: int = 16) -> None:
        self.linears = [m for m in model.modules() if type(m) is nn.Linear and m.weight.dtype in PACKED_DTYPES]
        self.rows_hint = rows_hint
        self.packed: list[torch.Tensor | None] = [None] * len(self.linears)
        self._packed_from: list[tuple | None] = [None] * len(self.linears)

    @staticmethod
    def _key(w: torch.Tensor) -> tuple:
        return (w.data_ptr(), w._version, w.dtype, tuple(w.shape))

    @torch.no_grad()
    def refresh(self) -> int:
        """Repacks every weight that changed since it was packed; returns how many were repacked."""
        n = 0
        for i, m in enumerate(self.linears):
            key = self._key(m.weight)
            if key != self._packed_from[i]:
                self.packed[i] = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), self.rows_hint)
                self._packed_from[i] = key
                n += 1
        return n

    def invalidate(self) -> None:
        """Marks every packed copy stale: the next :meth:`refresh` (every :meth:`active` starts with one)
        repacks them all. Call it after changing the weights (an optimizer step, a weight sync)."""
        self._packed_from = [None] * len(self.linears)

    @contextlib.contextmanager
    def active(self):
        """Within the block, the model's linears multiply by their packed weights when no gradient is needed.

        Refreshes first, so a weight changed since the last call is never multiplied stale."""
        self.refresh()
        for m, w in zip(self.linears, self.packed):
            m.forward = _packed_forward(m, w)  # an instance attribute: Module.__call__ calls it
        try:
            yield self
        finally:
            for m in self.linears:
                m.__dict__.pop("forward", None)


def _packed_forward(module: nn.Linear, packed: torch.Tensor):
    plain = type(module).forward.__get__(module)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if (torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad)) or x.dtype != packed.dtype:
            return plain(x)
        return torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")

    return forward
