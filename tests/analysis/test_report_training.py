"""A tiny real training run: a broken metrics sink does not stop it, and its report renders."""

from __future__ import annotations

import pytest
from tiny_run import metrics, tiny_config

from rlvr.tracking import sinks
from rlvr.training import train

pytestmark = pytest.mark.slow


def test_broken_sink_does_not_stop_training_and_the_report_renders(tiny_dir, tmp_path, monkeypatch, capsys):
    def broken(self, step, row):
        raise OSError("no space left on device")

    monkeypatch.setattr(sinks.TensorBoardSink, "write", broken)
    run_dir = tmp_path / "run"
    cfg = tiny_config(
        tiny_dir,
        run_dir,
        "rollout.samples_per_prompt=4",
        "train.prompts_per_step=2",
        "train.steps=3",
        "eval.limit=4",
        "log.tensorboard=true",
        "log.report=true",
    )
    train(cfg)
    rows = metrics(run_dir)
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
