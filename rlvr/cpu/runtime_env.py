"""The process environment rlvr's command line runs in: glibc's malloc on transparent huge pages, and
oneMKL's AVX-512 kernels on AMD CPUs that have AVX-512.

**Huge pages.**

Why: glibc serves every block above its mmap threshold (at most 32 MB) with a fresh ``mmap`` and
unmaps it on ``free``, so each large tensor torch allocates faults its pages in again, 4 KB at a
time, on first touch, and an update step allocates many (the tied embedding's gradient is
zero-filled several times per step). With glibc's tunable ``glibc.malloc.hugetlb=1`` malloc asks for
transparent huge pages on the blocks it maps (``madvise(MADV_HUGEPAGE)``), so such a block faults
in hundreds of times fewer. The update gets faster at equal peak memory; keeping freed memory
instead (``glibc.malloc.mmap_max=0``) saved about as much but grew the peak. Measurements:
``benchmarks/NOTES.md`` ("Huge pages").

**Freed heap kept.** Below the mmap threshold, blocks come from the heap, and glibc hands the
heap's free top back to the kernel once it exceeds the trim threshold (twice the dynamic mmap
threshold, 64 MB at most); an update frees a micro-batch's activations at the top of the heap and
the next micro-batch faults the same pages in again (thousands of faults an update under bf16
autocast, whose weight and gradient casts churn many such blocks). :data:`KEEP_FREED` sets the
trim threshold past any heap (freed heap memory stays mapped and is reused), pins the mmap
threshold at glibc's 32 MB maximum (setting the trim threshold turns the dynamic threshold off,
which would otherwise leave every block over 128 KB to a fresh ``mmap``), and grows the heap
256 MB at a time. Blocks over 32 MB are still mapped and unmapped as before, so the large
temporaries do not pile up in the heap (the leak ``glibc.malloc.mmap_max=0`` showed). Where:
Linux, glibc 2.26 or newer (the first with tunables), none of these tunables already set, neither
``RLVR_MALLOC_KEEP=0`` nor ``RLVR_CPU_ACCEL=0``. Measurements: ``benchmarks/NOTES.md`` ("Freed heap
kept").

How: tunables are read when a process starts, so :func:`reexec_with_runtime_env` (the first thing
``rlvr``'s command line does) re-executes the same command once with ``GLIBC_TUNABLES`` extended
(and, below, ``LD_PRELOAD``),
before any work, where it applies: Linux, glibc 2.35 or newer (the tunable's first release), the
kernel's transparent huge pages in ``madvise`` mode (with ``always`` they are used already, with
``never`` not at all), the tunable not already set, and neither ``RLVR_HUGE_PAGES=0`` nor
``RLVR_CPU_ACCEL=0``. The process keeps its PID; its children (Ray workers, reward workers) inherit
the setting.

**MKL on AMD.** PyTorch's CPU products (``aten::mm``, so every ``nn.Linear`` in training) run oneMKL's
sgemm, and oneMKL takes its AVX-512 kernels only on CPUs it identifies as Intel's: on an AMD EPYC
with AVX-512 (Zen 4, Zen 5) it runs its AVX2 kernels. :func:`mkl_avx512_env` preloads
``mkl_intel_cpu.c`` (one function answering MKL's vendor check), built once with the C compiler
into ``$RLVR_CACHE/cpu/`` (default ``~/.cache/rlvr``; before that cache exists, into a private
temporary directory), so MKL chooses its kernels from the CPU's
feature flags as it would on an Intel CPU. Where: Linux x86-64, an AMD CPU whose flags include
AVX-512 F, BW, DQ and VL, a C compiler (``$CC``, ``cc`` or ``gcc``), and PyTorch's dispatch not
capped below AVX-512 (``ATEN_CPU_CAPABILITY=avx2``, with which one sees what an AVX2-only CPU does);
``RLVR_MKL_AVX512=0`` (or ``RLVR_CPU_ACCEL=0``) turns it off. The results are float32 products as
before, rounded as MKL's AVX-512 kernels round. Measurements: ``benchmarks/NOTES.md`` ("MKL's AVX-512 kernels on AMD").
"""

from __future__ import annotations

import hashlib
import os
import platform as _platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
KEEP_FREED = (
    "glibc.malloc.mmap_threshold=33554432",
    "glibc.malloc.trim_threshold=68719476736",
    "glibc.malloc.top_pad=268435456",
)
"""glibc tunables that keep the freed heap mapped (see the module docstring, "Freed heap kept")."""
_MALLOC_SIZES = ("mmap_threshold", "trim_threshold", "top_pad", "mmap_max")
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def _switched_off(env: dict, switch: str) -> bool:
    """Whether ``env`` turns a piece of this module off: its own ``switch=0`` or ``RLVR_CPU_ACCEL=0``."""
    return env.get(switch, "1") == "0" or env.get("RLVR_CPU_ACCEL", "1") == "0"


def _glibc_version() -> tuple[int, int] | None:
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None


def _thp_mode() -> str:
    try:
        with open(THP_MODE) as f:
            text = f.read()
    except OSError:
        return ""
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else ""


def huge_pages_env(
    environ: dict | None = None,
    *,
    platform: str | None = None,
    glibc: tuple[int, int] | None = None,
    thp: str | None = None,
) -> dict | None:
    """``environ`` (default ``os.environ``) with :data:`TUNABLE` added to ``GLIBC_TUNABLES``, or None where
    it does not apply or is set already (see the module docstring). The keyword arguments stand in for
    this machine's platform, glibc version and THP mode."""
    env = dict(os.environ if environ is None else environ)
    platform = sys.platform if platform is None else platform
    if platform != "linux" or _switched_off(env, "RLVR_HUGE_PAGES"):
        return None
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return None
    glibc = _glibc_version() if glibc is None else glibc
    if glibc is None or glibc < (2, 35) or (_thp_mode() if thp is None else thp) != "madvise":
        return None
    return _with_tunables(env, TUNABLE)


def _with_tunables(env: dict, *tunables: str) -> dict:
    """``env`` with ``tunables`` appended to its ``GLIBC_TUNABLES`` (the ones there kept first)."""
    env["GLIBC_TUNABLES"] = ":".join(t for t in (env.get("GLIBC_TUNABLES", ""), *tunables) if t)
    return env


def keep_freed_env(
    environ: dict | None = None, *, platform: str | None = None, glibc: tuple[int, int] | None = None
) -> dict | None:
    """``environ`` (default ``os.environ``) with :data:`KEEP_FREED` added to ``GLIBC_TUNABLES``, or None
    where it does not apply or the user set any of malloc's size tunables (or their ``MALLOC_*_``
    variables) already. The keyword arguments stand in for this machine's platform and glibc."""
    env = dict(os.environ if environ is None else environ)
    platform = sys.platform if platform is None else platform
    if platform != "linux" or _switched_off(env, "RLVR_MALLOC_KEEP"):
        return None
    tunables = env.get("GLIBC_TUNABLES", "")
    if any(f"glibc.malloc.{k}" in tunables or f"MALLOC_{k.upper()}_" in env for k in _MALLOC_SIZES):
        return None
    glibc = _glibc_version() if glibc is None else glibc
    if glibc is None or glibc < (2, 26):
        return None
    return _with_tunables(env, *KEEP_FREED)


MKL_SHIM = Path(__file__).with_name("mkl_intel_cpu.c")
MKL_SWITCH = "RLVR_MKL_AVX512"
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512dq", "avx512vl")
BELOW_AVX512 = ("default", "avx2", "zvector")
"""``ATEN_CPU_CAPABILITY`` values that cap PyTorch's dispatch below AVX-512."""


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read(1 << 16)  # the first CPU's block is enough
    except OSError:
        return ""


def amd_avx512(cpuinfo: str) -> bool:
    """Whether ``cpuinfo`` (``/proc/cpuinfo``'s text) describes an AMD CPU with the AVX-512 subsets
    MKL's AVX-512 kernels use."""
    vendor = flags = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = value
    have = set(flags.split())
    return vendor == "AuthenticAMD" and all(f in have for f in AVX512_FLAGS)


def c_compiler(env: dict | None = None) -> list[str] | None:
    """The C compiler command in ``env`` (default ``os.environ``): ``$CC`` split as a shell would
    (``ccache gcc``), else ``cc`` or ``gcc`` on PATH; None when there is none. Shared with
    :mod:`rlvr.cpu.kernels` (this module loads no torch, so the dependency runs that way)."""
    env = os.environ if env is None else env
    if env.get("CC", "").strip():
        return shlex.split(env["CC"])
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def build_mkl_shim(env: dict) -> Path | None:
    """The shared library built from :data:`MKL_SHIM`, in the cache (built there once, atomically; in a
    private temporary directory while the cache does not exist yet); None when no compiler is found or
    the build fails."""
    cc = c_compiler(env)
    if cc is None:
        return None
    source = MKL_SHIM.read_bytes()
    tag = hashlib.sha256(source + " ".join(cc).encode()).hexdigest()[:12]
    root = Path(env.get("RLVR_CACHE") or Path(env.get("HOME") or Path.home()) / ".cache" / "rlvr")
    # Before the cache exists (a first run), build into a private temporary directory instead of
    # creating it now: a directory created before the re-execution can shadow the package (a cache
    # named ``rlvr`` in the working directory of ``python -m rlvr.cli``).
    cache = root / "cpu" if root.is_dir() else Path(tempfile.mkdtemp(prefix="rlvr-mkl-"))
    out = cache / f"mkl_intel_cpu-{tag}.so"
    if out.is_file():
        return out
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            part = Path(tmp) / out.name
            cmd = [*cc, "-shared", "-fPIC", "-O2", "-o", str(part), str(MKL_SHIM)]
            subprocess.run(cmd, check=True, capture_output=True, timeout=120)
            os.replace(part, out)  # atomic: a concurrent build leaves one whole file
    except (OSError, subprocess.SubprocessError):
        return None
    return out


def mkl_avx512_env(
    environ: dict | None = None, *, platform: str | None = None, machine: str | None = None, cpuinfo: str | None = None
) -> dict | None:
    """``environ`` (default ``os.environ``) with the MKL shim added to ``LD_PRELOAD``, or None where it
    does not apply, is preloaded already, or cannot be built (see the module docstring). The keyword
    arguments stand in for this machine's platform, architecture and ``/proc/cpuinfo``."""
    env = dict(os.environ if environ is None else environ)
    platform = sys.platform if platform is None else platform
    machine = _platform.machine().lower() if machine is None else machine
    if platform != "linux" or machine not in ("x86_64", "amd64"):
        return None
    if _switched_off(env, MKL_SWITCH):
        return None
    if env.get("ATEN_CPU_CAPABILITY", "").lower() in BELOW_AVX512:
        return None  # PyTorch asked to dispatch as a CPU without AVX-512: MKL stays on that CPU's kernels too
    preload = env.get("LD_PRELOAD", "")
    if "mkl_intel_cpu" in preload or not amd_avx512(_cpuinfo() if cpuinfo is None else cpuinfo):
        return None
    shim = build_mkl_shim(env)
    if shim is None:
        return None
    env["LD_PRELOAD"] = f"{shim} {preload}".strip()
    return env


def mkl_avx512_note() -> str | None:
    """One line for a run's summary on an AMD CPU with AVX-512 (None elsewhere): whether this process
    runs MKL's AVX-512 kernels, and how to change it."""
    if not amd_avx512(_cpuinfo()):
        return None
    if "mkl_intel_cpu" in os.environ.get("LD_PRELOAD", ""):
        return f"MKL's AVX-512 kernels on this AMD CPU (rlvr preloads {MKL_SHIM.name}; {MKL_SWITCH}=0 turns it off)"
    why = (
        f"{MKL_SWITCH}=0"
        if os.environ.get(MKL_SWITCH) == "0" or os.environ.get("RLVR_CPU_ACCEL") == "0"
        else "not started by the rlvr command, or no C compiler to build its shim"
    )
    return f"MKL's AVX2 kernels on this AMD CPU, which has AVX-512 ({why})"


def process_env(environ: dict | None = None) -> dict | None:
    """``environ`` (default ``os.environ``) with everything of this module that applies here
    (:func:`huge_pages_env`, :func:`keep_freed_env`, :func:`mkl_avx512_env`), or None where nothing does."""
    env = dict(os.environ if environ is None else environ)
    changed = False
    for step in (huge_pages_env, keep_freed_env, mkl_avx512_env):
        new = step(env)
        if new is not None:
            env, changed = new, True
    return env if changed else None


def reexec_with_runtime_env() -> None:
    """Re-executes this process's command with :func:`process_env`, where anything of it applies;
    else returns. Never twice: a re-executed process has everything set already."""
    env = process_env()
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
