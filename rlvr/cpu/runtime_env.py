"""glibc's malloc on transparent huge pages for rlvr's processes.

Why: glibc serves every block above its mmap threshold (at most 32 MB) with a fresh ``mmap`` and
unmaps it on ``free``, so each large tensor torch allocates faults its pages in again, 4 KB at a
time, on first touch, and an update step allocates many (the tied embedding's gradient is
zero-filled several times per step). With glibc's tunable ``glibc.malloc.hugetlb=1`` malloc asks for
transparent huge pages on the blocks it maps (``madvise(MADV_HUGEPAGE)``), so such a block faults
in hundreds of times fewer. The update gets faster at equal peak memory; keeping freed memory
instead (``glibc.malloc.mmap_max=0``) saved about as much but grew the peak. Measurements:
``benchmarks/NOTES.md`` ("Huge pages").

How: tunables are read when a process starts, so :func:`reexec_with_huge_pages` (the first thing
``rlvr``'s command line does) re-executes the same command once with ``GLIBC_TUNABLES`` extended,
before any work, where it applies: Linux, glibc 2.35 or newer (the tunable's first release), the
kernel's transparent huge pages in ``madvise`` mode (with ``always`` they are used already, with
``never`` not at all), the tunable not already set, and neither ``RLVR_HUGE_PAGES=0`` nor
``RLVR_CPU_ACCEL=0``. The process keeps its PID; its children (Ray workers, reward workers) inherit
the setting.
"""

from __future__ import annotations

import os
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


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
    if platform != "linux" or env.get("RLVR_HUGE_PAGES", "1") == "0" or env.get("RLVR_CPU_ACCEL", "1") == "0":
        return None
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return None
    glibc = _glibc_version() if glibc is None else glibc
    if glibc is None or glibc < (2, 35) or (_thp_mode() if thp is None else thp) != "madvise":
        return None
    env["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}" if tunables else TUNABLE
    return env


def reexec_with_huge_pages() -> None:
    """Re-executes this process's command with :func:`huge_pages_env`, where it applies; else returns."""
    env = huge_pages_env()
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
