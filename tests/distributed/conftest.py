"""The data-parallel test run: the tiny run with the `sevens` reward as a plugin file (Ray workers and
`rlvr train` subprocesses are other processes, where the test's reward registry is not)."""

from __future__ import annotations

import pytest
from tiny_run import tiny_args

SEVENS = """
def sevens(completions, labels, **fields):
    return [sum(w == "7" for w in c.split()) / max(len(c.split()), 1) for c in completions]
"""


@pytest.fixture
def sevens_file(tmp_path):
    """The `sevens` reward as a plugin file."""
    path = tmp_path / "sevens_reward.py"
    path.write_text(SEVENS, encoding="utf-8")
    return path


@pytest.fixture
def dp_args(tiny_model, sevens_file):
    """``dp_args(run_dir, *extra)``: the overrides of the tiny model's 3-step run writing to ``run_dir``,
    then ``extra``."""
    rule = f"{sevens_file}:sevens"

    def args(run_dir, *extra: str) -> list[str]:
        return tiny_args(
            tiny_model,
            run_dir,
            f"reward.rules=[{rule}]",
            f"reward.accuracy_rule={rule}",
            "reward.workers=0",
            "eval.at_start=false",
            "eval.at_end=false",
            "train.steps=3",
            "train.micro_batch_seqs=4",
            "algo.kl_coef=0.01",
            "algo.num_iterations=2",
            "model.autocast_bf16=false",
            *extra,
        )

    return args
