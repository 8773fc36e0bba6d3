"""A NaN/inf loss or gradient skips that update instead of ending the run; too many in a row stop it
with the last good weights saved."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import metrics, tiny_config

from rlvr.errors import UserError
from rlvr.training import loop, train

pytestmark = pytest.mark.slow


def inject_nan_gradients(monkeypatch, bad_calls: set[int] | None):
    """Poison the gradient of one weight after the update's backward, on the given calls (1-based;
    None = every call from the second on)."""
    calls = {"n": 0}
    real = loop.accumulate_gradients

    def poisoned(policy, *args, **kwargs):
        out = real(policy, *args, **kwargs)
        calls["n"] += 1
        if (calls["n"] in bad_calls) if bad_calls is not None else calls["n"] >= 2:
            next(policy.parameters()).grad.view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(loop, "accumulate_gradients", poisoned)


def weights(run_dir, step):
    return load_file(run_dir / "checkpoints" / f"step_{step:06d}" / "model.safetensors")


def test_a_nan_gradient_skips_that_update_and_training_goes_on(tiny_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    inject_nan_gradients(monkeypatch, {2})
    train(tiny_config(tiny_dir, run, "train.steps=4", "train.save_every=1", "train.keep_checkpoints=0"))
    rows = metrics(run)
    assert [r["train/skipped_updates"] for r in rows] == [0, 1, 0, 0]
    assert [r["train/skipped_steps"] for r in rows] == [0, 1, 1, 1]
    one, two, three = weights(run, 1), weights(run, 2), weights(run, 3)
    assert all(torch.equal(one[k], two[k]) for k in one)  # the skipped update changed nothing
    assert any(not torch.equal(two[k], three[k]) for k in two)  # the next one trained again
    assert all(torch.isfinite(v).all() for v in three.values())


def test_too_many_bad_steps_in_a_row_stop_with_the_last_good_weights(tiny_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    inject_nan_gradients(monkeypatch, None)
    cfg = tiny_config(
        tiny_dir, run, "train.steps=6", "train.save_every=1", "train.keep_checkpoints=0", "train.max_bad_steps=2"
    )
    with pytest.raises(UserError, match="stopped at step 3: 2 steps in a row had a non-finite loss or gradient"):
        train(cfg)
    assert [r["train/skipped_steps"] for r in metrics(run)] == [0, 1, 2]
    one, three = weights(run, 1), weights(run, 3)
    assert all(torch.equal(one[k], three[k]) for k in one)
    assert (run / "checkpoints" / "last").resolve().name == "step_000003"


def test_a_reward_plugin_returning_inf_costs_only_those_items(tiny_dir, tmp_path):
    """inf/-inf/NaN from a plugin are that item's error score (reward.on_error_score), counted in
    reward/<rule>_errors; rewards, advantages and weights stay finite and training goes on."""
    plugin = tmp_path / "bad_reward.py"
    plugin.write_text(
        "import math\n"
        "def score(completions, labels, **fields):\n"
        "    bad = [math.inf, -math.inf, math.nan]\n"
        "    return [bad[len(c) % 3] if len(c) % 2 else float(c.count('7')) for c in completions]\n"
    )
    run = tmp_path / "run"
    rule = f"{plugin}:score"
    train(
        tiny_config(
            tiny_dir,
            run,
            "train.steps=3",
            "train.save_every=1",
            f"reward.rules=[{rule}]",
            f"reward.accuracy_rule={rule}",
        )
    )
    rows = metrics(run)
    assert len(rows) == 3
    assert sum(r[f"reward/{rule}_errors"] for r in rows) > 0  # odd-length completions (items are scored one by one)
    for r in rows:
        assert all(v == v and abs(v) != float("inf") for v in r.values() if isinstance(v, float))
    assert all(torch.isfinite(v).all() for v in weights(run, 3).values())
    assert [r["train/skipped_updates"] for r in rows] == [0, 0, 0]
