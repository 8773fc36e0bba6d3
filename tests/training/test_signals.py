"""SIGTERM/SIGINT finish the step, checkpoint, close the sinks and return; resuming is bit-exact.
Time-bounded checkpoints (train.save_every_min)."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import metrics, tiny_config

from rlvr.training import loop, train

pytestmark = pytest.mark.slow


def signal_during_update(monkeypatch, sig, *, on_call: int, times: int = 1):
    calls = {"n": 0}
    real = loop.accumulate_gradients

    def with_signal(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == on_call:
            for _ in range(times):
                os.kill(os.getpid(), sig)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "accumulate_gradients", with_signal)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_the_step_saves_and_resumes_bit_exact(sig, tiny_dir, tmp_path, monkeypatch, capsys):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(tiny_config(tiny_dir, straight, "train.steps=4"))
    real, before = loop.accumulate_gradients, signal.getsignal(sig)
    signal_during_update(monkeypatch, sig, on_call=2)
    assert train(tiny_config(tiny_dir, stopped, "train.steps=4")) == stopped  # returns: exit status 0
    assert len(metrics(stopped)) == 2  # step 2 was finished, step 3 never started
    assert (stopped / "checkpoints" / "last").resolve().name == "step_000002"
    err = capsys.readouterr().err
    assert f"continue with: rlvr train resume={stopped}" in " ".join(err.split())
    # one line, into a pipe as on a terminal (rich wrapped it at 80 columns)
    assert any(line.endswith(f"continue with: rlvr train resume={stopped}") for line in err.splitlines())
    assert signal.getsignal(sig) == before  # handlers restored
    monkeypatch.setattr(loop, "accumulate_gradients", real)
    train(tiny_config(tiny_dir, stopped, "train.steps=4", f"resume={stopped}"))
    a = load_file(straight / "checkpoints" / "step_000004" / "model.safetensors")
    b = load_file(stopped / "checkpoints" / "step_000004" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(straight, timings=False) == metrics(stopped, timings=False)


def test_second_signal_stops_at_once(tiny_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    signal_during_update(monkeypatch, signal.SIGTERM, on_call=2, times=2)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(tiny_dir, run, "train.steps=4", "train.save_every=1"))
    assert len(metrics(run)) == 1  # step 2 did not finish; step 1's line and checkpoint are intact
    assert (run / "checkpoints" / "last").resolve().name == "step_000001"
    assert not list((run / "checkpoints").glob("*tmp*"))


def test_save_every_min_bounds_what_a_kill_loses(tiny_dir, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(tiny_dir, run, "train.steps=3", "train.save_every_min=1e-6", "train.keep_checkpoints=0"))
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000001", "step_000002", "step_000003"]


def test_signal_during_the_first_evaluation_saves_step_0_and_resumes_bit_exact(tiny_dir, tmp_path, monkeypatch, capsys):
    from rlvr.evaluation.during_training import TrainingEval

    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    extra = ("train.steps=3", "eval.limit=4", "eval.at_start=true")
    train(tiny_config(tiny_dir, straight, *extra))
    real = TrainingEval.run

    def with_signal(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TrainingEval, "run", with_signal)
    assert train(tiny_config(tiny_dir, stopped, *extra)) == stopped
    assert not (stopped / "metrics.jsonl").read_text()  # no step ran
    assert (stopped / "checkpoints" / "last").resolve().name == "step_000000"
    assert (stopped / "eval" / "step_000000").is_dir()  # the before-evaluation finished
    err = capsys.readouterr().err
    assert f"continue with: rlvr train resume={stopped}" in " ".join(err.split())
    # one line, into a pipe as on a terminal (rich wrapped it at 80 columns)
    assert any(line.endswith(f"continue with: rlvr train resume={stopped}") for line in err.splitlines())
    monkeypatch.setattr(TrainingEval, "run", real)
    calls = []
    monkeypatch.setattr(TrainingEval, "run", lambda self, *a, **k: calls.append(a[-1]) or real(self, *a, **k))
    train(tiny_config(tiny_dir, stopped, *extra, f"resume={stopped}"))
    assert 0 not in calls  # the before-evaluation is not run twice
    a = load_file(straight / "checkpoints" / "step_000003" / "model.safetensors")
    b = load_file(stopped / "checkpoints" / "step_000003" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(straight, timings=False) == metrics(stopped, timings=False)
