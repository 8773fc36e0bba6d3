"""The lean decode step's kernels (``decode_kernels.c``): compiled on this machine at first use,
called through ctypes.

Why: after packing, a small-batch decode step on a CPU is bound by reading the weights once, and
what torch adds around the products (oneDNN's products not overlapping their weight reads with
their arithmetic at 8-16 rows, about 20 small operations or calls a layer for attention, norms,
SiLU and softmax, each with the other thread idle) costs a large share of the step. The kernels
stream each weight panel once while up to 16 rows accumulate in registers and run the whole step
in one call (:meth:`DecodeKernels.step`); :meth:`DecodeKernels.pick` is the seeded sampler in one
call; :meth:`DecodeKernels.panels` rewrites the weight panels after an update with streaming
stores. Measurements: ``benchmarks/NOTES.md`` ("lean decode", "decode kernels").

How: ``$CC -O3 -march=native -fopenmp -x c`` (``$CC`` split as a shell would, so ``ccache gcc``
works, and ``-x c`` so a C++ driver such as ``g++`` compiles it as C) builds the file into a
temporary directory once per process; the library stays loaded after the directory is removed.
``-march=native`` is why it is built where it runs: the same file gives AVX-512 code on one host
and AVX2 on another, and it needs no CPU feature beyond what the compiler targets (:func:`build`).
OpenMP resolves to the libgomp torch already loaded, so the kernel runs on torch's threads.

Fences, each falling back to the torch-operations step with one line (:data:`why_not`):

- off unless on x86-64 Linux, where they were measured (``RLVR_DECODE_KERNELS=1`` opts in
  elsewhere, ``RLVR_DECODE_KERNELS=0`` or ``RLVR_CPU_ACCEL=0`` turns them off);
- no C compiler, a failed build (the reason is the compiler's first ``error:`` line), or any error
  while loading the library (a missing symbol, say);
- a second OpenMP runtime in the process (a conda/MKL ``libiomp5``, clang's ``libomp``, an older
  torch's own ``libgomp`` copy), which would not follow ``torch.set_num_threads``;
- a step that does not match the torch-operations step on a tiny model of the same head layout
  (:func:`rlvr.cpu.lean.kernel_self_check`, once per layout).

The Python wrappers check their arguments (dtype, device, contiguity, sizes) before passing
addresses to C; the step returns an error code for a shape it has no kernel for, and the sampler
raises on NaN logits, as ``torch.multinomial`` does.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch  # loaded first: the kernel's OpenMP then binds to torch's libgomp
from torch import Tensor

from rlvr.cpu.runtime_env import c_compiler

SOURCE = Path(__file__).with_name("decode_kernels.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC", "-std=gnu11"]
OPENMP_RUNTIMES = re.compile(r"/(libgomp[^/]*|libomp[^/]*|libiomp5[^/]*|libomp-[^/]*)$")
"""Shared objects that are an OpenMP runtime, as /proc/self/maps names them."""

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float

SLOTS = (
    "ln_attn",
    "qkv",
    "qkv_bias",
    "o",
    "o_bias",
    "ln_mlp",
    "gate",
    "gate_bias",
    "up",
    "up_bias",
    "down",
    "down_bias",
    "keys_t",
    "values",
    "prompt_kt",
    "prompt_v",
)
"""What :meth:`DecodeKernels.step` reads per layer, in the order of ``decode_kernels.c``'s enum: norm
weights, panels (:meth:`DecodeKernels.panels`) and biases of the products, and the layer's cache
(:class:`~rlvr.cpu.lean.CascadeCache`'s layouts)."""


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
        lib.lean_step.restype = _I
        lib.lean_step_work.argtypes, lib.lean_step_work.restype = [_I] * 8, ctypes.c_size_t
        lib.lean_step_slots.restype = _I
        assert lib.lean_step_slots() == len(SLOTS), "decode_kernels.c and kernels.SLOTS disagree"
        lib.lean_linear.argtypes = [_P, _I, _I, _P, _I, _P, _I, _P, _P, _P]
        lib.lean_vector_width.restype = _I
        lib.lean_exp.argtypes = [_P, _I, _P]
        lib.lean_pick.argtypes = [_P, _I, _I, _F, _P, _I, _P, _P]
        lib.lean_panels.argtypes = [_P, _I, _I, _I, _P]
        self.width = lib.lean_vector_width()
        """Output columns per weight panel (the CPU's float vector width)."""

    def panels(self, weight: Tensor | list[Tensor], out: Tensor | None = None) -> Tensor:
        """``weight`` [N, K] (or parts [N_i, K] stacked along N, without a copy of their stack) in the
        layout :meth:`linear` reads, [ceil(N / width), K, width] (the last panel zero-padded), written
        into ``out`` when it has that shape and is 64-byte aligned (no new memory), else new. In
        parallel, by the kernels (``lean_panels``, streaming stores)."""
        parts = [weight] if isinstance(weight, Tensor) else list(weight)
        for p in parts:
            _check(p, "weight", dims=2)
        K, N = parts[0].shape[1], sum(p.shape[0] for p in parts)
        if any(p.shape[1] != K for p in parts):
            raise ValueError(f"the parts' columns differ: {[p.shape[1] for p in parts]}")
        n = -(-N // self.width)
        if out is None or out.shape != (n, K, self.width) or out.dtype != torch.float32 or out.data_ptr() % 64:
            out = torch.empty(n, K, self.width, dtype=torch.float32)  # the streaming stores need 64-byte alignment
        if N % self.width:
            out[-1].zero_()
        row = 0
        for p in parts:
            p = p.detach().float().contiguous()
            self.lib.lean_panels(p.data_ptr(), p.shape[0], K, row, out.data_ptr())
            row += p.shape[0]
        return out

    def linear(
        self,
        x: Tensor,
        panels: Tensor,
        n: int,
        bias: Tensor | None = None,
        *,
        add: Tensor | None = None,
        mul: Tensor | None = None,
    ) -> Tensor:
        """``x`` [M, K] W^T + ``bias`` for W in :meth:`panels` (``n`` outputs), then ``+ add`` or ``* mul``
        ([M, n]); x, bias and the other operand contiguous float32."""
        _check(x, "x", dims=2)
        M, K = x.shape
        _check(panels, "panels", shape=(-(-n // self.width), K, self.width))
        op, other = (1, add) if add is not None else (2, mul) if mul is not None else (0, None)  # decode_kernels.c's op
        if bias is not None:
            _check(bias, "bias", shape=(n,))
        if other is not None:
            _check(other, "add" if op == 1 else "mul", shape=(M, n))
        y, xt = x.new_empty(M, n), x.new_empty(M * K)  # xt: x in the products' k-major layout
        self.lib.lean_linear(
            x.data_ptr(),
            M,
            K,
            panels.data_ptr(),
            n,
            None if bias is None else bias.data_ptr(),
            op,
            None if other is None else other.data_ptr(),
            xt.data_ptr(),
            y.data_ptr(),
        )
        return y

    def exp(self, x: Tensor) -> Tensor:
        """exp of a contiguous float32 tensor by the kernels' vector exp (what their softmax and SiLU use)."""
        _check(x, "x")
        y = torch.empty_like(x)
        self.lib.lean_exp(x.data_ptr(), x.numel(), y.data_ptr())
        return y

    def pick(
        self, logits: Tensor, u: Tensor, temperature: float = 1.0, block: int = 256, *, entropy: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """[b] tokens sampled by inverse CDF from ``logits`` [b, V] (float32) at ``temperature``, with the
        uniform draws ``u`` [b] (float64): what :func:`rlvr.rollout.sampling.inverse_cdf` picks on
        ``logits / temperature``, up to the exp's rounding (``decode_kernels.c``'s ``lean_pick``).
        With ``entropy``, (tokens, [b] float32 entropy of softmax(logits / temperature)), its sums taken
        in the same pass over the logits. Raises ValueError for a row with a NaN logit or no finite
        one, as ``torch.multinomial`` does."""
        if block % self.width or block <= 0:
            raise ValueError(f"the block ({block}) must be a positive multiple of the vector width ({self.width})")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        logits, u = logits.contiguous(), u.to(torch.float64).contiguous()
        _check(logits, "logits", dims=2)
        if u.shape != (logits.shape[0],) or u.device.type != "cpu":
            raise ValueError(f"u must be [{logits.shape[0]}] on the CPU, got {tuple(u.shape)} on {u.device}")
        out = torch.empty(logits.shape[0], dtype=torch.int64)
        moments = torch.empty(logits.shape[0], 2, dtype=torch.float64) if entropy else None  # [S, E] a row
        self.lib.lean_pick(
            logits.data_ptr(), logits.shape[0], logits.shape[1], temperature, u.data_ptr(), block, out.data_ptr(),
            None if moments is None else moments.data_ptr(),
        )  # fmt: skip
        if (out < 0).any():
            bad = (out < 0).nonzero().flatten().tolist()
            raise ValueError(f"logits of rows {bad[:8]} contain NaN, or no finite value: nothing to sample")
        if moments is None:
            return out
        S, E = moments.unbind(1)
        return out, (S.log() - E / S).float()

    def supports(self, heads: int, kv_heads: int, head_dim: int) -> bool:
        """Whether the file has a kernel for this attention shape."""
        return kv_heads > 0 and heads % kv_heads == 0 and bool(self.lib.cascade_supports(heads // kv_heads, head_dim))

    @staticmethod
    def table(layers: list[dict[str, Tensor | None]]) -> Tensor:
        """[layers, len(SLOTS)] int64: each layer's tensors (``SLOTS`` by name; None for a missing bias)
        as the addresses :meth:`step` reads. The tensors must stay alive, contiguous float32, while it is used."""
        for i, layer in enumerate(layers):
            for k in SLOTS:
                if layer[k] is not None:
                    _check(layer[k], f"layer {i}'s {k}")
                elif not k.endswith("_bias"):
                    raise ValueError(f"layer {i}'s {k} is missing (only biases may be None)")
        return torch.tensor(
            [[0 if layer[k] is None else layer[k].data_ptr() for k in SLOTS] for layer in layers], dtype=torch.int64
        )

    def step(
        self,
        shape: StepShape,
        table: Tensor,
        final_norm: Tensor,
        head: Tensor,
        head_bias: Tensor | None,
        bias: Tensor,
        prompt: Tensor,
        cache_row: Tensor,
        capacity: int,
        t: int,
        cos: Tensor,
        sin: Tensor,
        x: Tensor,
    ) -> Tensor:
        """Logits [b, vocab] of one decode step of ``x`` [b, hidden] (the tokens' embeddings; overwritten)
        with the rotary tables ``cos``, ``sin`` [b, head_dim] at their positions; each layer's keys and
        values (``table``, :meth:`table`) written at response position ``t`` of their ``capacity``.
        ``bias`` [P, L] is the prompts' padding bias, ``prompt`` [b] the prompt of each row and
        ``cache_row`` [b] (int64) its row in the response caches (layouts in ``decode_kernels.c``); L
        and the capacity are multiples of :attr:`width`. The sizes are checked here; the addresses in
        ``table`` are the caller's (:meth:`table` checks the tensors it is built from)."""
        s, b, L = shape, x.shape[0], bias.shape[-1]
        if L % self.width or capacity % self.width:
            raise ValueError(
                f"the prompt length ({L}) and the capacity ({capacity}) must be multiples of {self.width} "
                "(CascadeCache(multiple=width) pads them)"
            )
        if not 0 <= t < capacity:
            raise ValueError(f"response position t={t} is outside the capacity {capacity}")
        _check(x, "x", shape=(b, s.hidden))
        _check(table, "table", shape=(s.layers, len(SLOTS)), dtype=torch.int64)
        _check(final_norm, "final_norm", shape=(s.hidden,))
        _check(head, "head", shape=(-(-s.vocab // self.width), s.hidden, self.width))
        if head_bias is not None:
            _check(head_bias, "head_bias", shape=(s.vocab,))
        _check(bias, "bias", dims=2)
        _check(prompt, "prompt", shape=(b,), dtype=torch.int64)
        _check(cache_row, "cache_row", shape=(b,), dtype=torch.int64)
        for name, tab in (("cos", cos), ("sin", sin)):
            _check(tab, name, shape=(b, s.head_dim))
        if b and (int(prompt.min()) < 0 or int(prompt.max()) >= bias.shape[0] or int(cache_row.min()) < 0):
            raise ValueError(f"prompt indices must be in [0, {bias.shape[0]}) and cache rows >= 0")
        work = x.new_empty(self.lib.lean_step_work(b, s.hidden, s.intermediate, s.heads, s.kv_heads, s.head_dim, L, t))
        logits = x.new_empty(b, s.vocab)
        rc = self.lib.lean_step(
            table.data_ptr(),
            s.layers,
            s.hidden,
            s.intermediate,
            s.vocab,
            s.heads,
            s.kv_heads,
            s.head_dim,
            s.eps,
            s.scaling,
            final_norm.data_ptr(),
            head.data_ptr(),
            None if head_bias is None else head_bias.data_ptr(),
            bias.data_ptr(),
            prompt.data_ptr(),
            cache_row.data_ptr(),
            L,
            capacity,
            t,
            b,
            cos.data_ptr(),
            sin.data_ptr(),
            x.data_ptr(),
            work.data_ptr(),
            logits.data_ptr(),
        )
        if rc != 0:
            raise ValueError(
                f"the compiled step has no kernel for {s.heads} query heads over {s.kv_heads} key/value heads "
                f"of size {s.head_dim} (or a size is out of range): error {rc}"
            )
        return logits


def _check(
    t: Tensor, name: str, *, dims: int | None = None, shape: tuple | None = None, dtype: torch.dtype = torch.float32
) -> None:
    """ValueError unless ``t`` is a contiguous CPU tensor of ``dtype`` (and ``dims`` dimensions / ``shape``):
    the C code reads raw addresses, so a wrong tensor must stop here."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.device.type != "cpu" or t.dtype != dtype or not t.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous {str(dtype).removeprefix('torch.')} CPU tensor, got "
            f"{str(t.dtype).removeprefix('torch.')} on {t.device}{'' if t.is_contiguous() else ', not contiguous'}"
        )
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


why_not: str | None = None
"""Why :func:`load` returned None (one line), once it has."""


def _first_error(text: str) -> str:
    """The compiler's first ``error:`` line (the reason, not the line that names the function), else its first line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return next((ln for ln in lines if "error:" in ln or "error " in ln.lower()), lines[0] if lines else "no output")


def openmp_runtimes() -> list[str]:
    """The distinct OpenMP runtime libraries mapped into this process (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return []
    return sorted({m.group(1) for p in paths if (m := OPENMP_RUNTIMES.search(p))})


def build(cc: str | list[str], march: str = "native") -> DecodeKernels:
    """Compiles ``decode_kernels.c`` with ``cc`` for ``-march=march`` and loads it. The file uses GCC's
    generic vectors and no ISA intrinsics beyond a streaming store (with a plain-store fallback), so
    any x86-64 level builds: without AVX-512 the vectors are 8 floats, without FMA the compiler emits a
    multiply and an add, and F16C, AVX512-BF16 and AMX are not used. Raises
    ``subprocess.CalledProcessError`` / ``OSError`` / ``subprocess.TimeoutExpired`` when it cannot build,
    and whatever loading raises (``AttributeError`` for a missing symbol)."""
    return DecodeKernels(compile_library(cc, SOURCE, march))


def compile_library(
    cc: str | list[str], source: Path, march: str = "native", extra: tuple[str, ...] = ()
) -> ctypes.CDLL:
    """``source`` compiled with ``cc`` (:data:`FLAGS`, ``-march=march``, then ``extra``) into a temporary
    directory and loaded; the library stays loaded after the directory is removed. Raises as :func:`build`."""
    cmd = shlex.split(cc) if isinstance(cc, str) else list(cc)
    flags = [f for f in FLAGS if not f.startswith("-march=")] + [f"-march={march}"]
    with tempfile.TemporaryDirectory(prefix="rlvr-kernel-") as tmp:
        so = Path(tmp) / f"{source.stem}.so"
        subprocess.run(
            [*cmd, *flags, *extra, "-o", str(so), "-x", "c", str(source)],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return ctypes.CDLL(str(so))


def default_on() -> bool:
    """Where the kernels are on unless turned off: x86-64 Linux, where they were measured."""
    return sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64")


@functools.cache
def load() -> DecodeKernels | None:
    """The compiled kernels, built once per process for this CPU; None (and :data:`why_not` set to one
    line) when they are off or cannot be built or loaded here (see the module docstring's fences)."""
    global why_not
    kernels, why_not = fenced_build("RLVR_DECODE_KERNELS", SOURCE, build)
    return kernels


def fenced_build(switch: str, source: Path, make):
    """``(make(cc), None)`` for the C compiler found here, or ``(None, why)`` with one line saying why
    not: ``RLVR_CPU_ACCEL=0`` or ``switch=0``, off by default off x86-64 Linux (``switch=1`` turns it
    on there), no compiler, a failed build (the compiler's first error), a library that does not load,
    or a second OpenMP runtime in the process."""
    setting = os.environ.get(switch, "")
    if os.environ.get("RLVR_CPU_ACCEL", "1") == "0":
        return None, "RLVR_CPU_ACCEL=0"
    if setting == "0":
        return None, f"{switch}=0"
    if setting != "1" and not default_on():
        return None, (
            f"off by default on {sys.platform}/{platform.machine()} (measured on x86-64 Linux only); "
            f"{switch}=1 turns them on"
        )
    if (cc := c_compiler()) is None:
        return None, "no C compiler (cc or gcc, or $CC) on PATH"
    name = " ".join(cc)
    try:
        built = make(cc)
    except subprocess.CalledProcessError as e:
        return (
            None,
            f"{name} failed to build {source.name}: {_first_error(e.stderr or e.stdout or f'exit {e.returncode}')}",
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"could not build {source.name} with {name}: {e}"
    except Exception as e:  # noqa: BLE001 - a library that loads but is not ours (a missing symbol): fall back
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return None, f"could not load {source.name} built by {name}: {first}"
    runtimes = openmp_runtimes()
    if len(runtimes) > 1:
        return None, (
            f"two OpenMP runtimes are loaded ({', '.join(runtimes)}); the kernels' threads would not "
            "follow torch.set_num_threads"
        )
    return built, None
