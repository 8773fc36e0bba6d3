"""One way to run model-written code: bubblewrap namespaces, rlimits, a wall-clock limit, and a result
channel the code cannot reach. Used by the code rewards (``code_tests``).

What the code gets (``bwrap``, the Debian package ``bubblewrap``):

- new mount, PID, network, IPC, UTS, user and cgroup namespaces (``--unshare-all``): no network at
  all, loopback included; it sees only its own processes;
- the system's interpreter and libraries read-only (``/usr``, ``/lib``, ``/lib64``, ``/bin``, and
  ``/etc``'s few files Python reads), and nothing else of the machine: no home, no run directory, no
  Hugging Face or rlvr cache, no project checkout, no ``/proc``;
- a fresh tmpfs of :attr:`Limits.scratch_bytes` as its working directory (``/work``), gone afterwards,
  and nothing else writable (the sandbox's own root is remounted read-only);
- an unprivileged uid (65534 inside; on the host too when rlvr runs as root, so the process limit
  applies), ``--die-with-parent``, and a new session: a timeout kills every process it started;
- rlimits on each program it runs: CPU seconds, address space, file size (which caps its output),
  process count, no core dumps.

The tests run in :mod:`rlvr.sandbox.harness`, inside the sandbox: it runs the candidate in a child
process, compares what it returns or prints with the expected output (which the child never gets),
and reports on its own stdout with a per-call random token; the host reads nothing else. So exiting
early, patching ``print`` or the comparison, reading or writing files, or killing the harness can
only lose tests, never pass them (``tests/sandbox/test_hostile.py``).

``isolation="none"`` runs the same harness without bubblewrap (no namespaces: the code can read what
the training user can read); it exists for machines without bubblewrap, and says so once.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import UserError

HARNESS = Path(__file__).with_name("harness.py")
ISOLATIONS = ("bwrap", "none")
INSTALL = "apt-get install bubblewrap (Debian, Ubuntu), dnf install bubblewrap (Fedora)"
NOBODY = 65534
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin")
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf")


@dataclass(frozen=True)
class Limits:
    """What one completion's tests may use."""

    test_s: float = 4.0
    """Wall seconds for one test."""
    total_s: float = 12.0
    """Wall seconds for all of one completion's tests."""
    memory_bytes: int = 1 << 30
    """Address space of each program."""
    file_bytes: int = 8 << 20
    """Largest file a program may write (its output included)."""
    processes: int = 64
    """Processes the sandbox's user may run at once."""
    scratch_bytes: int = 64 << 20
    """Size of the tmpfs working directory."""
    cpu_s: float | None = None
    """CPU seconds each program may use (default: ``total_s`` rounded up, plus one)."""


@dataclass(frozen=True)
class Outcome:
    """One completion's tests: ``passed`` per test (False for a test not run), and why each failed."""

    passed: list[bool]
    why: list[str]
    seconds: float
    timeouts: int
    error: str | None = None
    """The sandbox or the harness failed (not the code): no test counts as passed."""


def python() -> str:
    """The interpreter the sandbox runs: the system's ``/usr/bin/python3`` where it exists (inside the
    read-only system directories), else this process's base interpreter."""
    if os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3"
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _drop_to_nobody() -> None:
    """In the child before bwrap starts: as root, become uid/gid 65534, so that the sandbox's
    processes count against an unprivileged user's process limit (root is exempt from it)."""
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def bwrap_argv(limits: Limits, interpreter: str, harness_fd: int | None = None) -> list[str]:
    """bubblewrap's command line up to (not including) the program: see the module docstring.
    ``harness_fd``: a pipe holding the harness's source, put at ``/harness.py`` (read-only)."""
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    for d in SYSTEM_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            argv += ["--ro-bind", d, d]
        elif os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
    for f in ETC_FILES:
        if os.path.exists(f):
            argv += ["--ro-bind", f, f]
    home = os.path.dirname(os.path.dirname(interpreter))
    if not interpreter.startswith(SYSTEM_DIRS):  # an interpreter outside them (pyenv): its prefix alone
        argv += ["--ro-bind", home, home]
    argv += ["--dev", "/dev", "--size", str(limits.scratch_bytes), "--tmpfs", "/work", "--chdir", "/work"]
    if harness_fd is not None:
        argv += ["--ro-bind-data", str(harness_fd), "/harness.py"]
    argv += ["--remount-ro", "/"]  # the sandbox's own root: writable (and unbounded) otherwise
    argv += ["--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/work", "--unsetenv", "PYTHONPATH"]
    return argv


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot isolate code here (missing, or it cannot create the namespaces), else None.
    Tried once per process."""
    if shutil.which("bwrap") is None:
        return f"bubblewrap (bwrap) is not installed; {INSTALL}"
    try:
        proc = subprocess.run(
            [*bwrap_argv(Limits(), python()), python(), "-I", "-S", "-c", "print(6 * 7)"],
            capture_output=True,
            timeout=30,
            preexec_fn=_drop_to_nobody,
            env={},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not start: {e}"
    if proc.returncode != 0 or proc.stdout.strip() != b"42":
        first = (proc.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[0]
        return f"bwrap cannot create its namespaces here ({first[:160]})"
    return None


def check_isolation(isolation: str) -> str:
    """The line that says how model-written code runs here; raises UserError where ``isolation`` is
    ``bwrap`` and bubblewrap cannot run (one line: what to install, or ``reward.sandbox=none``)."""
    if isolation not in ISOLATIONS:
        raise UserError(f"reward.sandbox={isolation}: use bwrap (default) or none")
    if isolation == "none":
        return "code runs WITHOUT isolation (reward.sandbox=none): it can read and write what this user can"
    problem = bwrap_problem()
    if problem is not None:
        raise UserError(
            f"code rewards run model-written code in a bubblewrap sandbox, but {problem}; "
            "or set reward.sandbox=none to run it without isolation (unsafe)"
        )
    return "code runs in a bubblewrap sandbox (no network, no files of yours, rlimits)"


_warned: list[bool] = [False]


@dataclass(frozen=True)
class Program:
    """One program's run (:func:`run_program`): its exit status (negative: the signal that ended it),
    what it printed (stdout and stderr together, the first bytes), how much, and whether its wall
    limit ended it; ``error`` when the sandbox itself failed."""

    status: int | None
    output: str
    size: int
    timed_out: bool
    seconds: float
    error: str | None = None


def run_program(code: str, *, stdin: str = "", limits: Limits = Limits(), isolation: str = "bwrap") -> Program:
    """Runs the Python program ``code`` once in the sandbox, ``stdin`` as its input (the ``python`` tool)."""
    report, seconds = _harness({"code": code, "kind": "run", "stdin": stdin, "cases": []}, limits, isolation)
    if report is None or "run" not in report:
        why = (report or {}).get("error", "the harness did not report")
        return Program(None, "", 0, False, seconds, why)
    r = report["run"]
    return Program(r["status"], r["output"], r["size"], r["timed_out"], seconds)


def run_tests(
    code: str,
    kind: str,
    cases: list[dict],
    *,
    fn_name: str = "",
    setup: str = "",
    limits: Limits = Limits(),
    stop_on_fail: bool = True,
    isolation: str = "bwrap",
) -> Outcome:
    """Runs ``code`` against ``cases`` in one sandbox (see the module docstring).

    Args:
        kind: ``call`` (``fn_name(*args)`` returns ``expected``; cases ``{"args", "expected"}``) or
            ``stdin`` (the program reads ``input`` and prints ``output``; cases ``{"input", "output"}``).
        setup: code run before ``code`` in ``call`` tests (imports a data set's tests assume).
        stop_on_fail: tests after the first failure are not run (and count as failed).
    """
    spec = {
        "code": code,
        "kind": kind,
        "fn_name": fn_name,
        "setup": setup,
        "cases": cases,
        "stop_on_fail": stop_on_fail,
    }
    report, seconds = _harness(spec, limits, isolation)
    n = len(cases)
    if report is None:
        return Outcome([False] * n, ["no report from the harness"] * n, seconds, 0, "the harness did not report")
    if "error" in report:
        return Outcome([False] * n, [report["error"]] * n, seconds, 0, report["error"])
    results = report["results"]
    passed = [bool(r["passed"]) for r in results] + [False] * (n - len(results))
    why = [r["why"] for r in results] + ["not run"] * (n - len(results))
    return Outcome(passed, why, report["seconds"], sum(w == "timeout" for w in why))


def _harness(spec: dict, limits: Limits, isolation: str) -> tuple[dict | None, float]:
    """The harness's report on ``spec`` (None when it did not report) and the wall seconds it took."""
    token = secrets.token_hex(16)
    spec = {
        **spec, "token": token, "test_s": limits.test_s, "total_s": limits.total_s,
        "memory_bytes": limits.memory_bytes, "file_bytes": limits.file_bytes, "processes": limits.processes,
        "cpu_s": limits.cpu_s,
    }  # fmt: skip
    interpreter = python()
    scratch = None
    if isolation == "bwrap":
        read, write = os.pipe()
        os.write(write, HARNESS.read_bytes())  # the harness is small: it fits the pipe's buffer
        os.close(write)
        argv = [*bwrap_argv(limits, interpreter, read), "--", interpreter, "-I", "-S", "/harness.py"]
        fds, preexec, env = (read,), _drop_to_nobody, {}
    else:
        if not _warned[0]:
            warnings.warn("reward.sandbox=none: model-written code runs without isolation", stacklevel=2)
            _warned[0] = True
        scratch = tempfile.mkdtemp(prefix="rlvr-code-")
        argv = [interpreter, "-I", "-S", str(HARNESS), scratch]
        fds, preexec, env, read = (), None, {"PATH": "/usr/bin:/bin"}, None
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            pass_fds=fds, preexec_fn=preexec, env=env, start_new_session=True,
        )  # fmt: skip
        if read is not None:
            os.close(read)
        try:
            out, _ = proc.communicate(json.dumps(spec).encode(), timeout=limits.total_s + 10)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out = b""
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - start
    text = out.decode("utf-8", "replace").strip()
    if not text.startswith(token):
        return None, seconds
    return json.loads(text[len(token) :]), seconds


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, 9)
    except OSError:
        pass
    proc.kill()
    proc.wait()
