"""The cascade attention kernel (``cascade_attention.c``): compiled on this machine at first use,
called through ctypes.

Why: the lean decode step's attention in torch operations is about 12 small operations a layer
(index copies into the group layout, four batched products of a few rows each, a concatenation, a
softmax); at 16 rows they took 6.3-7.0 ms of a 30 ms SmolLM2-135M decode step on a 2-core AVX-512
CPU, mostly per-call overhead of products too small for a BLAS. The kernel does rotary, the cache
write and both score products in one call per layer and the weighted sum of values in another,
with torch's softmax between them (``benchmarks/NOTES.md`` has the measurements).

How: ``cc -O3 -march=native -fopenmp`` builds the C file into a temporary directory once per
process (about 0.3 s; the library stays loaded after the directory is removed). ``-march=native``
is why it is built where it runs: the same file gives AVX-512 code on one host and AVX2 on another.
OpenMP resolves to the libgomp torch already loaded, so the kernel runs on torch's threads. With
no C compiler, a failed build, or a shape the file has no kernel for (head_dim other than 64 or 128,
more than 8 query heads per key/value head), :func:`load` / :meth:`CascadeKernel.supports` say so and
the lean step runs the same attention as torch operations. ``RLVR_CASCADE_KERNEL=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401  (loaded first: the kernel's OpenMP then binds to torch's libgomp)
from torch import Tensor

SOURCE = Path(__file__).with_name("cascade_attention.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11"]

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class CascadeKernel:
    """The loaded library: :meth:`scores` and :meth:`values` for one layer of a decode step."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.cascade_supports.argtypes, lib.cascade_supports.restype = [_I, _I], _I
        lib.cascade_scores.argtypes = [_P, _P, _P, _F, _P, _P, _P, _P, _P] + [_I] * 7 + [_P]
        lib.cascade_values.argtypes = [_P, _P, _P, _P] + [_I] * 7 + [_P]

    def supports(self, heads: int, kv_heads: int, head_dim: int) -> bool:
        """Whether the file has a kernel for this attention shape."""
        return heads % kv_heads == 0 and bool(self.lib.cascade_supports(heads // kv_heads, head_dim))

    def scores(self, qkv: Tensor, cos: Tensor, sin: Tensor, scale: float, keys_t: Tensor, values: Tensor,
               prompt_kt: Tensor, bias: Tensor, prompt: Tensor, heads: int, t: int, out: Tensor) -> None:
        """Rotary on ``qkv``'s q and k heads, k and v written at response position ``t``, and ``out``
        [b, KV, rep, L + t + 1] = the scaled queries' scores over the prompt (plus ``bias``) and the
        row's response positions 0..t (layouts in ``cascade_attention.c``)."""
        b = qkv.shape[0]
        KV, D, cap = keys_t.shape[1], keys_t.shape[2], keys_t.shape[3]
        self.lib.cascade_scores(
            qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), scale, keys_t.data_ptr(), values.data_ptr(),
            prompt_kt.data_ptr(), bias.data_ptr(), prompt.data_ptr(),
            b, heads, KV, D, prompt_kt.shape[-1], cap, t, out.data_ptr())

    def values(self, weights: Tensor, prompt_v: Tensor, values: Tensor, prompt: Tensor, heads: int, t: int,
               out: Tensor) -> None:
        """``out`` [b, KV, rep, D] = ``weights`` · [the prompt's values; the row's response values 0..t]."""
        b, KV, cap, D = weights.shape[0], values.shape[1], values.shape[2], values.shape[3]
        self.lib.cascade_values(
            weights.data_ptr(), prompt_v.data_ptr(), values.data_ptr(), prompt.data_ptr(),
            b, heads, KV, D, prompt_v.shape[-2], cap, t, out.data_ptr())


why_not: str | None = None
"""Why :func:`load` returned None (one line), once it has."""


@functools.cache
def load() -> CascadeKernel | None:
    """The compiled kernel, built once per process; None (and :data:`why_not` set) when it is turned
    off or cannot be built here."""
    global why_not
    if os.environ.get("RLVR_CASCADE_KERNEL", "1") == "0":
        why_not = "RLVR_CASCADE_KERNEL=0"
    else:
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            why_not = "no C compiler (cc or gcc, or $CC) on PATH"
        else:
            try:
                with tempfile.TemporaryDirectory(prefix="rlvr-kernel-") as tmp:
                    so = Path(tmp) / "cascade_attention.so"
                    subprocess.run([cc, *FLAGS, "-o", str(so), str(SOURCE)], check=True, capture_output=True,
                                   text=True, timeout=300)
                    return CascadeKernel(ctypes.CDLL(str(so)))
            except subprocess.CalledProcessError as e:
                first = (e.stderr or e.stdout or "").strip().splitlines()
                why_not = f"{cc} failed to build {SOURCE.name}: {first[0] if first else f'exit {e.returncode}'}"
            except (OSError, subprocess.TimeoutExpired) as e:
                why_not = f"could not build {SOURCE.name} with {cc}: {e}"
    return None
