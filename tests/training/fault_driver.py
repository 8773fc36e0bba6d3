"""Run ``rlvr train`` with one fault fired at a named point (used by test_fault_injection.py and
test_reproducibility.py).

    python fault_driver.py POINT N SIGNAL MARKER -- rlvr-train-args...
    python fault_driver.py -- rlvr-train-args...          (no fault)

With ``RLVR_TEST_PATHS=FILE`` it writes, when the run ends normally, how often each optional CPU path
ran (:data:`PATHS`) as JSON to FILE; with ``RLVR_TEST_EMULATE_UA=1`` the compiled update attention is
the SIMDe-emulated build where this CPU has no AVX512-BF16 (tests/ua_emulated.py).

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

import atexit
import json
import os
import signal
import sys
from collections import Counter
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


PATHS = {
    "update_attention": ("rlvr.cpu.update_attention", "Library", "forward"),
    "update_attention_backward": ("rlvr.cpu.update_attention", "Library", "backward"),
    "decode_kernels": ("rlvr.cpu.kernels", "DecodeKernels", "step"),
    "packed_weights": ("rlvr.cpu.packed", None, "packed_linear"),
    "forward_only_groups": ("rlvr.training.loop", None, "_forward_only"),
}
"""Each optional CPU path's marker: (module, class or None, the function every use of the path calls)."""


def count_paths(out: Path) -> None:
    """Count the calls of each path's marker, and write the counts (and whether MKL's AVX-512 shim is
    preloaded) to ``out`` at a normal exit."""
    import importlib

    counts = Counter()
    for name, (module, cls, attr) in PATHS.items():
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        real = getattr(owner, attr)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        setattr(owner, attr, counted)
    counts["mkl_avx512_preload"] = int("mkl_intel_cpu" in os.environ.get("LD_PRELOAD", ""))
    atexit.register(lambda: out.write_text(json.dumps({k: counts[k] for k in [*PATHS, "mkl_avx512_preload"]})))


if __name__ == "__main__":
    if os.environ.get("RLVR_TEST_EMULATE_UA") == "1":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import ua_emulated

        ua_emulated.install()
    if os.environ.get("RLVR_TEST_PATHS"):
        count_paths(Path(os.environ["RLVR_TEST_PATHS"]))
    if sys.argv[1] == "--":
        sys.exit(main(["train", *sys.argv[2:]]))
    point, n, sig, marker, sep, *args = sys.argv[1:]
    assert sep == "--"
    arm(point, int(n), signal.Signals[sig], Path(marker))
    sys.exit(main(["train", *args]))
