"""Training with tools on a tiny model: the tool metrics and samples are written, and a resumed run
is bit-exact (the continuations' seeds come from the rows' seeds)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from tiny_run import metrics, tiny_config

from rlvr import metric_names as M
from rlvr.analysis.report import build_report
from rlvr.cli import main
from rlvr.training import train

TOOLS = (
    "rollout.tools=[calculator]",
    "rollout.tool_call== {args} ?",  # words of the tiny vocabulary
    "rollout.tool_result=the {output} answer",
    "rollout.max_new_tokens=16",
    "reward.workers=0",
)


def test_a_tool_run_logs_tool_use_and_resumes_bit_exact(tiny_dir, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(tiny_config(tiny_dir, straight, *TOOLS, "train.steps=3", "train.save_every=1", "train.keep_checkpoints=0"))
    train(tiny_config(tiny_dir, split, *TOOLS, "train.steps=1"))
    train(tiny_config(tiny_dir, split, *TOOLS, "train.steps=3", f"resume={split}"))
    a = load_file(straight / "checkpoints" / "step_000003" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_000003" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = metrics(straight)
    assert all(M.TOOL_CALLS_MEAN in r and M.TOOL_ERROR_RATE in r for r in rows)
    assert sum(r[M.TOOL_CALLS_MEAN] for r in rows) > 0, "the tiny model must call to test anything"
    assert [r[M.TOOL_CALLS_MEAN] for r in rows] == [r[M.TOOL_CALLS_MEAN] for r in metrics(split)]
    samples = [json.loads(line) for line in (straight / "samples.jsonl").read_text().splitlines()]
    assert all("tool_calls" in s for s in samples)
    called = [s for s in samples if s["tool_calls"]]
    assert called and all("?the" in s["completion"] for s in called)
    report = (build_report(straight) / "report.md").read_text()
    assert "## Tool use" in report and "tool calls per completion" in report and "1 tool call(s)" in report


def test_eval_of_a_tool_run_uses_its_tools_and_syntax(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config(tiny_dir, run, *TOOLS, "train.steps=1"))
    data = tmp_path / "q.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"what is {i} + 1 ?", "answer": str(i + 1)}) + "\n" for i in range(8))
    )
    argv = ["eval", "--model", str(run), "--data", str(data), "-k", "4", "-o", str(tmp_path / "ev"), "--device", "cpu"]
    assert main(argv) == 0
    assert "tools: calculator; call one as = 12*34 ?" in capsys.readouterr().err
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert {"tool_calls_mean", "tool_use_rate", "tool_error_rate"} <= summary.keys()
