"""Before any model loads: the run directory must be writable, have room for two checkpoints, and
not hold another run unless resume= or overwrite=true."""

from __future__ import annotations

from collections import namedtuple

import pytest
from tiny_run import metrics, tiny_config

from rlvr.errors import UserError
from rlvr.training import checkpoint, preflight, train

pytestmark = pytest.mark.slow


def test_unwritable_run_dir_is_one_line(tiny_dir, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match=r"run_dir=.*a_file/run is not writable .*pick another run_dir="):
        train(tiny_config(tiny_dir, blocker / "run", "train.steps=1"))


def test_too_little_room_for_two_checkpoints(tiny_dir, tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    need = 2 * checkpoint.checkpoint_bytes(tiny_dir)
    assert need > 1000
    with pytest.raises(UserError, match="GiB free but two checkpoints of this model need about"):
        train(tiny_config(tiny_dir, tmp_path / "run", "train.steps=1"))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_checkpoint_size_estimate_counts_weights_and_adam_moments(tiny_dir):
    from safetensors.torch import load_file

    params = sum(t.numel() for t in load_file(tiny_dir / "model.safetensors").values())
    assert checkpoint.checkpoint_bytes(tiny_dir) == 3 * 4 * params
    assert checkpoint.checkpoint_bytes(tiny_dir, "bfloat16") == 3 * 2 * params


def test_existing_run_needs_resume_or_overwrite(tiny_dir, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(tiny_dir, run, "train.steps=2", "train.save_every=1", "train.keep_checkpoints=0"))
    with pytest.raises(UserError, match="already holds a run.*overwrite=true"):
        train(tiny_config(tiny_dir, run, "train.steps=1"))
    train(tiny_config(tiny_dir, run, "train.steps=1", "overwrite=true"))
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1]
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000001"]
