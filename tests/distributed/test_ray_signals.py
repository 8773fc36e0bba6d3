"""SIGTERM to the driver of a Ray run (``rlvr train distributed.backend=ray``, a subprocess), and Ctrl-C
(SIGINT to its whole process group, which Ray's own processes ignore): every worker finishes the
step, rank 0 saves it, the run exits 0 and leaves no Ray process behind, and resuming ends where an
uninterrupted one-process run ends. The single-process signal tests are tests/training/test_signals.py
and test_fault_injection.py.

Not covered: SIGTERM to the whole process group (Slurm's scancel does that). It reaches Ray's GCS,
raylet and workers too; tried by hand, the step was still saved, but the driver then waited 60 s for
the dead GCS and exited 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import metrics

from rlvr.commands.train import run_training as train
from rlvr.config import load_config

pytestmark = pytest.mark.slow

STEPS = 6
RAY = ("distributed.backend=ray", "distributed.num_workers=2", f"train.steps={STEPS}")


def _rlvr_train(args: list[str], log) -> subprocess.Popen:
    # stderr to a file: a pipe nobody reads while the run goes on could fill and stall it; its own
    # session, so that a signal to its process group reaches the run's processes and not pytest
    cmd = [sys.executable, "-m", "rlvr.cli", "train", *args]
    # the reference run trains in this test's process, without the environment the command gives itself:
    # MKL's AVX2 kernels on both sides (on an AMD CPU with AVX-512 the command would take its AVX-512 ones)
    env = {**os.environ, "RLVR_MKL_AVX512": "0"}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, env=env)


def _rows(run) -> int:
    path = run / "metrics.jsonl"
    return path.read_text(encoding="utf-8").count("\n") if path.is_file() else 0


def _ray_processes(pid: int) -> dict:
    """The driver's descendants, {psutil.Process: command line}: Ray's GCS, raylet, ... and the
    workers (children of the raylet)."""
    import psutil

    out = {}
    for p in psutil.Process(pid).children(recursive=True):
        try:
            out[p] = " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            pass
    return out


def _alive(procs) -> list:
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize(
    "sig, to_group",
    [
        pytest.param(signal.SIGTERM, False, id="SIGTERM-to-driver"),
        pytest.param(signal.SIGINT, True, id="Ctrl-C-to-group", marks=pytest.mark.extended),  # the same save path
    ],
)
def test_a_signal_saves_the_step_exits_0_leaves_no_ray_process_and_resumes(
    sig, to_group, dp_args, tmp_path, monkeypatch
):
    pytest.importorskip("ray")
    pytest.importorskip("psutil")  # a dependency of Ray
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    one, run = tmp_path / "one", tmp_path / "run"
    train(load_config(None, dp_args(one, f"train.steps={STEPS}")))

    log_file = tmp_path / "stopped.log"
    with open(log_file, "wb") as log:
        proc = _rlvr_train(dp_args(run, *RAY), log)
        deadline = time.monotonic() + 300
        while _rows(run) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert proc.poll() is None, "the run ended before it could be signalled: " + log_file.read_text()[-2000:]
        ray_procs = _ray_processes(proc.pid)
        assert sum("ray::Worker" in cmd for cmd in ray_procs.values()) == 2, list(ray_procs.values())
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        code = proc.wait(timeout=300)
    err = log_file.read_text(encoding="utf-8", errors="replace")
    assert code == 0, err[-3000:]
    assert f"stopped by {sig.name} after step" in err and f"continue with: rlvr train resume={run}" in " ".join(
        err.split()
    )

    done = len(metrics(run))
    assert 1 <= done < STEPS, f"{done} steps: the signal should have stopped the run early"
    assert (run / "checkpoints" / "last").resolve().name == f"step_{done:06d}"  # nothing finished is lost
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # no temporary dirs

    # Ray's processes may take a moment to exit after the driver. (A local Ray's processes also die
    # with the driver on their own, so this checks the outcome, not RayTrainer.close alone.)
    deadline = time.monotonic() + 30
    while _alive(ray_procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, ray_procs[p][:120]) for p in _alive(ray_procs)]
    assert not left, f"Ray processes left behind: {left}"

    with open(tmp_path / "resumed.log", "wb") as log:
        assert _rlvr_train(dp_args(run, *RAY, f"resume={run}"), log).wait(timeout=300) == 0, (
            tmp_path / "resumed.log"
        ).read_text()[-3000:]
    a, b = metrics(one, timings=False), metrics(run, timings=False)
    assert [r["step"] for r in b] == list(range(1, STEPS + 1))
    assert [r["rollout/reward_mean"] for r in a] == [r["rollout/reward_mean"] for r in b]  # the same completions
    for row_a, row_b in zip(a, b):
        assert row_b == pytest.approx(row_a, rel=1e-4, abs=1e-6), row_a["step"]
    wa = load_file(one / "checkpoints" / "last" / "model.safetensors")
    wb = load_file(run / "checkpoints" / "last" / "model.safetensors")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-6)
