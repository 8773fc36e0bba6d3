"""Kill -9 at random moments, resume, and end bit-identical to a run that was never killed
(issue 11's fault-injection acceptance, the SIGKILL half; SIGTERM/SIGINT are in test_signals.py)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

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


def _start(model, run, extra):
    cmd = [sys.executable, "-m", "rlvr.cli", "train", f"model.path={model}", f"run_dir={run}", *ARGS, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONHASHSEED": "0"})


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
        has_ckpt = (killed / "checkpoints" / "last").is_dir()
        extra = [f"resume={killed}"] if has_ckpt else (["overwrite=true"] if killed.exists() else [])
        proc = _start(model, killed, extra)
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
    a = load_file(straight / "checkpoints" / f"step_{STEPS:06d}" / "model.safetensors")
    b = load_file(killed / "checkpoints" / f"step_{STEPS:06d}" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _metrics(straight) == _metrics(killed)
    assert not [p.name for p in (killed / "checkpoints").iterdir() if p.name.startswith(".")]
