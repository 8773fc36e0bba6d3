"""Training with environments on a tiny model: a plugin environment's reward weighs into the total
(reward.env_weight), the per-turn discount scales it (rollout.turn_discount), samples.jsonl shows the
turns, a resumed run is bit-exact; code with execution feedback trains and evaluates in episodes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import metrics, tiny_config

from rlvr import metric_names as M
from rlvr.analysis.report import build_report
from rlvr.errors import UserError
from rlvr.training import train

PLUGIN = '''
from rlvr.environments import Environment, Step


class TwoTurns(Environment):
    """A word of the tiny vocabulary after the first turn; a reward of 1 after the second."""

    def step(self, turn):
        if turn.index == 0:
            return Step(observation=" 7 ", done=False)
        return Step(reward=1.0, done=True)
'''


def _env(tmp_path) -> tuple[str, ...]:
    plugin = tmp_path / "two_turns.py"
    plugin.write_text(PLUGIN)
    return (
        f"rollout.environment={plugin}:TwoTurns", "rollout.max_turns=2", "rollout.max_new_tokens=16",
        "reward.env_weight=2.0", "rollout.turn_discount=0.5", "log.samples_every=1", "rollout.stop=[the, and, is]",
    )  # fmt: skip


def test_a_plugin_environment_trains_with_its_reward_discounted_and_resumes_bit_exact(tiny_dir, tmp_path):
    env = _env(tmp_path)
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(tiny_config(tiny_dir, straight, *env, "train.steps=2", "train.save_every=1", "train.keep_checkpoints=0"))
    train(tiny_config(tiny_dir, split, *env, "train.steps=1"))
    train(tiny_config(tiny_dir, split, *env, "train.steps=2", f"resume={split}"))
    a = load_file(straight / "checkpoints" / "step_000002" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_000002" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    samples = [json.loads(line) for line in (straight / "samples.jsonl").read_text().splitlines()]
    two = [s for s in samples if s["turns"] == 2 and not s["truncated"]]
    assert two, "the tiny model must end a turn within the budget to test anything"
    for s in samples:
        env_reward = 1.0 if s in two else 0.0
        assert s["rewards"]["env"] == env_reward
        want = (s["rewards"]["sevens"] + 2.0 * env_reward) * 0.5 ** (s["turns"] - 1)
        assert s["reward"] == pytest.approx(want)
    for row in metrics(straight):
        assert M.reward_mean("env") in row and M.TURNS_MEAN in row


def test_code_feedback_trains_and_evaluates_in_episodes(tiny_dir, tmp_path):
    run = tmp_path / "code"
    code = (
        "data.task=code", "data.test_size=4", "rollout.max_turns=2", "rollout.max_new_tokens=96",
        "rollout.stop=[the, and, is]",
        "reward.rules=[code_tests_frac]", "reward.weights=[1.0]", "reward.accuracy_rule=code_tests",
        "reward.sandbox=none", "reward.workers=0", "eval.every_steps=1", "eval.limit=4", "train.steps=1",
        "log.samples_every=1",
    )  # fmt: skip
    train(tiny_config(tiny_dir, run, *code))
    (row,) = metrics(run)
    assert row[M.TURNS_MEAN] > 1  # the tiny model writes no code: "I found no code" comes back
    history = [json.loads(line) for line in (run / "eval" / "history.jsonl").read_text().splitlines()]
    assert all("eval/turns_mean" in h and "eval/accuracy_first_turn" in h for h in history)
    predictions = (run / "eval" / "step_000001" / "predictions.jsonl").read_text().splitlines()
    assert all("turns" in json.loads(p) for p in predictions)  # the greedy answers are episodes too
    report = (build_report(run) / "report.md").read_text()
    assert "## Episodes" in report and "turns per episode went from" in report and " 2 turns" in report


def test_feedback_without_tests_is_refused_in_one_line(tiny_dir, tmp_path):
    with pytest.raises(UserError, match="no training row has tests"):
        train(tiny_config(tiny_dir, tmp_path / "run", "rollout.max_turns=3", "train.steps=1"))
