"""Data-parallel training on Ray: N workers take the update of one process with the same global batch."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import assert_same_metrics, metrics

from rlvr.commands.train import run_training as train
from rlvr.config import load_config
from rlvr.errors import UserError

pytestmark = pytest.mark.slow


@pytest.fixture
def dp_config(dp_args):
    """``dp_config(run_dir, *extra)``: the data-parallel test run's Config (overrides in conftest.py)."""
    return lambda run_dir, *extra: load_config(None, dp_args(run_dir, *extra))


DYNAMIC = ("algo.dynamic_sampling=true", "algo.dynamic_sampling_max_batches=2", "algo.adv_method=reinforce_pp")
EVAL = ("eval.at_start=true", "eval.every_steps=2", "eval.samples=2", "eval.limit=5")
"""Evaluations at steps 0 and 2, split over the workers (5 rows: 3 and 2), sampled and greedy."""


NO_KL = ("algo.kl_coef=0.0",)
"""No KL term in the loss: the groups whose advantages are all 0 run forward only, each rank its own."""


@pytest.mark.parametrize(
    "extra", [EVAL, DYNAMIC, NO_KL], ids=["grpo-eval", "dynamic-sampling-reinforce-pp", "no-kl-forward-only"]
)
def test_two_ray_workers_train_like_one_process(dp_config, tiny_model, tmp_path, extra):
    """The same update as one process; with DAPO dynamic sampling the extra batches are drawn on
    every rank's informative-group count and the kept groups dealt out, and REINFORCE++'s batch
    std is the whole step's. The evaluations, each worker evaluating a share of the rows, write what
    one process writes."""
    pytest.importorskip("ray")
    one, two = tmp_path / "one", tmp_path / "two"
    train(dp_config(one, *extra))
    train(dp_config(two, "distributed.backend=ray", "distributed.num_workers=2", *extra))

    assert_same_metrics(one, two, 3)
    a, b = metrics(one, timings=False), metrics(two, timings=False)
    # the same completions were sampled, so the rollout metrics are equal, not just close
    assert [r["rollout/reward_mean"] for r in a] == [r["rollout/reward_mean"] for r in b]
    if extra == NO_KL:  # some groups ran forward only, and some were trained
        assert 0 < sum(r["train/forward_only_frac"] for r in a) < len(a)
    if extra == DYNAMIC:  # the dynamic-sampling path ran: extra batches drawn, groups dropped
        assert sum(r["rollout/extra_batches"] for r in a) > 0 and sum(r["rollout/dropped_groups"] for r in a) > 0
    wa = load_file(one / "checkpoints" / "last" / "model.safetensors")
    wb = load_file(two / "checkpoints" / "last" / "model.safetensors")
    start = load_file(tiny_model / "model.safetensors")
    assert any(not torch.equal(wa[k], start[k]) for k in wa)  # it trained
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-6)
    samples = lambda d: (d / "samples.jsonl").read_text(encoding="utf-8").splitlines()  # noqa: E731
    assert len(samples(two)) == len(samples(one)) == 3 * 4 * 8  # every rank's samples
    if extra == EVAL:
        evals = lambda d: sorted(p.relative_to(d) for p in (d / "eval").rglob("*.j*"))  # noqa: E731
        assert evals(two) == evals(one) and len(evals(one)) == 5  # steps 0 and 2: summary, predictions; history
        for name in evals(one):
            if name.name == "predictions.jsonl":  # the same completions, in the same row order
                assert (two / name).read_text() == (one / name).read_text(), name
        assert "eval/pass@2" in a[1] and a[1]["eval/pass@2"] == b[1]["eval/pass@2"]


def test_prompts_must_split_into_whole_groups(dp_config, tmp_path):
    pytest.importorskip("ray")
    with pytest.raises(UserError, match="prompts_per_step=4 is not divisible by distributed.num_workers=3"):
        dp_config(tmp_path, "distributed.backend=ray", "distributed.num_workers=3")


@pytest.mark.extended  # Ray resumes are also run by test_ray_signals, test_two_nodes and test_fsdp
def test_a_ray_run_resumes_where_it_stopped(dp_config, tmp_path):
    """All ranks load the checkpoint; 2 steps, then resumed to 3, equal one process's 3 steps."""
    pytest.importorskip("ray")
    one, split = tmp_path / "one", tmp_path / "split"
    ray = ("distributed.backend=ray", "distributed.num_workers=2")
    train(dp_config(one))
    train(dp_config(split, *ray, "train.steps=2"))
    train(dp_config(split, *ray, f"resume={split}"))
    a, b = metrics(one, timings=False), metrics(split, timings=False)
    assert [r["step"] for r in b] == [1, 2, 3]
    assert [r["rollout/reward_mean"] for r in a] == [r["rollout/reward_mean"] for r in b]
    for row_a, row_b in zip(a, b):
        assert row_b == pytest.approx(row_a, rel=1e-4, abs=1e-6)
    wa = load_file(one / "checkpoints" / "last" / "model.safetensors")
    wb = load_file(split / "checkpoints" / "last" / "model.safetensors")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k])
