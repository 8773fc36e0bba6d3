"""Run ``rlvr train`` with one fault fired at a named point (used by test_fault_injection.py).

    python fault_driver.py POINT N SIGNAL MARKER -- rlvr-train-args...

The N-th time this process reaches POINT, it sends itself SIGNAL (SIGKILL or SIGTERM) and writes
MARKER first, so the test knows the fault fired. Points:

- ``rollout``: entering ``HFRolloutEngine.generate`` (mid-rollout)
- ``update``: entering an update pass's loss and statistics, for every planned pass: forward and
  backward, forward only, or a group whose statistics come from the rollout with no pass
  (mid-update, between micro-batches)
- ``checkpoint``: writing ``trainer_state.pt`` (mid-checkpoint: weights written, state not yet)
- ``last``: after the step directory's rename, before ``last`` is swapped to it
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

# the environment `rlvr train` gives itself (MKL's kernels on AMD), as for the runs this stands in for
if __name__ == "__main__":
    from rlvr.cpu.runtime_env import reexec_with_runtime_env

    reexec_with_runtime_env()

import torch  # noqa: E402

from rlvr.cli import main  # noqa: E402
from rlvr.rollout.hf import HFRolloutEngine  # noqa: E402
from rlvr.training import loop  # noqa: E402


def arm(point: str, n: int, sig: signal.Signals, marker: Path) -> None:
    owner, name = {
        "rollout": (HFRolloutEngine, "generate"),
        "update": (loop, "_loss_and_stats"),
        "checkpoint": (torch, "save"),
        "last": (os, "symlink"),
    }[point]
    real = getattr(owner, name)
    calls = {"n": 0}

    def faulty(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            marker.write_text(f"{point} {n} {sig.name}\n")
            os.kill(os.getpid(), sig)  # SIGKILL: gone here; SIGTERM: the handler runs, then we go on
        return real(*args, **kwargs)

    setattr(owner, name, faulty)


if __name__ == "__main__":
    point, n, sig, marker, sep, *args = sys.argv[1:]
    assert sep == "--"
    arm(point, int(n), signal.Signals[sig], Path(marker))
    sys.exit(main(["train", *args]))
