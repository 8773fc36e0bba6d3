"""Where eval, generate and export write without --output (runs/COMMAND/..., beside the training runs and
ignored by git), and their --help showing each flag's default. CPU, no downloads, seconds."""

from __future__ import annotations

import json

import pytest

from rlvr.cli import main

pytestmark = pytest.mark.slow

PLAIN = ["--template", "plain", "--system", "", "--max-new-tokens", "4", "--device", "cpu"]


def _questions(path, *, answers: bool):
    rows = [{"question": f"what is {i} + {i} ?", **({"answer": f"#### {2 * i}"} if answers else {})} for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_outputs_go_under_runs(cwd, tiny_model, capsys):
    data = _questions(cwd / "gsm8k_test.jsonl", answers=True)
    assert main(["eval", "--model", str(tiny_model), "--data", str(data), "--preset", "gsm8k", *PLAIN]) == 0
    [folder] = (cwd / "runs" / "eval").iterdir()
    assert folder.name.startswith("gsm8k_test-") and (folder / "summary.json").is_file()

    prompts = _questions(cwd / "prompts.jsonl", answers=False)
    assert main(["generate", "--model", str(tiny_model), "--input", str(prompts), *PLAIN]) == 0
    [written] = (cwd / "runs" / "generate").iterdir()
    assert written.name.startswith("prompts-") and written.suffix == ".jsonl"
    assert len(written.read_text().splitlines()) == 2

    assert main(["export", str(tiny_model)]) == 0
    assert (cwd / "runs" / "export" / tiny_model.name / "model.safetensors").is_file()
    capsys.readouterr()
    assert main(["export", str(tiny_model)]) == 2  # never over an earlier export
    assert "exists and is not empty" in capsys.readouterr().err
    assert {p.name for p in cwd.iterdir()} - {"cache"} == {"gsm8k_test.jsonl", "prompts.jsonl", "runs"}


@pytest.mark.parametrize(
    ("command", "defaults"),
    [
        (
            "eval",
            ["--difficulty DIFFICULTY arithmetic difficulty 1..4 (default: 1)", "(default: 64)", "(default: 1.0)"],
        ),
        ("generate", ["(default: 32)", "(0 = off; default: 0)", "(default: runs/generate/INPUT-TIME.jsonl)"]),
        ("chat", ["(0 = greedy; default: 0.7)", "sampling seed (default: 0)"]),
        ("export", ["weight dtype (default: float32)", "(default: runs/export/RUN,"]),
    ],
)
def test_help_shows_defaults(command, defaults, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for default in defaults:
        assert default in text
    assert "(default: None)" not in text and "%(default)" not in text
