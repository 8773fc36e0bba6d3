"""The `sevens` reward as a plugin file that SIGKILLs the process calling it, at its N-th call: how the
distributed tests lose a worker mid-step (test_fsdp.py, test_async_rollouts.py)."""

from __future__ import annotations

from pathlib import Path

PLUGIN = """
import os, signal, time
from pathlib import Path
import torch.distributed as dist

def lost(completions, labels, **fields):
    at, *before = Path({control!r}).read_text().split()
    if int(at) and {condition}:
        calls = Path({calls!r})
        n = int(calls.read_text()) + 1 if calls.exists() else 1
        calls.write_text(str(n))
        if n == int(at):
            for _ in range(600):
                if not before or Path(before[0]).is_dir():
                    break
                time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGKILL)
    return [sum(w == "7" for w in c.split()) / max(len(c.split()), 1) for c in completions]
"""


def killing_reward(tmp_path: Path, at: int, wait_for: Path | None = None, *, rank: int | None = None) -> tuple:
    """The reward overrides for a plugin that SIGKILLs the process scoring its ``at``-th call (never with
    ``at`` 0), once ``wait_for`` (a checkpoint folder) exists; with ``rank`` only in that torch.distributed
    rank's process, and only its calls count. One file for every run of a test (rewritten each call), so
    that their reward metrics have the same names."""
    path, control, calls = tmp_path / "lost.py", tmp_path / "kill_at", tmp_path / "calls"
    control.write_text(f"{at} {wait_for or ''}", encoding="utf-8")
    calls.unlink(missing_ok=True)
    condition = "True" if rank is None else f"dist.is_initialized() and dist.get_rank() == {rank}"
    path.write_text(PLUGIN.format(control=str(control), calls=str(calls), condition=condition), encoding="utf-8")
    rule = f"{path}:lost"
    return f"reward.rules=[{rule}]", f"reward.accuracy_rule={rule}"
