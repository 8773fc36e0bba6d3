"""The ``python`` tool (opt-in): runs the call's code in a fresh Python subprocess with limits, and
answers with what it printed.

What it does:

- a new interpreter, ``python -I -S`` (no user site, no ``PYTHON*`` environment variables, no
  ``site``), with an **empty environment**, started in a **new session** (its process group is
  killed on a time-out);
- its working directory is a **fresh temporary folder**, removed afterwards; the code is a file in it;
- **rlimits**: CPU time (:data:`CPU_S`), address space (:data:`MEMORY_BYTES`), size of any file it
  writes (:data:`FILE_BYTES`, which also caps its output: stdout and stderr go to files in the
  folder), no core dumps, and (for an unprivileged user) no new processes;
- a **wall-clock limit** (:data:`WALL_S`) for code that sleeps or waits, after which its process group
  is killed;
- where the machine lets an unprivileged user create namespaces (``unshare -rn`` works), a **new network
  namespace** with no interfaces but a downed loopback: no network. :func:`isolation` says which.

What it does NOT do (it is a guard against a model's accidents, not a security boundary):

- it does **not** hide the file system: the code can read every file the training user can read
  (absolute paths), and write wherever that user can write (each file at most :data:`FILE_BYTES`);
- without ``unshare`` it has the **network** of the training process;
- run as root, the process limit does not apply (root is exempt), nor do the other protections
  root has over its own files;
- nothing stops it from using the CPU time and memory it is given while it runs.

Run untrusted models' code on a machine (or container) you can afford to lose, or leave ``python``
out of ``rollout.tools``.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from rlvr.tools.errors import ToolError

CPU_S = 2
"""CPU seconds the code may use."""
WALL_S = 4.0
"""Wall-clock seconds before its process group is killed (sleeping code uses no CPU)."""
MEMORY_BYTES = 512 * 2**20
"""Address space of the interpreter (the interpreter itself needs some tens of MiB)."""
FILE_BYTES = 2**20
"""Largest file it may write, its stdout and stderr included."""
OUTPUT_CHARS = 2000
"""Characters of its output read back (the tool's result is capped again by ``rollout.tool_max_chars``)."""


@functools.cache
def isolation() -> str:
    """``network namespace`` when ``unshare -rn`` works on this machine (the code runs without a
    network), else ``none``: the code shares the network of the training process."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "none"
    try:
        ok = subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return "network namespace" if ok else "none"


def _limits() -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_S, CPU_S + 1))  # SIGXCPU at the soft limit
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.getuid() != 0:  # counted per user: 0 means this child may not start any process
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def python(args: str) -> str:
    """What the code ``args`` prints (stdout, then stderr), stripped; an exit status other than 0 is
    an error result with the end of what it printed.

    Raises:
        ToolError: no code, a time-out, a killed process (CPU or memory limit) or a failing exit.
    """
    code = args.strip()
    if code.startswith("```"):  # a fenced block, as models often write it
        code = code.strip("`").removeprefix("python").strip()
    if not code:
        raise ToolError("no code")
    scratch = Path(tempfile.mkdtemp(prefix="rlvr-python-"))
    try:
        (scratch / "main.py").write_text(code, encoding="utf-8")
        cmd = [sys.executable, "-I", "-S", "main.py"]
        if isolation() != "none":
            cmd = [shutil.which("unshare"), "-rn", "--", *cmd]
        with open(scratch / "out", "wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=scratch, env={}, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=_limits, start_new_session=True,
            )  # fmt: skip
            try:
                status = proc.wait(timeout=WALL_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise ToolError(f"timed out after {WALL_S:g} s") from None
        size = (scratch / "out").stat().st_size
        text = (scratch / "out").read_bytes()[: OUTPUT_CHARS * 4].decode("utf-8", "replace")[:OUTPUT_CHARS].strip()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if size >= FILE_BYTES:
        raise ToolError(f"output longer than {FILE_BYTES} bytes")
    if status < 0:
        why = {
            signal.SIGXCPU: f"CPU limit ({CPU_S} s)",
            signal.SIGKILL: "killed (CPU or memory limit)",
            signal.SIGXFSZ: "output limit",
        }
        raise ToolError(f"stopped: {why.get(-status, signal.Signals(-status).name)}")
    if status != 0:
        last = text.strip().splitlines()[-1] if text.strip() else f"exit status {status}"
        raise ToolError(last[:200])
    return text
