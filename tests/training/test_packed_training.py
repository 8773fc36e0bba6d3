"""Training with oneDNN-packed linear weights (model.packed_weights, rlvr.models.packed) takes the steps that
training without them takes, to float rounding: the same samples, rewards, losses and final weights."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlvr.models import packed as packed_module
from rlvr.models.packed import packing_available
from rlvr.training import train
from tiny_run import metrics, tiny_config

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN prepacked linear")


@pytest.mark.parametrize("train_path", [True, False], ids=["packed-update", "packed-sampling-only"])
@pytest.mark.parametrize("extra", [(), ("algo.num_iterations=2",)], ids=["one-update", "two-updates-per-rollout"])
def test_packed_training_equals_plain_training(tiny_dir, tmp_path, extra, train_path, monkeypatch):
    """Both the AVX-512 choice (the update on packed weights too) and the AVX2 one (sampling and no-grad
    passes only), whatever this CPU dispatches."""
    monkeypatch.setattr(packed_module, "packed_training_pays", lambda: train_path)
    runs = {}
    for packed in ("true", "false"):
        run_dir = tmp_path / packed
        train(tiny_config(tiny_dir, run_dir, "train.steps=3", f"model.packed_weights={packed}", "model.autocast_bf16=false", *extra))
        runs[packed] = metrics(run_dir, timings=False), load_file(run_dir / "checkpoints" / "last" / "model.safetensors")
    (a, wa), (b, wb) = runs["true"], runs["false"]
    assert [r["rollout/reward_mean"] for r in a] == [r["rollout/reward_mean"] for r in b]  # the same samples
    for row_a, row_b in zip(a, b):
        assert row_a == pytest.approx(row_b, rel=1e-3, abs=1e-5), row_a["step"]
    start = load_file(tiny_dir / "model.safetensors")
    assert any(not torch.equal(wa[k], start[k]) for k in wa)  # it trained
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5, msg=k)
