"""The ``python`` tool (opt-in): runs the call's code once in rlvr's sandbox (:mod:`rlvr.sandbox`:
bubblewrap namespaces with no network, none of your files, a tmpfs scratch, rlimits and a wall limit)
and answers with what it printed. The code rewards run code in the same sandbox.

How it runs follows ``reward.sandbox`` (the environment variable ``RLVR_SANDBOX``, which the trainer
sets): ``bwrap`` (default; a run that names this tool stops first, in one line naming the package,
where bubblewrap cannot run) or ``none`` (no isolation, with a warning once).
"""

from __future__ import annotations

import os

from rlvr import sandbox
from rlvr.tools.errors import ToolError

CPU_S = 2
"""CPU seconds the code may use."""
WALL_S = 4.0
"""Wall-clock seconds before every process it started is killed (sleeping code uses no CPU)."""
MEMORY_BYTES = 512 * 2**20
"""Address space of the interpreter (the interpreter itself needs some tens of MiB)."""
FILE_BYTES = 2**20
"""Largest file it may write, its output included."""
OUTPUT_CHARS = 2000
"""Characters of its output read back (the tool's result is capped again by ``rollout.tool_max_chars``)."""


def isolation() -> str:
    """How the tool runs code here: ``reward.sandbox`` as the trainer set it (default ``bwrap``)."""
    from rlvr.rewards.code import SANDBOX_ENV

    return os.environ.get(SANDBOX_ENV, "bwrap")


def python(args: str) -> str:
    """What the code ``args`` prints (stdout, then stderr), stripped; an exit status other than 0 is
    an error result with the end of what it printed.

    Raises:
        ToolError: no code, a time-out, a killed process (CPU or memory limit), a failing exit, or no
            sandbox here.
    """
    code = args.strip()
    if code.startswith("```"):  # a fenced block, as models often write it
        code = code.strip("`").removeprefix("python").strip()
    if not code:
        raise ToolError("no code")
    how = isolation()
    if how == "bwrap" and (problem := sandbox.bwrap_problem()) is not None:
        raise ToolError(f"no sandbox: {problem}")
    limits = sandbox.Limits(
        test_s=WALL_S, total_s=WALL_S, memory_bytes=MEMORY_BYTES, file_bytes=FILE_BYTES, processes=16, cpu_s=CPU_S
    )
    run = sandbox.run_program(code, limits=limits, isolation=how)
    if run.error is not None:
        raise ToolError(f"sandbox: {run.error}")
    if run.timed_out:
        raise ToolError(f"timed out after {WALL_S:g} s")
    text = run.output[:OUTPUT_CHARS].strip()
    if run.size >= FILE_BYTES:
        raise ToolError(f"output longer than {FILE_BYTES} bytes")
    status = run.status or 0
    if status < 0:
        why = {24: f"CPU limit ({CPU_S} s)", 9: "killed (CPU or memory limit)", 25: "output limit"}
        raise ToolError(f"stopped: {why.get(-status, f'signal {-status}')}")
    if status != 0:
        last = text.strip().splitlines()[-1] if text.strip() else f"exit status {status}"
        raise ToolError(last[:200])
    return text
