"""rlvr's processes re-execute themselves once with glibc's malloc on transparent huge pages
(rlvr.cpu.runtime_env), only where that applies, and never twice."""

from __future__ import annotations

import subprocess
import sys

from rlvr.cpu import runtime_env
from rlvr.cpu.runtime_env import TUNABLE, huge_pages_env

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


def test_a_process_reexecutes_itself_once_with_the_tunable_where_this_machine_allows():
    """The real thing on this machine: a child that calls reexec_with_huge_pages() prints its
    GLIBC_TUNABLES after it; it carries the tunable exactly where huge_pages_env says it applies."""
    code = (
        "import os; from rlvr.cpu import runtime_env; runtime_env.reexec_with_huge_pages(); "
        "print(os.environ.get('GLIBC_TUNABLES', ''), os.getpid())"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("GLIBC_TUNABLES", "RLVR_HUGE_PAGES")}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    out = proc.communicate(timeout=60)[0].split()
    applies = runtime_env.huge_pages_env(env) is not None
    assert (out[:1] == [TUNABLE]) == applies and len(out) == (2 if applies else 1)
    assert int(out[-1]) == proc.pid  # exec keeps the PID (signals and os.wait4 still reach it)
    off = subprocess.run(
        [sys.executable, "-c", code], env={**env, "RLVR_HUGE_PAGES": "0"}, capture_output=True, text=True, timeout=60
    )
    assert off.stdout.split()[:-1] == []
