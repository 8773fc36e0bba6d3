"""benchmarks/code_runs.py end to end on a tiny model: both variants train (a step each), and the result file
holds the base model's and each run's evaluations in both modes, the step's phases and the means."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.models.tiny import save_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.extended  # a by-hand benchmark's plumbing: 2 trainings and 6 evaluations (CI's time budget)
def test_the_benchmark_runs_both_variants_on_a_tiny_model(tmp_path):
    model = save_tiny_model(tmp_path / "tiny")
    tiny = [
        "model.device=cpu", "rollout.dtype=float32", "data.template=plain", "data.system_prompt=",
        "data.assistant_prefix=", "data.train_size=16", "train.steps=1", "rollout.max_new_tokens=8",
        "reward.workers=0", "reward.sandbox=none", "log.tensorboard=false", "log.report=false", "train.save_every=0",
    ]  # fmt: skip
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "code_runs.py"), "--seeds", "0", "--model", str(model),
        "--limit", "2", "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--tag", "smoke",
        "--eval-args=--device cpu --max-new-tokens 8 --template plain", "--", *tiny,
    ]  # fmt: skip
    env = {"RLVR_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    subprocess.run(cmd, check=True, cwd=tmp_path, env=env, capture_output=True, timeout=600)
    (out,) = (tmp_path / "results").glob("code_runs-*-smoke.json")
    result = json.loads(out.read_text())
    assert set(result["base"]) == {"turns1", "turns3"} and "accuracy_first_turn" in result["base"]["turns3"]
    assert [(r["variant"], r["steps"]) for r in result["runs"]] == [("single", 1), ("feedback", 1)]
    single, feedback = result["runs"]
    assert single["turns_mean"] is None and feedback["turns_mean"] >= 1
    assert set(feedback["eval_after"]) == {"turns1", "turns3"}
    assert set(result["mean"]) == {"single", "feedback"}
