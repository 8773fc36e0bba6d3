"""A tiny real training run: a broken metrics sink does not stop it, and its report renders."""

from __future__ import annotations

import json

import pytest

from rlvr.config import load_config
from rlvr.models.tiny import save_tiny_model
from rlvr.tracking import sinks
from rlvr.rewards import registry
from rlvr.training import train

pytestmark = pytest.mark.slow


def sevens(completions: list[str], labels: list[str], **fields) -> list[float]:
    """Fraction of each completion's words that are '7' (the reward of tests/integration/test_tiny_training.py)."""
    return [sum(w == "7" for w in c.split()) / max(len(c.split()), 1) for c in completions]


def test_broken_sink_does_not_stop_training_and_the_report_renders(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(registry.REWARDS, "sevens", sevens)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    model_dir = save_tiny_model(tmp_path / "tiny")

    def broken(self, step, row):
        raise OSError("no space left on device")

    monkeypatch.setattr(sinks.TensorBoardSink, "write", broken)
    run_dir = tmp_path / "run"
    cfg = load_config(None, [
        f"model.path={model_dir}", "model.device=cpu", f"run_dir={run_dir}",
        "data.template=plain", "data.system_prompt=", "data.assistant_prefix=",
        "rollout.max_new_tokens=8", "rollout.samples_per_prompt=4", "rollout.dtype=float32",
        "reward.rules=[sevens]", "reward.weights=[1.0]", "reward.accuracy_rule=sevens",
        "train.prompts_per_step=2", "train.micro_batch_seqs=8", "train.lr=1e-2", "train.steps=3",
        "eval.limit=4", "log.tensorboard=true", "log.progress=false",
    ])
    train(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["perf/peak_rss_mib"] > 10 for r in rows)
    err = capsys.readouterr().err
    assert err.count("TensorBoard logging failed (OSError: no space left on device)") == 1
    # the end-of-run summary and the report train() wrote
    assert "done: 3 steps" in err and "report: " in err
    md = (run_dir / "report" / "report.md").read_text()
    assert "complete (3 steps)" in md and "| accuracy | " in md
    html = (run_dir / "report" / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 10
