"""oneDNN-prepacked linear weights: faster products on a CPU, for sampling and for training.

Why: on a CPU, ``F.linear`` runs MKL's sgemm, which repacks the weight on every call and, on the
AMD EPYC CPUs this project runs on, takes its AVX2 code path even where the CPU has AVX-512.
oneDNN's inner product on a weight reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, what ``torch.compile``'s CPU freezing pass uses)
does neither (``benchmarks/NOTES.md`` and ``benchmarks/dev/packed_products.py`` measure both).

How: :class:`PackedLinears` keeps one packed copy of every ``nn.Linear`` weight of a model, and,
once a forward needs gradients, one of its transpose (each a further copy of those weights in
memory). Inside :meth:`PackedLinears.active` the linears' forwards multiply by them:

- without gradients (sampling, old-policy and reference log-probs): ``y = x W^T + b`` by the
  packed W;
- with gradients (the update): :class:`_PackedLinearFn`, whose backward computes
  ``dx = dy W`` by the packed W^T and ``dW = dy^T x`` by oneDNN with one of the two activations
  reordered per call (:func:`_weight_grad`);
- under autocast, for an input of another dtype, and with gradients unless
  :func:`packed_training_pays` (off by default: it did not pay), the module's own forward.

Which dtypes pack is probed once per process (:func:`dtype_unpackable`): float32 everywhere, bfloat16
only where oneDNN's bf16 reorder runs on this CPU. ``RLVR_CPU_ACCEL=0`` turns packing off.

The products are the same sums in another order: results differ from the plain forward by float
rounding (``tests/cpu/test_packed.py`` checks logits, gradients, log-probs and sampled tokens).

Staleness: :meth:`PackedLinears.invalidate` marks copies stale; :meth:`PackedLinears.watch`
calls it after each step of an optimizer for the weights that optimizer steps (a step post-hook),
and ``HFRolloutEngine.sync_weights`` calls it for the weights that require grad (every weight
when it samples from a copy of the policy). A forward inside :meth:`active` repacks its weight
first when it is stale or its tensor (storage or version counter) changed since it was packed. The
version counter alone is not enough: torch's fused AdamW (the trainer's optimizer where the device
has the kernel) updates parameters without bumping it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

import torch
from torch import nn

PACKED_DTYPES = (torch.float32, torch.bfloat16)


def packing_available() -> bool:
    """oneDNN is built into this torch and has the prepacked-linear ops."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


ONEDNN_BF16_FEATURES = (("avx512bw", "avx512vl", "avx512dq"), ("avx_ne_convert",))
"""The CPU features oneDNN's bf16 weight reorder needs: all of the first group, or the second
(torch's ``mkldnn_bf16_device_check``). It reads the CPU itself, so ``ONEDNN_MAX_CPU_ISA`` does not
change the answer."""


def cpu_flags() -> set[str]:
    """The CPU feature flags Linux reports (``/proc/cpuinfo``); empty where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _missing_bf16_features() -> str:
    """What oneDNN's bf16 reorder needs and which of it this CPU lacks, as one phrase."""
    need = " or ".join("+".join(group) for group in ONEDNN_BF16_FEATURES)
    flags = cpu_flags()
    missing = [f for group in ONEDNN_BF16_FEATURES for f in group if f not in flags]
    return f"it needs {need}" + (f", and this CPU lacks {', '.join(missing)}" if flags else "")


def dtype_unpackable(dtype: torch.dtype) -> str | None:
    """None where oneDNN packs ``dtype`` weights on this CPU, else one line saying why not
    (``RLVR_CPU_ACCEL=0`` included)."""
    from rlvr.cpu import SWITCH, enabled

    if not enabled():
        return f"{SWITCH}=0 turns the CPU acceleration off"
    return _probe(dtype)


@functools.cache
def _probe(dtype: torch.dtype) -> str | None:
    """:func:`dtype_unpackable`'s answer for this CPU, found once per dtype and process.

    Decided by packing and multiplying a tiny weight once (caught), not by ATen's dispatch level:
    oneDNN's bf16 reorder checks the CPU's own features (:data:`ONEDNN_BF16_FEATURES`), which an
    AVX2-only CPU lacks while ``get_cpu_capability()`` reads the same on CPUs that have them."""
    if dtype not in PACKED_DTYPES:
        return f"oneDNN packs float32 and bfloat16 weights, not {str(dtype).removeprefix('torch.')}"
    if not packing_available():
        return "this torch has no oneDNN prepacked linear (torch.backends.mkldnn)"
    try:
        w, x = torch.ones(32, 16, dtype=dtype), torch.ones(2, 16, dtype=dtype)
        y = packed_linear(x, pack_weight(w, 2))
        if not torch.equal(y.float(), torch.full((2, 32), 16.0)):
            return f"oneDNN's packed {str(dtype).removeprefix('torch.')} product gave a wrong result on this CPU"
    except RuntimeError as e:
        name = str(dtype).removeprefix("torch.")
        if dtype == torch.bfloat16:
            return f"oneDNN cannot pack bfloat16 weights on this CPU: {_missing_bf16_features()}"
        return f"oneDNN cannot pack {name} weights here: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    return None


def why_unpackable(model) -> str | None:
    """None where :class:`PackedLinears` applies to ``model`` (on the CPU, float32 or bfloat16 that
    oneDNN packs on this CPU, :func:`dtype_unpackable`), else one line saying why not."""
    p = next(model.parameters(), None)
    if p is None:
        return "the model has no parameters"
    if p.device.type != "cpu":
        return f"packed weights are for a CPU, and the model is on {p.device.type}"
    return dtype_unpackable(p.dtype)


def packable(model) -> bool:
    """Whether :class:`PackedLinears` applies to ``model`` (:func:`why_unpackable`)."""
    return why_unpackable(model) is None


def packed_training_pays() -> bool:
    """Whether the update's products run packed (:class:`_PackedLinearFn`): only when
    ``RLVR_PACKED_UPDATE=1`` asks for it. Sampling and the no-grad passes stay packed either way.

    Why off by default: since the update's LM head is fused (its product runs on the weight itself)
    and each group's prompt and responses run in one pass, the packed update was no faster than
    PyTorch's own products on any CPU measured, and it keeps a packed W^T of every linear besides.
    On a 2-core AVX-512 AMD EPYC (no AMX), 4 quickstart micro-batches and an AdamW step took 10 %
    longer packed with 2 threads and the same with 1 (per-call reorders of the activations for the
    weight gradient, and a repack of every weight and its transpose after each step); with AVX2
    dispatch it was no faster before either (``benchmarks/NOTES.md``)."""
    return os.environ.get("RLVR_PACKED_UPDATE") == "1"


def pack_weight(w: torch.Tensor, rows_hint: int) -> torch.Tensor:
    """``w`` [out, in] in oneDNN's blocked layout for products of about ``rows_hint`` rows; a transposed
    view is read as it is (no contiguous copy first)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows_hint)


def packed_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    add: torch.Tensor | None = None,
    mul: torch.Tensor | None = None,
    silu: bool = False,
) -> torch.Tensor:
    """``x W^T + b`` by a weight from :func:`pack_weight`, then (at most one, fused into the product as a
    oneDNN post-op) ``+ add``, ``* mul`` (tensors of the output's shape) or SiLU."""
    ops = torch.ops.mkldnn._linear_pointwise
    if add is not None:
        return ops.binary(x, add, packed, bias, "add")
    if mul is not None:
        return ops.binary(x, mul, packed, bias, "mul")
    return ops(x, packed, bias, "swish" if silu else "none", [], "")


class _PackedLinearFn(torch.autograd.Function):
    """``x W^T + b`` by the packed W; backward by the packed W^T (dx) and by oneDNN on x^T (dW)."""

    @staticmethod
    def forward(ctx, x, weight, bias, slot):
        ctx.save_for_backward(x)
        ctx.slot, ctx.has_bias = slot, bias is not None
        return packed_linear(x, slot.packed, bias)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        slot = ctx.slot
        grad = grad.contiguous()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = packed_linear(grad, slot.transposed())
        if ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2]):
            g2, x2 = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
            if ctx.needs_input_grad[1]:
                dw = _weight_grad(g2, x2)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                db = g2.sum(0)
        return dx, dw, db, None


def _weight_grad(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dW [out, in] = g^T x for g [rows, out], x [rows, in]: a linear of g^T with weight x^T, by oneDNN,
    which beat MKL on every SmolLM2-135M shape measured (``benchmarks/NOTES.md``)."""
    return packed_linear(g.t().contiguous(), pack_weight(x.t(), g.shape[1]))


class _Slot:
    """One linear's packed weight, and its packed transpose once a backward asks for it."""

    def __init__(self, module: nn.Linear, rows_hint: int) -> None:
        self.module, self.rows_hint = module, rows_hint
        self.packed: torch.Tensor | None = None
        self._t: torch.Tensor | None = None
        self.key: tuple | None = None
        self.generation = 0
        """Times the weight was packed: a copy derived from the packed weight is stale when this moved on."""

    def current_key(self) -> tuple:
        w = self.module.weight
        return (w.data_ptr(), w._version, w.dtype, tuple(w.shape))

    def refresh(self) -> bool:
        key = self.current_key()
        if key == self.key:
            return False
        self.packed, self._t, self.key = pack_weight(self.module.weight, self.rows_hint), None, key
        self.generation += 1
        return True

    def transposed(self) -> torch.Tensor:
        if self._t is None:
            self._t = pack_weight(self.module.weight.t(), self.rows_hint)
        return self._t


class PackedLinears:
    """Packed copies of a model's ``nn.Linear`` weights, multiplied by inside :meth:`active`.

    Args:
        model: the model whose linears to pack (on the CPU, float32 or bfloat16).
        rows_hint: the rows per product oneDNN tunes the packed layout for (any number works).
        train: forwards that need gradients use the packed weights too (:class:`_PackedLinearFn`);
            False = they run the module's own forward. Default: :func:`packed_training_pays`.
    """

    def __init__(self, model: nn.Module, rows_hint: int = 16, *, train: bool | None = None) -> None:
        self.slots = [
            _Slot(m, rows_hint) for m in model.modules() if type(m) is nn.Linear and m.weight.dtype in PACKED_DTYPES
        ]
        self.train = packed_training_pays() if train is None else train
        self._depth = 0

    @property
    def linears(self) -> list[nn.Linear]:
        return [s.module for s in self.slots]

    @torch.no_grad()
    def refresh(self) -> int:
        """Repacks every weight whose tensor changed since it was packed, or all after
        :meth:`invalidate`; returns how many were repacked."""
        return sum(s.refresh() for s in self.slots)

    def invalidate(self, params=None) -> None:
        """Marks packed copies stale: every one, or those of the weights in ``params``; the next forward
        that uses one repacks it. Call it after changing the weights (an optimizer step, a weight sync)."""
        ids = None if params is None else {id(p) for p in params}
        for s in self.slots:
            if ids is None or id(s.module.weight) in ids:
                s.key = None

    def watch(self, optimizer: torch.optim.Optimizer):
        """Invalidates the weights ``optimizer`` steps after every ``optimizer.step()`` (with LoRA, the
        adapter's: the frozen base stays packed); returns the hook's handle."""

        def stepped(opt, *args, **kwargs):
            self.invalidate([p for group in opt.param_groups for p in group["params"]])

        return optimizer.register_step_post_hook(stepped)

    @contextlib.contextmanager
    def active(self):
        """Within the block, the model's linears multiply by their packed weights (see the module docstring).

        Each forward first repacks its weight if it is stale (invalidated, or its tensor changed), so
        an optimizer step inside the block is seen by the next forward. Nests."""
        if self._depth:
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
            return
        own = [s.module.__dict__.get("forward") for s in self.slots]  # a forward set on the instance (a hook's)
        for s, prev in zip(self.slots, own):
            s.module.forward = _packed_forward(s, self.train, prev)  # an instance attribute: Module.__call__ calls it
        self._depth = 1
        try:
            yield self
        finally:
            self._depth = 0
            for s, prev in zip(self.slots, own):
                if prev is None:
                    s.module.__dict__.pop("forward", None)
                else:
                    s.module.forward = prev


def _packed_forward(slot: _Slot, train: bool, own=None):
    module = slot.module
    plain = own if own is not None else type(module).forward.__get__(module)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != module.weight.dtype or torch.is_autocast_enabled(x.device.type):
            return plain(x)
        grad = torch.is_grad_enabled() and (
            x.requires_grad or module.weight.requires_grad or (module.bias is not None and module.bias.requires_grad)
        )
        if grad and not train:
            return plain(x)
        slot.refresh()  # a key comparison; repacks after invalidate() or a changed tensor
        if grad:
            return _PackedLinearFn.apply(x, module.weight, module.bias, slot)
        return packed_linear(x, slot.packed, module.bias)

    return forward
