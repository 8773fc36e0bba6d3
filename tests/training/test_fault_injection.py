"""Kill -9 and SIGTERM at named points and at random moments, resume, and end bit-identical to a
run that was never interrupted (issue 11's fault-injection acceptance). Every run is a subprocess
of ``rlvr train``; in-process signal tests are in test_signals.py."""

from __future__ import annotations

import json
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

from rlvr.models.tiny import save_tiny_model

pytestmark = pytest.mark.slow

STEPS = 80
ARGS = [
    "data.template=plain", "data.system_prompt=", "data.assistant_prefix=", "rollout.max_new_tokens=8",
    "rollout.samples_per_prompt=4", "rollout.dtype=float32", "model.autocast_bf16=false", "model.device=cpu",
    "reward.rules=[format_partial]", "reward.weights=[1.0]", "reward.accuracy_rule=format_partial",
    "train.prompts_per_step=2", "train.micro_batch_seqs=4", "train.lr=1e-2", "train.save_every=1",
    "train.keep_checkpoints=2", "log.tensorboard=false", "log.progress=false", "log.report=false",
    "eval.limit=4", f"train.steps={STEPS}",
]


DRIVER = Path(__file__).with_name("fault_driver.py")


def _start(model, run, extra, fault=()):
    head = [str(DRIVER), *fault, "--"] if fault else ["-m", "rlvr.cli", "train"]
    cmd = [sys.executable, *head, f"model.path={model}", f"run_dir={run}", *ARGS, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONHASHSEED": "0"})


def _continue(run):
    """What a user types next: resume when there is a checkpoint, else start over."""
    if (run / "checkpoints" / "last").is_dir():
        return [f"resume={run}"]
    return ["overwrite=true"] if run.exists() else []


def _same_end(straight, run, steps):
    a = load_file(straight / "checkpoints" / f"step_{steps:06d}" / "model.safetensors")
    b = load_file(run / "checkpoints" / f"step_{steps:06d}" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _metrics(straight) == _metrics(run)
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


def _metrics(run):
    timing = lambda k: k.startswith(("time/", "perf/")) or k.endswith("time_s")  # noqa: E731
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not timing(k)} for r in rows]


def test_sigkill_at_random_moments_then_resume_is_bit_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    model = save_tiny_model(tmp_path / "tiny")
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


def test_sigkill_then_sigterm_at_each_named_point_then_resume_is_bit_exact(tmp_path, monkeypatch):
    """One run meets eight faults in turn: SIGKILL at each named point (see fault_driver.py), then
    SIGTERM at each. SIGTERM must exit 0 with a checkpoint of the last finished step."""
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    steps, every = 40, ["train.steps=40", "train.save_every=5"]
    model = save_tiny_model(tmp_path / "tiny")
    straight, run = tmp_path / "straight", tmp_path / "run"
    assert _start(model, straight, every).wait(timeout=300) == 0
    rng = random.Random(1)
    for sig in ("SIGKILL", "SIGTERM"):
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
            done = len(_metrics(run))
            assert (run / "checkpoints" / "last").resolve().name == f"step_{done:06d}"  # nothing finished is lost
    assert _start(model, run, [*every, *_continue(run)]).wait(timeout=300) == 0
    _same_end(straight, run, steps)
