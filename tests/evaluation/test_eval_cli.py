"""`rlvr eval | generate | chat --once | export` end to end on a tiny model and a GSM8K-shaped file,
plus evaluation inside a training run. CPU, no downloads, seconds."""

from __future__ import annotations

import json

import pytest
import tiny_run
import torch

from rlvr.cli import main
from rlvr.models.tiny import save_tiny_model
from rlvr.run_dir import RunDir

pytestmark = pytest.mark.slow

PLAIN = ["--template", "plain", "--system", "", "--max-new-tokens", "6", "--device", "cpu"]


def gsm8k_file(path, n=5, *, answers=True):
    with open(path, "w") as f:
        for i in range(n):
            row = {"question": f"what is {i} + {i} ?"}
            if answers:
                row["answer"] = f"{i} + {i} = {2 * i} #### {2 * i}"
            f.write(json.dumps(row) + "\n")
    return path


def _one_error(capsys, argv, *needles):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err


def test_eval_two_models_side_by_side(cwd, tiny_model, capsys):
    other = save_tiny_model(cwd / "other", seed=1)
    data = gsm8k_file(cwd / "gsm8k.jsonl")
    rc = main(
        [
            "eval",
            "--model",
            str(tiny_model),
            "--model",
            str(other),
            "--data",
            str(data),
            "--preset",
            "gsm8k",
            "--samples",
            "4",
            "--output",
            "out",
            *PLAIN,
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    for metric in (
        "accuracy",
        "format_rate",
        "response_len_mean",
        "truncated_frac",
        "pass@1",
        "pass@2",
        "pass@4",
        "maj@4",
    ):
        assert metric in out
    assert "m" in out and "other" in out  # one column per model
    for sub in ("m", "other"):
        summary = json.loads((cwd / "out" / sub / "summary.json").read_text())
        assert summary["n"] == 5 and summary["samples"] == 4 and 0 <= summary["pass@4"] <= 1
        preds = [json.loads(line) for line in (cwd / "out" / sub / "predictions.jsonl").read_text().splitlines()]
        assert len(preds) == 5
        assert {"prompt", "completion", "extracted", "gold", "correct"} <= preds[0].keys()
        assert preds[3]["gold"] == "6"  # '#### 6' of a GSM8K answer
        assert len(preds[0]["samples"]) == 4


def test_bad_inputs_are_one_line_errors(cwd, tiny_model, capsys):
    data = gsm8k_file(cwd / "gsm8k.jsonl")
    unlabeled = gsm8k_file(cwd / "prompts.jsonl", answers=False)
    (cwd / "alien").mkdir()
    (cwd / "alien" / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    _one_error(capsys, ["eval", "--model", "nope/missing", "--data", str(data)], "--model nope/missing", "not found")
    _one_error(capsys, ["eval", "--model", str(cwd / "alien"), "--data", str(data), *PLAIN], "could not load model")
    _one_error(
        capsys, ["eval", "--model", str(tiny_model), "--data", str(unlabeled), *PLAIN], "gold answers", "rlvr generate"
    )
    _one_error(capsys, ["eval", "--model", str(tiny_model), "--data", str(data), "--samples", "0"], "--samples 0")
    _one_error(capsys, ["eval", "--model", str(tiny_model), "--data", "nonexistent.jsonl"], "nonexistent.jsonl")
    _one_error(
        capsys,
        ["generate", "--model", str(tiny_model), "--input", str(data), "--output", "o.jsonl", "--samples", "0"],
        "--samples 0",
    )
    _one_error(capsys, ["export", "nope/missing", "--output", "x"], "not found")
    _one_error(capsys, ["chat", "--model", str(tiny_model), "--once", " "], "--once")
    _one_error(
        capsys,
        ["chat", "--model", str(tiny_model), "--template", "r1", "--once", "hi", "--device", "cpu"],
        "chat template",
    )


def test_generate_k_samples_without_answers(cwd, tiny_model, capsys):
    prompts = gsm8k_file(cwd / "prompts.jsonl", n=3, answers=False)
    rc = main(
        [
            "generate",
            "--model",
            str(tiny_model),
            "--input",
            str(prompts),
            "--output",
            "gen/out.jsonl",
            "--samples",
            "3",
            "--temperature",
            "0.9",
            "--batch",
            "2",
            *PLAIN,
        ]
    )
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (cwd / "gen" / "out.jsonl").read_text().splitlines()]
    assert [r["question"] for r in rows] == [f"what is {i} + {i} ?" for i in range(3)]
    assert all(len(r["completions"]) == 3 and len(r["truncated"]) == 3 for r in rows)


def test_chat_once_is_scriptable_and_greedy_is_deterministic(cwd, tiny_model, capsys):
    argv = ["chat", "--model", str(tiny_model), "--once", "what is 3 + 4 ?", "--temperature", "0", *PLAIN]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert first.err == "" and first.out.strip()
    assert main(argv) == 0
    assert capsys.readouterr().out == first.out


def test_chat_answers_the_same_from_packed_weights(cwd, tiny_model, capsys, monkeypatch):
    """On a CPU chat generates on oneDNN-packed weights (rlvr.cpu.packed); greedy, it says what the plain model says."""
    from rlvr.cpu import packed

    if not packed.packing_available():
        pytest.skip("this torch has no oneDNN prepacked linear")
    entered = []
    active = packed.PackedLinears.active
    monkeypatch.setattr(packed.PackedLinears, "active", lambda self: entered.append(1) or active(self))
    argv = ["chat", "--model", str(tiny_model), "--once", "what is 3 + 4 ? 7 7", "--temperature", "0", *PLAIN]
    assert main(argv) == 0
    with_packing = capsys.readouterr().out
    assert entered  # the packed path ran
    monkeypatch.setattr(packed, "packable", lambda model: False)
    assert main(argv) == 0
    assert capsys.readouterr().out == with_packing and with_packing.strip()


def test_think_part_is_dimmed():
    from io import StringIO

    from rich.console import Console

    from rlvr.commands.chat import ThinkPrinter

    console = Console(file=StringIO(), force_terminal=True, color_system="standard", width=200)
    show = ThinkPrinter(console)
    for piece in ["<think>", " 3 + 4 ", "</thi", "nk> <answer>", " 7 </answer>"]:
        show(piece)
    out = console.file.getvalue()
    assert "\x1b[2m" in out  # dim
    assert out.replace("\x1b[2m", "").replace("\x1b[0m", "") == "<think> 3 + 4 </think> <answer> 7 </answer>"
    assert out.rfind("\x1b[2m") < out.find("<answer>")  # the answer is not dimmed


def test_training_evaluates_and_export_reloads_with_identical_logits(cwd, tiny_model, capsys):
    from transformers import AutoModelForCausalLM

    from rlvr.training import train

    run = cwd / "run"
    cfg = tiny_run.tiny_config(
        tiny_model,
        run,
        *tiny_run.FORMAT_REWARD,
        "reward.workers=0",
        "rollout.max_new_tokens=6",
        "rollout.samples_per_prompt=4",
        "train.prompts_per_step=2",
        "train.steps=3",
        "eval.every_steps=2",
        "eval.limit=4",
    )
    train(cfg)
    metrics = tiny_run.metrics(run)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert "eval/accuracy" not in metrics[0] and "eval/accuracy" in metrics[1] and "eval/accuracy" in metrics[2]
    history = RunDir(run).read_eval_history()
    assert [h["step"] for h in history] == [0, 2, 3]  # at start, every 2 steps, at the end
    assert json.loads((run / "eval" / "step_000000" / "summary.json").read_text())["n"] == 4
    assert len((run / "eval" / "step_000003" / "predictions.jsonl").read_text().splitlines()) == 4

    # eval of a run directory uses its last checkpoint and its prompt settings
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--model",
                str(run),
                "--data",
                "arithmetic",
                "--limit",
                "3",
                "-o",
                "ev",
                "--device",
                "cpu",
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    summary = json.loads((cwd / "ev" / "summary.json").read_text())
    assert summary["checkpoint"].endswith("step_000003") and summary["template"] == "plain" and summary["n"] == 3

    assert main(["export", str(run), "--output", "exported"]) == 0
    out = cwd / "exported"
    for name in ("model.safetensors", "config.json", "generation_config.json", "README.md", "tokenizer.json"):
        assert (out / name).is_file(), name
    assert not (out / "trainer_state.pt").exists()
    card = (out / "README.md").read_text()
    assert "| step |" in card and "max_new_tokens: 6" in card
    ids = torch.tensor([[20, 21, 22, 3, 4, 5, 6]])
    ckpt = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "last").eval()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert torch.equal(ckpt(ids).logits, exported(ids).logits)
    assert main(["export", str(run), "--output", "half", "--dtype", "bfloat16"]) == 0
    assert AutoModelForCausalLM.from_pretrained(cwd / "half").dtype == torch.bfloat16
    capsys.readouterr()
    _one_error(capsys, ["export", str(run), "--output", "exported"], "not empty")
