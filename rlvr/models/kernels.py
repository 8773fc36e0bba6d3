"""The lean decode step's kernels (``decode_kernels.c``): compiled on this machine at first use,
called through ctypes.

Why (``benchmarks/NOTES.md`` has the measurements; SmolLM2-135M, 16 rows, a 2-core AVX-512 CPU):

- **products**: oneDNN's prepacked product does not overlap its weight reads with its arithmetic at
  8-16 rows (the 211 products of a step 19-21 ms at 16 rows against 12.3 ms to read the weights
  once). The kernel streams each weight panel once while 16 rows accumulate in registers: 14-16 ms.
- **attention**: in torch operations about 12 small operations a layer, 6.3-7.9 ms of a 30-33 ms
  step, mostly per-call overhead of products too small for a BLAS.
- **the rest of the step**: norms, SiLU, softmax and the calls themselves, about 20 torch or ctypes
  calls a layer with the other thread idle during each: 4.4 ms of a 22 ms step when only the
  products and the attention were compiled. :meth:`DecodeKernels.step` runs all of it in one call
  (16.3-17.4 ms a step; 13.3-13.9 ms at 80 GB/s after the products took their input k-major and the
  weights' prefetch became non-temporal).
- **sampling** (:meth:`DecodeKernels.pick`): the seeded inverse-CDF sampler's temperature, exp,
  float64 block sums and searches in one call, about 0.2 against 1 ms a step in torch operations.
- **the panels** (:meth:`DecodeKernels.panels`): rewritten after every update with streaming stores,
  28.5 against 60 ms as a torch copy for SmolLM2's 540 MB.

How: ``cc -O3 -march=native -fopenmp`` builds the C file into a temporary directory once per
process (about 1.7 s with gcc 12; the library stays loaded after the directory is removed). ``-march=native``
is why it is built where it runs: the same file gives AVX-512 code on one host and AVX2 on another.
OpenMP resolves to the libgomp torch already loaded, so the kernel runs on torch's threads. With
no C compiler, a failed build, or a shape the file has no kernel for (head_dim other than 64 or 128,
more than 8 query heads per key/value head), :func:`load` / :meth:`DecodeKernels.supports` say so and
the lean step runs oneDNN's packed products and the attention as torch operations.
``RLVR_DECODE_KERNELS=0`` turns the kernels off.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch  # loaded first: the kernel's OpenMP then binds to torch's libgomp
from torch import Tensor

SOURCE = Path(__file__).with_name("decode_kernels.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC", "-std=gnu11"]

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float

SLOTS = ("ln_attn", "qkv", "qkv_bias", "o", "o_bias", "ln_mlp", "gate", "gate_bias", "up", "up_bias", "down",
         "down_bias", "keys_t", "values", "prompt_kt", "prompt_v")
"""What :meth:`DecodeKernels.step` reads per layer, in the order of ``decode_kernels.c``'s enum: norm
weights, panels (:meth:`DecodeKernels.panels`) and biases of the products, and the layer's cache
(:class:`~rlvr.rollout.lean.CascadeCache`'s layouts)."""


@dataclass(frozen=True)
class StepShape:
    """The model dimensions :meth:`DecodeKernels.step` needs."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    scaling: float


class DecodeKernels:
    """The loaded library: :meth:`step` for a whole decode step, :meth:`linear` for one product."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.cascade_supports.argtypes, lib.cascade_supports.restype = [_I, _I], _I
        lib.lean_step.argtypes = [_P] + [_I] * 7 + [_F, _F, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _P, _P, _P, _P, _P]
        lib.lean_step_work.argtypes, lib.lean_step_work.restype = [_I] * 8, ctypes.c_size_t
        lib.lean_step_slots.restype = _I
        assert lib.lean_step_slots() == len(SLOTS), "decode_kernels.c and kernels.SLOTS disagree"
        lib.lean_linear.argtypes = [_P, _I, _I, _P, _I, _P, _I, _P, _P, _P]
        lib.lean_vector_width.restype = _I
        lib.lean_exp.argtypes = [_P, _I, _P]
        lib.lean_pick.argtypes = [_P, _I, _I, _F, _P, _I, _P]
        lib.lean_panels.argtypes = [_P, _I, _I, _I, _P]
        self.width = lib.lean_vector_width()
        """Output columns per weight panel (the CPU's float vector width)."""

    def panels(self, weight: Tensor | list[Tensor], out: Tensor | None = None) -> Tensor:
        """``weight`` [N, K] (or parts [N_i, K] stacked along N, without a copy of their stack) in the
        layout :meth:`linear` reads, [ceil(N / width), K, width] (the last panel zero-padded), written
        into ``out`` when it has that shape and is 64-byte aligned (no new memory), else new. In
        parallel, by the kernels (``lean_panels``, streaming stores): 540 MB of SmolLM2's weights in
        28.5 against 60 ms as a torch copy."""
        parts = [weight] if isinstance(weight, Tensor) else list(weight)
        K, N = parts[0].shape[1], sum(p.shape[0] for p in parts)
        n = -(-N // self.width)
        if out is None or out.shape != (n, K, self.width) or out.data_ptr() % 64:  # the streaming stores need it
            out = parts[0].new_empty(n, K, self.width)
        if N % self.width:
            out[-1].zero_()
        row = 0
        for p in parts:
            p = p.detach().float().contiguous()
            self.lib.lean_panels(p.data_ptr(), p.shape[0], K, row, out.data_ptr())
            row += p.shape[0]
        return out

    def linear(self, x: Tensor, panels: Tensor, n: int, bias: Tensor | None = None, *, add: Tensor | None = None,
               mul: Tensor | None = None) -> Tensor:
        """``x`` [M, K] W^T + ``bias`` for W in :meth:`panels` (``n`` outputs), then ``+ add`` or ``* mul``
        ([M, n]); x, bias and the other operand contiguous float32."""
        M, K = x.shape
        op, other = (1, add) if add is not None else (2, mul) if mul is not None else (0, None)  # decode_kernels.c's op
        y, xt = x.new_empty(M, n), x.new_empty(M * K)  # xt: x in the products' k-major layout
        self.lib.lean_linear(x.data_ptr(), M, K, panels.data_ptr(), n, None if bias is None else bias.data_ptr(), op,
                             None if other is None else other.data_ptr(), xt.data_ptr(), y.data_ptr())
        return y

    def exp(self, x: Tensor) -> Tensor:
        """exp of a contiguous float32 tensor by the kernels' vector exp (what their softmax and SiLU use)."""
        y = torch.empty_like(x)
        self.lib.lean_exp(x.data_ptr(), x.numel(), y.data_ptr())
        return y

    def pick(self, logits: Tensor, u: Tensor, temperature: float = 1.0, block: int = 256) -> Tensor:
        """[b] tokens sampled by inverse CDF from ``logits`` [b, V] (float32) at ``temperature``, with the
        uniform draws ``u`` [b] (float64): what :func:`rlvr.rollout.decode.inverse_cdf` picks on
        ``logits / temperature``, up to the exp's rounding (``decode_kernels.c``'s ``lean_pick``)."""
        if block % self.width:
            raise ValueError(f"the block ({block}) must be a multiple of the vector width ({self.width})")
        logits, u = logits.contiguous(), u.to(torch.float64).contiguous()
        out = torch.empty(logits.shape[0], dtype=torch.int64)
        self.lib.lean_pick(logits.data_ptr(), logits.shape[0], logits.shape[1], temperature, u.data_ptr(), block,
                           out.data_ptr())
        return out

    def supports(self, heads: int, kv_heads: int, head_dim: int) -> bool:
        """Whether the file has a kernel for this attention shape."""
        return heads % kv_heads == 0 and bool(self.lib.cascade_supports(heads // kv_heads, head_dim))

    @staticmethod
    def table(layers: list[dict[str, Tensor | None]]) -> Tensor:
        """[layers, len(SLOTS)] int64: each layer's tensors (``SLOTS`` by name; None for a missing bias)
        as the addresses :meth:`step` reads. The tensors must stay alive, contiguous float32, while it is used."""
        return torch.tensor([[0 if layer[k] is None else layer[k].data_ptr() for k in SLOTS] for layer in layers],
                            dtype=torch.int64)

    def step(self, shape: StepShape, table: Tensor, final_norm: Tensor, head: Tensor, head_bias: Tensor | None,
             bias: Tensor, prompt: Tensor, cache_row: Tensor, capacity: int, t: int, cos: Tensor, sin: Tensor,
             x: Tensor) -> Tensor:
        """Logits [b, vocab] of one decode step of ``x`` [b, hidden] (the tokens' embeddings; overwritten)
        with the rotary tables ``cos``, ``sin`` [b, head_dim] at their positions; each layer's keys and
        values (``table``, :meth:`table`) written at response position ``t`` of their ``capacity``.
        ``bias`` [P, L] is the prompts' padding bias, ``prompt`` [b] the prompt of each row and
        ``cache_row`` [b] (int64) its row in the response caches (layouts in ``decode_kernels.c``); L
        and the capacity are multiples of :attr:`width`."""
        s, b, L = shape, x.shape[0], bias.shape[1]
        if L % self.width or capacity % self.width:
            raise ValueError(f"the prompt length ({L}) and the capacity ({capacity}) must be multiples of {self.width} "
                             "(CascadeCache(multiple=width) pads them)")
        work = x.new_empty(self.lib.lean_step_work(b, s.hidden, s.intermediate, s.heads, s.kv_heads, s.head_dim, L, t))
        logits = x.new_empty(b, s.vocab)
        self.lib.lean_step(
            table.data_ptr(), s.layers, s.hidden, s.intermediate, s.vocab, s.heads, s.kv_heads, s.head_dim, s.eps,
            s.scaling, final_norm.data_ptr(), head.data_ptr(), None if head_bias is None else head_bias.data_ptr(),
            bias.data_ptr(), prompt.data_ptr(), cache_row.data_ptr(), L, capacity, t, b, cos.data_ptr(), sin.data_ptr(), x.data_ptr(),
            work.data_ptr(), logits.data_ptr())
        return logits


why_not: str | None = None
"""Why :func:`load` returned None (one line), once it has."""


def build(cc: str, march: str = "native") -> DecodeKernels:
    """Compiles ``decode_kernels.c`` with ``cc`` for ``-march=march`` and loads it. The file uses GCC's
    generic vectors and no ISA intrinsics beyond a streaming store (with a plain-store fallback), so
    any x86-64 level builds: without AVX-512 the vectors are 8 floats, without FMA the compiler emits a
    multiply and an add, and F16C, AVX512-BF16 and AMX are not used. Raises
    ``subprocess.CalledProcessError`` / ``OSError`` / ``subprocess.TimeoutExpired`` when it cannot."""
    flags = [f for f in FLAGS if not f.startswith("-march=")] + [f"-march={march}"]
    with tempfile.TemporaryDirectory(prefix="rlvr-kernel-") as tmp:
        so = Path(tmp) / "decode_kernels.so"
        subprocess.run([cc, *flags, "-o", str(so), str(SOURCE)], check=True, capture_output=True, text=True, timeout=300)
        return DecodeKernels(ctypes.CDLL(str(so)))  # stays loaded after the directory is removed


@functools.cache
def load() -> DecodeKernels | None:
    """The compiled kernel, built once per process for this CPU; None (and :data:`why_not` set) when
    it is turned off or cannot be built here."""
    global why_not
    if os.environ.get("RLVR_DECODE_KERNELS", "1") == "0":
        why_not = "RLVR_DECODE_KERNELS=0"
    else:
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            why_not = "no C compiler (cc or gcc, or $CC) on PATH"
        else:
            try:
                return build(cc)
            except subprocess.CalledProcessError as e:
                first = (e.stderr or e.stdout or "").strip().splitlines()
                why_not = f"{cc} failed to build {SOURCE.name}: {first[0] if first else f'exit {e.returncode}'}"
            except (OSError, subprocess.TimeoutExpired) as e:
                why_not = f"could not build {SOURCE.name} with {cc}: {e}"
    return None
