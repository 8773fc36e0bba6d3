"""``rlvr/cpu/update_attention.c`` built on SIMDe's portable AVX-512 intrinsics (``-DUA_SIMDE``), for
the tests on CPUs without AVX512-BF16: the kernel's own C (its masks, reach, work units and the order
of its sums) runs and is checked on any x86-64 machine, not only where the hardware has the
instructions. SIMDe's ``vdpbf16ps`` sums each pair in float32 as the instruction does, but its
rounding of subnormals may differ; the float32 reference and the bit-identity checks hold either way.

Imported as ``ua_emulated`` (tests/ is on ``sys.path``, as for tiny_run)."""

from __future__ import annotations

import functools

from rlvr.cpu import kernels
from rlvr.cpu import update_attention as ua


@functools.cache
def emulated() -> ua.Library:
    """The emulated build, once per process (raises when there is no C compiler or no simde-py)."""
    import simde_py  # the test extra's header-only package

    from rlvr.cpu.runtime_env import c_compiler

    cc = c_compiler()
    if cc is None:
        raise RuntimeError("no C compiler on PATH for the emulated update attention")
    extra = ("-DUA_SIMDE", f"-I{simde_py.get_include()}", "-Wno-psabi")
    return ua.Library(kernels.compile_library(cc, ua.SOURCE, extra=extra))


def library() -> tuple[ua.Library, str]:
    """(the hardware's build where this CPU has AVX512-BF16, else the emulated one; which)."""
    native = ua.load()
    return (native, "native") if native is not None else (emulated(), "emulated")


def install() -> str:
    """Make :func:`rlvr.cpu.update_attention.load` return :func:`library`'s build in this process, so
    the trainer installs the kernel where the hardware lacks it; returns which build."""
    lib, which = library()
    ua.load = lambda: lib
    return which
