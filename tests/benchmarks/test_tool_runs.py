"""benchmarks/tool_runs.py end to end on a tiny model: both presets run (a step each), and the result file
holds each run's summary, its evaluation curve and the means per preset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.models.tiny import save_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.extended  # CI: test_code_runs runs the same harness (code_runs.py imports tool_runs' helpers)
def test_the_benchmark_runs_both_presets_on_a_tiny_model(tmp_path):
    model = save_tiny_model(tmp_path / "tiny")
    tiny = [
        f"model.path={model}", "model.device=cpu", "rollout.dtype=float32", "data.template=plain",
        "data.system_prompt=", "data.assistant_prefix=", "data.train_size=16", "eval.limit=2", "train.steps=2",
        "rollout.max_new_tokens=8", "reward.workers=0", "log.tensorboard=false", "log.report=false",
        "train.save_every=0",
    ]  # fmt: skip
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "tool_runs.py"), "--seeds", "0", "--eval-every", "1",
        "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--tag", "smoke", "--", *tiny,
    ]  # fmt: skip
    env = {"RLVR_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    subprocess.run(cmd, check=True, cwd=tmp_path, env=env, capture_output=True, timeout=600)
    (out,) = (tmp_path / "results").glob("tool_runs-*-smoke.json")
    result = json.loads(out.read_text())
    assert [(r["preset"], r["steps"]) for r in result["runs"]] == [
        ("arithmetic_tool", 2),
        ("arithmetic_tool_control", 2),
    ]
    tool, control = result["runs"]
    assert "tool_calls_mean" in tool["eval_after"] and "tool_calls_mean" not in control["eval_after"]
    assert [p["step"] for p in tool["eval_curve"]] == [0, 1, 2]
    # arithmetic_tool's problems are all products: every held-out row is of the kind that needs the tool
    assert tool["eval_by_kind_after"]["needs_tool"]["n"] == 2 and "no_tool" not in tool["eval_by_kind_after"]
    assert set(result["mean"]) == {"arithmetic_tool", "arithmetic_tool_control"}
