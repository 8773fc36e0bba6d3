"""Asynchronous rollouts (issue 63): rollout workers apart from the trainers, weights pushed after each
update, one-step-off, and exact resume with the rollouts in flight kept by the checkpoint."""

from __future__ import annotations

import pytest
import torch
from killing_reward import killing_reward
from safetensors.torch import load_file
from tiny_run import metrics

from rlvr.commands.train import run_training as train
from rlvr.config import load_config
from rlvr.errors import UserError

pytestmark = pytest.mark.slow

ASYNC = ("distributed.backend=ray", "distributed.rollout_workers=1")


def _weights(run):
    return load_file(run / "checkpoints" / "last" / "model.safetensors")


DYNAMIC_EVAL = (
    "algo.dynamic_sampling=true", "algo.dynamic_sampling_max_batches=2", "algo.adv_method=reinforce_pp",
    "eval.at_start=true", "eval.every_steps=2", "eval.limit=5",
)  # fmt: skip
"""DAPO's dynamic sampling (extra batches drawn by the rollout worker) and evaluations (on the trainer)."""


def test_a_rollout_worker_at_staleness_0_trains_what_one_process_trains(dp_args, tmp_path):
    """The rollout worker samples every step's groups with the weights the step updates (the same
    prompts, seeds and dynamic-sampling draws as one process), and the trainer trains on them and
    evaluates: the same run, bit for bit."""
    pytest.importorskip("ray")
    one, apart = tmp_path / "one", tmp_path / "apart"
    train(load_config(None, dp_args(one, *DYNAMIC_EVAL)))
    train(load_config(None, dp_args(apart, *DYNAMIC_EVAL, *ASYNC, "rollout.max_staleness=0")))
    a, b = metrics(one, timings=False), metrics(apart, timings=False)
    assert [r["async/staleness"] for r in b] == [0.0, 0.0, 0.0]
    assert [{k: v for k, v in r.items() if not k.startswith("async/")} for r in b] == a
    assert sum(r["rollout/extra_batches"] for r in a) > 0 and "eval/accuracy" in a[1]  # both paths ran
    wa, wb = _weights(one), _weights(apart)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.extended  # the test above's path, with LoRA: the adapter's weights alone are pushed
def test_lora_pushes_the_adapter_alone_and_trains_what_one_process_trains(dp_args, tmp_path):
    """At staleness 0 every rollout after the first samples with weights pushed after the update before
    it: with LoRA the adapter alone travels, and the run is one process's, bit for bit."""
    pytest.importorskip("ray")
    one, apart = tmp_path / "one", tmp_path / "apart"
    lora = ("model.lora.rank=4", "algo.kl_coef=0.0")
    train(load_config(None, dp_args(one, *lora)))
    train(load_config(None, dp_args(apart, *lora, *ASYNC, "rollout.max_staleness=0")))
    rows = metrics(apart)
    assert rows[0]["time/weight_push_s"] == 0.0 and all(r["time/weight_push_s"] > 0 for r in rows[1:])
    a = load_file(one / "checkpoints" / "last" / "adapter_model.safetensors")
    b = load_file(apart / "checkpoints" / "last" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _killing_reward(tmp_path, at: int, run=None) -> tuple[str, ...]:
    """The `sevens` reward as a plugin that SIGKILLs the process scoring its ``at``-th call (the rollout
    worker: the trainers score nothing here), once ``run``'s checkpoint ``step_{at-2}`` is in place."""
    return killing_reward(tmp_path, at, run / "checkpoints" / f"step_{at - 2:06d}" if run else None)


def test_a_lost_rollout_worker_is_one_line_and_the_resume_is_bit_exact(dp_args, tmp_path):
    """One-step-off, 5 steps, a checkpoint each: the rollout worker is SIGKILLed while it makes step 4's
    rollout (sampled with version 2, during step 3's update). One line names the intact checkpoint; it
    holds step 3's rollout, made with version 1 and not yet trained, so the resumed run trains on it and
    ends where the uninterrupted run ends, bit for bit."""
    pytest.importorskip("ray")
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    common = (*ASYNC, "rollout.max_staleness=1", "train.steps=5", "train.save_every=1")
    train(load_config(None, dp_args(straight, *common, *_killing_reward(tmp_path, 0))))
    # one-step-off: step k+1's rollout was made with the weights step k started from (staleness 1 after the
    # first step); the update weighed tokens by the truncated importance weight (tis_cap 2 when unset); the
    # weights pushed after an update reached the worker before the rollout they serve (step 3's: version 1)
    rows = metrics(straight)
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert [r["async/queue_depth"] for r in rows] == [2.0, 2.0, 2.0, 2.0, 1.0]
    assert all("train/tis_weight_mean" in r and 0.0 <= r["async/overlap_frac"] <= 1.0 for r in rows)
    assert rows[1]["time/weight_push_s"] == 0.0 < rows[2]["time/weight_push_s"]
    killed = (*common, *_killing_reward(tmp_path, 4, cut))
    with pytest.raises(UserError) as err:
        train(load_config(None, dp_args(cut, *killed)))
    line = str(err.value)
    assert "a Ray rollout worker" in line and "step_000002 is intact" in line and "\n" not in line, line
    assert 2 <= len(metrics(cut)) <= 3
    state = torch.load(cut / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=True)
    assert [r["step"] for r in state["inflight"]] == [2] and state["inflight"][0]["version"] == 1
    _killing_reward(tmp_path, 0)
    train(load_config(None, dp_args(cut, *common, *_killing_reward(tmp_path, 0), f"resume={cut}")))
    assert metrics(cut, timings=False) == metrics(straight, timings=False)
    wa, wb = _weights(straight), _weights(cut)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
