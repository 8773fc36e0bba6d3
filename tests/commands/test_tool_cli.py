"""`rlvr eval | generate | chat --once --tools` on a tiny model: the tool loop runs, the outputs count
the calls, and a bad tool name is one line."""

from __future__ import annotations

import json

import pytest

from rlvr.cli import main

pytestmark = pytest.mark.slow

PLAIN = ["--template", "plain", "--system", "", "--max-new-tokens", "6", "--device", "cpu"]


def _data(path):
    path.write_text(
        "".join(json.dumps({"question": f"what is {i} + {i} ?", "answer": str(2 * i)}) + "\n" for i in range(3))
    )
    return path


def test_eval_generate_and_chat_take_tools(cwd, tiny_model, capsys):
    data = _data(cwd / "q.jsonl")
    assert (
        main(["eval", "--model", str(tiny_model), "--data", str(data), "--tools", "calculator", "-o", "ev", *PLAIN])
        == 0
    )
    out = capsys.readouterr()
    assert "tools: calculator; call one as <tool>calculator: 12*34</tool>" in out.err
    assert "tool_calls_mean" in out.out
    summary = json.loads((cwd / "ev" / "summary.json").read_text())
    assert summary["tool_calls_mean"] == 0 and summary["tool_error_rate"] == 0
    preds = [json.loads(line) for line in (cwd / "ev" / "predictions.jsonl").read_text().splitlines()]
    assert all(p["tool_calls"] == 0 for p in preds)

    argv = [
        "generate",
        "--model",
        str(tiny_model),
        "-i",
        str(data),
        "-o",
        "gen.jsonl",
        "-k",
        "2",
        "--tools",
        "calculator",
    ]
    assert main([*argv, *PLAIN]) == 0
    rows = [json.loads(line) for line in (cwd / "gen.jsonl").read_text().splitlines()]
    assert all(r["tool_calls"] == [0, 0] for r in rows)
    capsys.readouterr()

    assert main(["chat", "--model", str(tiny_model), "--once", "what is 2 + 2 ?", "--tools", "calculator", *PLAIN]) == 0
    out = capsys.readouterr()
    assert out.out.strip()
    assert "note: --tools calculator, but the prompt (template plain) does not describe it" in out.err
    assert "--template r1_tool" in out.err and "note:" not in out.out  # stdout is the answer alone
    tool = [*PLAIN, "--system", "Use the calculator when you multiply."]  # a prompt that names it: no note
    assert main(["chat", "--model", str(tiny_model), "--once", "what is 2 + 2 ?", "--tools", "calculator", *tool]) == 0
    assert "note:" not in capsys.readouterr().err


def test_chat_without_a_model_offers_the_built_in_one(monkeypatch, capsys):
    from rlvr.commands import chat
    from rlvr.evaluation import loading

    seen = []

    def resolve(spec):  # stop before any model loads: what chat asked for is the test
        seen.append(spec)
        raise chat.UserError("stop here")

    monkeypatch.setattr(loading, "resolve", resolve)
    assert main(["chat", "--once", "hi"]) == 2
    assert seen == ["smollm2-135m-instruct"]
    assert "no --model: chatting with the built-in smollm2-135m-instruct" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["eval", "generate", "chat"])
def test_an_unknown_tool_is_one_line(cwd, tiny_model, capsys, command):
    data = _data(cwd / "q.jsonl")
    extra = {"eval": ["--data", str(data)], "generate": ["-i", str(data)], "chat": ["--once", "hi"]}[command]
    rc = main([command, "--model", str(tiny_model), *extra, "--tools", "calculater", *PLAIN])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "unknown tool 'calculater'" in err and "did you mean 'calculator'" in err


def test_generate_runs_code_feedback_episodes_and_chat_refuses_them(cwd, tiny_model, capsys, monkeypatch):
    """`rlvr generate --max-turns 2` on rows that carry tests: the episodes run (each row says its turns);
    chat has no tests, so `--max-turns` there is one line; with tools, one line too."""
    monkeypatch.setenv("RLVR_SANDBOX", "none")
    tests = {"kind": "call", "fn_name": "f", "cases": [{"args": [1], "expected": 2}]}
    rows = [{"question": f"what is {i} + {i} ?", "tests": tests} for i in range(2)]
    (cwd / "code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["generate", "--model", str(tiny_model), "-i", "code.jsonl", "-o", "gen.jsonl", "--max-turns", "2"]
    assert main([*argv, *PLAIN, "--max-new-tokens", "40", "--stop", "?", "--temperature", "0"]) == 0
    assert "code episodes with execution feedback, up to 2 turns" in capsys.readouterr().err
    out = [json.loads(line) for line in (cwd / "gen.jsonl").read_text().splitlines()]
    assert all(len(r["turns"]) == 1 and r["turns"][0] in (1, 2) for r in out)
    assert any(r["turns"] == [2] for r in out), out  # a turn ended on "?" and got the feedback
    assert main(["chat", "--model", str(tiny_model), "--once", "hi", "--max-turns", "3", *PLAIN]) == 2
    assert "a chat has none; use rlvr eval --max-turns" in capsys.readouterr().err
    assert main([*argv, *PLAIN, "--tools", "calculator"]) == 2
    assert "one rollout runs one environment" in capsys.readouterr().err
