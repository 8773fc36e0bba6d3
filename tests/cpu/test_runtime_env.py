"""rlvr's processes re-execute themselves once with glibc's malloc on transparent huge pages and
keeping its freed heap (rlvr.cpu.runtime_env), only where that applies, and never twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.cpu import runtime_env
from rlvr.cpu.runtime_env import KEEP_FREED, TUNABLE, huge_pages_env, keep_freed_env

LINUX = dict(platform="linux", glibc=(2, 36), thp="madvise")


def test_the_tunable_is_added_where_it_applies_and_keeps_other_tunables():
    assert huge_pages_env({}, **LINUX)["GLIBC_TUNABLES"] == TUNABLE
    env = huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/h"}, **LINUX)
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}" and env["HOME"] == "/h"


def test_no_reexec_where_it_does_not_apply():
    assert huge_pages_env({"GLIBC_TUNABLES": TUNABLE}, **LINUX) is None  # already set: never twice
    assert huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, **LINUX) is None  # the user's choice
    assert huge_pages_env({"RLVR_HUGE_PAGES": "0"}, **LINUX) is None
    assert huge_pages_env({}, **{**LINUX, "platform": "darwin"}) is None
    assert huge_pages_env({}, **{**LINUX, "glibc": (2, 34)}) is None  # the tunable came with 2.35
    assert huge_pages_env({}, **{**LINUX, "thp": "always"}) is None  # huge pages without asking
    assert huge_pages_env({}, **{**LINUX, "thp": "never"}) is None


def test_the_freed_heap_is_kept_where_glibc_has_tunables_unless_the_user_set_malloc_sizes():
    keep = ":".join(KEEP_FREED)
    assert keep_freed_env({}, platform="linux", glibc=(2, 26))["GLIBC_TUNABLES"] == keep
    env = keep_freed_env({"GLIBC_TUNABLES": TUNABLE, "HOME": "/h"}, platform="linux", glibc=(2, 36))
    assert env["GLIBC_TUNABLES"] == f"{TUNABLE}:{keep}" and env["HOME"] == "/h"
    # the trim threshold past any heap, the mmap threshold pinned (else every block > 128 KB is mapped)
    assert "glibc.malloc.mmap_threshold=33554432" in keep and "glibc.malloc.trim_threshold=" in keep
    on = dict(platform="linux", glibc=(2, 36))
    assert keep_freed_env({"GLIBC_TUNABLES": keep}, **on) is None  # never twice
    assert keep_freed_env({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}, **on) is None  # the user's choice
    assert keep_freed_env({"GLIBC_TUNABLES": "glibc.malloc.top_pad=0"}, **on) is None
    assert keep_freed_env({"MALLOC_TRIM_THRESHOLD_": "0"}, **on) is None  # glibc's older variables too
    assert keep_freed_env({"RLVR_MALLOC_KEEP": "0"}, **on) is None
    assert keep_freed_env({"RLVR_CPU_ACCEL": "0"}, **on) is None
    assert keep_freed_env({}, platform="darwin", glibc=(2, 36)) is None
    assert keep_freed_env({}, platform="linux", glibc=(2, 25)) is None  # tunables came with 2.26
    assert keep_freed_env({}, platform="linux", glibc=None) is not None or runtime_env._glibc_version() is None


def test_a_process_reexecutes_itself_once_with_the_tunable_where_this_machine_allows():
    """The real thing on this machine: a child that calls reexec_with_runtime_env() prints its
    GLIBC_TUNABLES after it; it carries the tunable exactly where huge_pages_env says it applies."""
    code = (
        "import os; from rlvr.cpu import runtime_env; runtime_env.reexec_with_runtime_env(); "
        "print(os.environ.get('GLIBC_TUNABLES', ''), os.getpid())"
    )
    drop = ("GLIBC_TUNABLES", "RLVR_HUGE_PAGES", "RLVR_MALLOC_KEEP")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("MALLOC_")}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    out = proc.communicate(timeout=60)[0].split()
    tunables = out[0].split(":") if len(out) == 2 else []
    assert (TUNABLE in tunables) == (runtime_env.huge_pages_env(env) is not None)
    assert set(KEEP_FREED) <= set(tunables) if runtime_env.keep_freed_env(env) is not None else not tunables[1:]
    assert int(out[-1]) == proc.pid  # exec keeps the PID (signals and os.wait4 still reach it)
    off = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "RLVR_HUGE_PAGES": "0", "RLVR_MALLOC_KEEP": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert off.stdout.split()[:-1] == []


AMD = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16\n"
X86 = dict(platform="linux", machine="x86_64", cpuinfo=AMD)


def test_amd_cpus_with_avx512_are_recognised_and_others_not():
    assert runtime_env.amd_avx512(AMD)
    assert not runtime_env.amd_avx512(AMD.replace("AuthenticAMD", "GenuineIntel"))  # MKL does it already
    assert not runtime_env.amd_avx512(AMD.replace(" avx512bw", ""))  # MKL's AVX-512 kernels need BW
    assert not runtime_env.amd_avx512("vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 fma\n")  # Zen 3
    assert not runtime_env.amd_avx512("")


def test_the_mkl_shim_is_preloaded_where_it_applies_and_only_there(tmp_path, monkeypatch):
    built = tmp_path / "mkl_intel_cpu-x.so"
    monkeypatch.setattr(runtime_env, "build_mkl_shim", lambda env: built)
    env = runtime_env.mkl_avx512_env({"LD_PRELOAD": "/opt/other.so", "HOME": "/h"}, **X86)
    assert env["LD_PRELOAD"] == f"{built} /opt/other.so" and env["HOME"] == "/h"
    assert runtime_env.mkl_avx512_env({"LD_PRELOAD": str(built)}, **X86) is None  # never twice
    assert runtime_env.mkl_avx512_env({"RLVR_MKL_AVX512": "0"}, **X86) is None
    assert runtime_env.mkl_avx512_env({"RLVR_CPU_ACCEL": "0"}, **X86) is None
    # PyTorch told to dispatch as an AVX2-only CPU: MKL keeps that CPU's kernels too
    assert runtime_env.mkl_avx512_env({"ATEN_CPU_CAPABILITY": "avx2"}, **X86) is None
    assert runtime_env.mkl_avx512_env({"ATEN_CPU_CAPABILITY": "AVX512"}, **X86) is not None
    assert runtime_env.mkl_avx512_env({}, **{**X86, "machine": "aarch64"}) is None
    assert runtime_env.mkl_avx512_env({}, **{**X86, "platform": "darwin"}) is None
    assert runtime_env.mkl_avx512_env({}, **{**X86, "cpuinfo": AMD.replace("AuthenticAMD", "GenuineIntel")}) is None
    monkeypatch.setattr(runtime_env, "build_mkl_shim", lambda env: None)  # no compiler: nothing changes
    assert runtime_env.mkl_avx512_env({}, **X86) is None


def test_the_shim_builds_once_into_the_cache(tmp_path):
    env = {"RLVR_CACHE": str(tmp_path / "rlvr"), "PATH": os.environ.get("PATH", "")}
    if runtime_env.c_compiler(env) is None:
        pytest.skip("no C compiler here")
    # no cache yet: a private temporary directory, and the cache is not created (a directory named
    # rlvr in the working directory would shadow the package for `python -m rlvr.cli`)
    early = runtime_env.build_mkl_shim(env)
    assert early is not None and early.is_file() and not (tmp_path / "rlvr").exists()
    (tmp_path / "rlvr").mkdir()
    first = runtime_env.build_mkl_shim(env)
    assert first is not None and first.parent == tmp_path / "rlvr" / "cpu" and first.is_file()
    stamp = first.stat().st_mtime_ns
    assert runtime_env.build_mkl_shim(env) == first and first.stat().st_mtime_ns == stamp  # cached
    assert runtime_env.build_mkl_shim({**env, "CC": "no-such-compiler-rlvr"}) is None


_PROBE = """
import ctypes, json, os, torch
lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
g = torch.Generator().manual_seed(0)
a, b = torch.randn(293, 576, generator=g), torch.randn(576, 1536, generator=g)
got, ref = (a @ b).double().sum().item(), (a.double() @ b.double()).sum().item()
print(json.dumps({"path": lib.mkl_serv_cpu_detect(), "sum": got, "ref": ref}))
"""


def _probe(env: dict) -> dict:
    cmd = [sys.executable, "-c", _PROBE]
    return json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=120).stdout)


def test_on_this_machine_the_shim_changes_mkls_kernels_not_the_products(tmp_path):
    """The real thing where it applies (an AMD CPU with AVX-512 and a compiler): in a process started
    with the environment, MKL's CPU dispatch reads differently, and the products stay float32-exact."""
    import torch

    if not runtime_env.amd_avx512(runtime_env._cpuinfo()):
        pytest.skip("not an AMD CPU with AVX-512")
    if "mkl_serv_cpu_detect" not in (Path(torch.__file__).parent / "lib" / "libtorch_cpu.so").read_bytes().decode(
        "latin-1"
    ):
        pytest.skip("this PyTorch build has no oneMKL")
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "RLVR_MKL_AVX512", "RLVR_CPU_ACCEL")}
    env = runtime_env.mkl_avx512_env({**base, "RLVR_CACHE": str(tmp_path)})
    if env is None:
        pytest.skip("the shim could not be built here (no C compiler)")
    plain, shimmed = _probe(base), _probe(env)
    assert plain["path"] != shimmed["path"]  # MKL's dispatch saw the vendor check answered
    for got in (plain, shimmed):
        assert abs(got["sum"] - got["ref"]) <= 1e-4 * abs(got["ref"]) + 1e-2
