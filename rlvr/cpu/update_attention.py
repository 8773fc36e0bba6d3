"""The update's shared-prompt attention as one compiled call a direction (``update_attention.c``),
on AVX512-BF16's bf16 dot products, for passes under bf16 autocast on a CPU.

Why: :func:`rlvr.models.shared_prefix._grouped_attention` writes that attention as batched products
and a softmax in torch. On the short blocks of a GRPO group (a prompt of a hundred tokens, segments of
tens, head size 64) its products are thin and the operators around them (the mask's bias, the
float32 softmax and its casts, the layout copies and about 60 views a layer) cost more than the
products: a 2-core AVX-512 CPU ran it at about a fifth of its other products' rate
(``benchmarks/NOTES.md``). The kernel reads the unpadded rows as they are (no segment padding, no
gathers, only the blocks of 16 keys each query's mask reaches), keeps no probabilities for the
backward (it recomputes them from each query's log-sum-exp) and sums the keys' and values' gradients
per thread in float32.

Precision: the products run in bf16 with float32 sums, the softmax in float32 and the probabilities
(and, in the backward, the scores' gradients) are rounded to bf16 once, as the torch kernels under
autocast do; the scores themselves stay float32 (torch's bf16 products round them). The output and
the gradients are bf16. ``tests/cpu/test_update_attention.py`` checks it against a float32 reference.

Fences (each falls back to the torch kernels; :data:`why_not` says why in one line): those of the
decode kernels (:func:`rlvr.cpu.kernels.fenced_build`; ``RLVR_UPDATE_ATTENTION=0`` turns this one
off), a compiler target without AVX512-BF16 (AVX2 hosts, where ``auto`` trains in float32 anyway),
and a first call on a tiny shape that does not match a float32 reference (:func:`_self_check`).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from rlvr.cpu import kernels

SOURCE = Path(__file__).with_name("update_attention.c")
SWITCH = "RLVR_UPDATE_ATTENTION"
_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_ERRORS = {
    1: "the head size must be a multiple of 64, at most 256",
    2: "the query heads must be a multiple of the key/value heads",
    3: "at most 16 query heads a key/value head",
    4: "out of memory",
    5: "built without AVX512-BF16",
    6: "no groups, segments or prompt positions",
}

why_not: str | None = None
"""Why :func:`load` returned None (one line), once it has."""


class Library:
    """The loaded ``update_attention.c``: :meth:`forward` and :meth:`backward` on raw tensors."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.ua_supported.restype = _I
        lib.ua_forward.argtypes = [_P] * 5 + [_I] * 6 + [_F, _P, _P]
        lib.ua_forward.restype = _I
        lib.ua_backward.argtypes = [_P] * 5 + [_I] * 6 + [_F] + [_P] * 5
        lib.ua_backward.restype = _I

    @property
    def supported(self) -> bool:
        """Whether the build has the kernels (the compiler's target has AVX512-BF16)."""
        return bool(self.lib.ua_supported())

    def forward(self, q: Tensor, k: Tensor, v: Tensor, real: Tensor, lens: Tensor, G: int, scale: float):
        """(out [N, h, d] bf16, lse [N, h] float32) of ``q`` [N, h, d], ``k``, ``v`` [N, kv, d] (bf16),
        ``real`` [P, Lp] (uint8: the prompt keys that are not padding) and ``lens`` [P·G] (int32, each ≥ 1)."""
        N, h, d = q.shape
        self._check(q, k, v, real, lens)
        out, lse = torch.empty_like(q), torch.empty(N, h, dtype=torch.float32)
        P, Lp = real.shape
        rc = self.lib.ua_forward(
            *(t.data_ptr() for t in (q, k, v, real, lens)), P, G, Lp, h, k.shape[1], d, scale, out.data_ptr(),
            lse.data_ptr(),
        )  # fmt: skip
        self._raise(rc)
        return out, lse

    def backward(self, q, k, v, real, lens, G: int, scale: float, dout: Tensor, lse: Tensor):
        """(dq, dk, dv) in bf16 for the output gradient ``dout`` [N, h, d] (bf16) of :meth:`forward`."""
        N, h, d = q.shape
        self._check(q, k, v, real, lens)
        kernels._check(dout, "dout", shape=q.shape, dtype=torch.bfloat16)
        kernels._check(lse, "lse", shape=(N, h))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        P, Lp = real.shape
        rc = self.lib.ua_backward(
            *(t.data_ptr() for t in (q, k, v, real, lens)), P, G, Lp, h, k.shape[1], d, scale,
            *(t.data_ptr() for t in (dout, lse, dq, dk, dv)),
        )  # fmt: skip
        self._raise(rc)
        return dq, dk, dv

    @staticmethod
    def _check(q: Tensor, k: Tensor, v: Tensor, real: Tensor, lens: Tensor) -> None:
        """ValueError unless the tensors have the shapes, dtypes and layout the C code reads."""
        N, h, d = q.shape
        kernels._check(q, "q", dims=3, dtype=torch.bfloat16)
        kernels._check(k, "k", dims=3, dtype=torch.bfloat16)
        kernels._check(v, "v", shape=k.shape, dtype=torch.bfloat16)
        kernels._check(real, "real", dims=2, dtype=torch.uint8)
        kernels._check(lens, "lens", dims=1, dtype=torch.int32)
        P, Lp = real.shape
        if k.shape[0] != N or k.shape[2] != d or P == 0 or lens.numel() % P:
            raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, {P} prompts and {lens.numel()} segments differ")
        if int(lens.min()) < 1 or P * Lp + int(lens.sum()) != N:
            raise ValueError(f"the segments' lengths ({lens.tolist()}) and {P} prompts of {Lp} do not make {N} rows")

    @staticmethod
    def _raise(rc: int) -> None:
        if rc:
            raise ValueError(f"update_attention.c: {_ERRORS.get(rc, f'error {rc}')}")


class _Attention(torch.autograd.Function):
    """The kernel's forward and backward under autograd; the inputs are :meth:`Library.forward`'s."""

    @staticmethod
    def forward(ctx, lib: Library, q, k, v, real, lens, G: int, scale: float):
        out, lse = lib.forward(q, k, v, real, lens, G, scale)
        ctx.save_for_backward(q, k, v, real, lens, lse)
        ctx.lib, ctx.G, ctx.scale = lib, G, scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, real, lens, lse = ctx.saved_tensors
        dout = grad.to(torch.bfloat16).contiguous()
        dq, dk, dv = ctx.lib.backward(q, k, v, real, lens, ctx.G, ctx.scale, dout, lse)
        return None, dq, dk, dv, None, None, None, None


def attention(
    lib: Library, query: Tensor, key: Tensor, value: Tensor, real: Tensor, lengths: tuple[int, ...], scale: float
) -> Tensor:
    """The shared-prefix attention of [B, h, L, d] queries and [B, kv, L, d] keys and values (any float
    dtype), whose B·L positions are the groups end to end, each its prompt part and its segments of
    ``lengths``, as [B, L, h, d] bf16, with gradients (:func:`rlvr.models.shared_prefix.use_kernel`).

    Args:
        real: [P, Lp] bool, the prompt keys that are not padding (left padding: a padding query
            attends to itself only).
        lengths: each segment's positions (≥ 1), P·G of them, on the host.
    """
    P, (B, h, L, d) = real.shape[0], query.shape
    q, k, v = (_rows(x) for x in (query, key, value))
    lens = torch.tensor(lengths, dtype=torch.int32)  # cpu: the C code reads it
    flags = real.to(torch.uint8).contiguous()
    return _Attention.apply(lib, q, k, v, flags, lens, len(lengths) // P, float(scale)).view(B, L, h, d)


def _rows(x: Tensor) -> Tensor:
    """[B, heads, L, d] as contiguous bf16 [B·L, heads, d], cast and laid out in one copy (none if it is)."""
    rows = x.transpose(1, 2)
    if rows.dtype == torch.bfloat16:
        return rows.contiguous().view(-1, *rows.shape[2:])
    return rows.to(torch.bfloat16, memory_format=torch.contiguous_format).view(-1, *rows.shape[2:])


def kernel():
    """(the function :func:`rlvr.models.shared_prefix.use_kernel` installs, None), or (None, why not)."""
    lib = load()
    return (None, why_not) if lib is None else (functools.partial(attention, lib), None)


@functools.cache
def load() -> Library | None:
    """The compiled kernels, once per process, self-checked; None (:data:`why_not` says why) where
    they are off, cannot be built, or this CPU's compiler target has no AVX512-BF16."""
    global why_not
    lib, why_not = kernels.fenced_build(SWITCH, SOURCE, lambda cc: Library(kernels.compile_library(cc, SOURCE)))
    if lib is not None and not lib.supported:
        lib, why_not = None, "this CPU has no AVX512-BF16 (the kernels' bf16 products)"
    if lib is not None and (err := _self_check(lib)) is not None:
        lib, why_not = None, f"the compiled kernel differs from a float32 reference on a tiny shape ({err})"
    return lib


def reference(query: Tensor, key: Tensor, value: Tensor, real: Tensor, lengths: tuple[int, ...], scale: float):
    """:func:`attention` in float32 torch operations, one group at a time (the tests' and
    :func:`_self_check`'s reference): [B, L, h, d] float32."""
    P, Lp = real.shape
    G, (B, h, L, d) = len(lengths) // P, query.shape
    q, k, v = (x.transpose(0, 1).reshape(x.shape[1], B * L, d).float() for x in (query, key, value))  # [heads, N, d]
    r = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(r, 0), v.repeat_interleave(r, 0)
    out, row = [], 0
    for p in range(P):
        n = Lp + sum(lengths[p * G : (p + 1) * G])
        allow = torch.zeros(n, n, dtype=torch.bool)  # cpu: a small test reference
        i = torch.arange(Lp)  # cpu: as above
        allow[:Lp, :Lp] = (i[:, None] >= i[None, :]) & real[p][None, :]
        allow[i, i] = True
        s = Lp
        for g in range(G):
            length = lengths[p * G + g]
            allow[s : s + length, :Lp] = real[p][None, :]
            t = torch.arange(length)  # cpu: as above
            allow[s : s + length, s : s + length] = t[:, None] >= t[None, :]
            s += length
        scores = (q[:, row : row + n] @ k[:, row : row + n].transpose(1, 2)) * scale
        probs = scores.masked_fill(~allow, float("-inf")).softmax(-1)
        out.append(probs @ v[:, row : row + n])
        row += n
    return torch.cat(out, 1).transpose(0, 1).reshape(B, L, h, d)


def _self_check(lib: Library) -> str | None:
    """None when the kernel's output and gradients match :func:`reference` on a tiny shape (3 query
    heads a key/value head, head size 64, left padding, uneven segments), else what differed."""
    g = torch.Generator().manual_seed(0)
    real = torch.tensor([[0, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)  # cpu: a tiny check
    lengths = (3, 1, 17, 2)
    N = 2 * 5 + sum(lengths)
    q, k, v = (torch.randn(1, h, N, 64, generator=g).bfloat16() for h in (6, 2, 2))
    got = attention(lib, *(x.requires_grad_() for x in (q, k, v)), real, lengths, 0.125)
    grad = torch.randn(got.shape, generator=g).bfloat16()
    got.backward(grad)
    grads = [x.grad for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    want = reference(q, k, v, real, lengths, 0.125)
    want.backward(grad.float())
    for name, a, b in zip(("output", "dq", "dk", "dv"), [got, *grads], [want, q.grad, k.grad, v.grad]):
        err = (a.float() - b.float()).abs().max().item() / max(b.float().abs().max().item(), 1e-6)
        if not err < 0.03:
            return f"the {name} differs by {err:.3g} of its largest value"
    return None
