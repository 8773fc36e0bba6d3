"""Kill -9 and SIGTERM at named points and at random moments, resume, and end bit-identical to a
run that was never interrupted (what crash-safe checkpoints and exact resume promise). Every run is a subprocess
of ``rlvr train``; in-process signal tests are in test_signals.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import FORMAT_REWARD, metrics, tiny_args

pytestmark = pytest.mark.slow

STEPS = 80
# the tiny run, in a subprocess (no in-process `sevens` reward), smaller, checkpointing every step
FAULT_RUN = (
    *FORMAT_REWARD,
    "model.autocast_bf16=false",
    "rollout.samples_per_prompt=4",
    "train.prompts_per_step=2",
    "train.micro_batch_seqs=4",
    "train.save_every=1",
    "train.keep_checkpoints=2",
    "eval.limit=4",
    f"train.steps={STEPS}",
)


DRIVER = Path(__file__).with_name("fault_driver.py")


def _start(model, run, extra, fault=()):
    head = [str(DRIVER), *fault, "--"] if fault else ["-m", "rlvr.cli", "train"]
    cmd = [sys.executable, *head, *tiny_args(model, run, *FAULT_RUN, *extra)]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONHASHSEED": "0"}
    )


def _continue(run):
    """What a user types next: resume when there is a checkpoint, else start over."""
    if (run / "checkpoints" / "last").is_dir():
        return [f"resume={run}"]
    return ["overwrite=true"] if run.exists() else []


def _same_end(straight, run, steps):
    a = load_file(straight / "checkpoints" / f"step_{steps:06d}" / "model.safetensors")
    b = load_file(run / "checkpoints" / f"step_{steps:06d}" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(straight, timings=False) == metrics(run, timings=False)
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


@pytest.mark.extended  # the named-points test below kills at every point deterministically
def test_sigkill_at_random_moments_then_resume_is_bit_exact(tiny_dir, tmp_path):
    model = tiny_dir
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert _start(model, straight, []).wait(timeout=300) == 0

    def steps_done():
        path = killed / "metrics.jsonl"
        return path.read_text().count("\n") if path.is_file() else 0

    rng = random.Random(0)
    targets = sorted(rng.sample(range(3, STEPS - 3), 4))  # kill once each of these steps has finished ...
    kills = 0
    for target in [*targets, None]:
        proc = _start(model, killed, _continue(killed))
        if target is None:  # then let it finish
            assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-2000:]
            break
        deadline = time.monotonic() + 120
        while steps_done() < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.03))  # ... plus a random part of the next step (rollout, update, checkpoint)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    assert kills == 4
    _same_end(straight, killed, STEPS)


POINTS = ["rollout", "update", "checkpoint", "last"]


@pytest.mark.parametrize(
    "signals",
    [
        pytest.param(("SIGKILL",), id="kill"),
        # SIGTERM's clean stop is test_signals.py's in CI; here, at every named point too, in `make test-all`
        pytest.param(("SIGKILL", "SIGTERM"), id="kill-then-term", marks=pytest.mark.extended),
    ],
)
def test_sigkill_then_sigterm_at_each_named_point_then_resume_is_bit_exact(tiny_dir, tmp_path, signals):
    """One run meets a fault at each named point in turn (see fault_driver.py): SIGKILL, then (extended)
    SIGTERM at each. SIGTERM must exit 0 with a checkpoint of the last finished step."""
    steps, every = 40, ["train.steps=40", "train.save_every=5"]
    model = tiny_dir
    straight, run = tmp_path / "straight", tmp_path / "run"
    assert _start(model, straight, every).wait(timeout=300) == 0
    rng = random.Random(1)
    for sig in signals:
        for point in POINTS:
            # the 2nd save of a process, so that an older checkpoint exists to resume from
            n = 2 if point in ("checkpoint", "last") else rng.randint(2, 6)
            marker = tmp_path / f"fired-{sig}-{point}"
            proc = _start(model, run, [*every, *_continue(run)], fault=(point, str(n), sig, str(marker)))
            code = proc.wait(timeout=300)
            err = proc.stderr.read().decode()
            assert marker.is_file(), f"{sig} at {point} #{n} never fired: {err[-2000:]}"
            if sig == "SIGKILL":
                assert code == -signal.SIGKILL
                continue
            assert code == 0, err[-2000:]
            assert "continue with: rlvr train resume=" in " ".join(err.split())
            done = len(metrics(run))
            assert (run / "checkpoints" / "last").resolve().name == f"step_{done:06d}"  # nothing finished is lost
    assert _start(model, run, [*every, *_continue(run)]).wait(timeout=300) == 0
    _same_end(straight, run, steps)
