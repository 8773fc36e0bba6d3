"""A LoRA run's checkpoints (an adapter, no full weights) work wherever a model is named: `rlvr eval`,
`chat`, `generate` merge the adapter into its base, and `rlvr export` writes the merged model as a
plain Hugging Face directory with base+adapter's logits. Tiny model, CPU."""

from __future__ import annotations

import json
import shutil

import pytest
import tiny_run
import torch

from rlvr.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]  # peft on transformers 5

PLAIN = ["--template", "plain", "--system", "", "--max-new-tokens", "6", "--device", "cpu", "--dtype", "float32"]


def test_a_lora_run_evaluates_chats_and_exports_merged(tmp_path, tiny_dir, monkeypatch, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlvr.training import train

    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(tiny_dir, work / "base")
    monkeypatch.chdir(work)
    run = work / "run"
    # model.path relative to where training ran; eval/export below run from another directory. The
    # `sevens` reward (tiny_dir) gives the tiny model a signal, so the adapter moves off B = 0
    train(
        tiny_run.tiny_config(
            "base",
            run,
            "reward.workers=0",
            "train.steps=3",
            "model.lora.rank=4",
            "model.lora.alpha=64",
            "algo.kl_coef=0.05",
            "eval.limit=3",
        )
    )
    assert tiny_run.metrics(run)[-1]["train/kl"] > 0  # the adapter moved the policy off the base
    ckpt = (run / "checkpoints" / "last").resolve()
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    assert json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"] == str(work / "base")
    assert [h["step"] for h in tiny_run.RunDir(run).read_eval_history()] == [0, 3]  # evaluated with the adapter on

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    for i, model in enumerate((run, ckpt)):  # a run directory and a checkpoint directory
        argv = ["eval", "--model", str(model), "--data", "arithmetic", "--limit", "3", "-o", f"ev{i}", *PLAIN]
        assert main(argv) == 0, capsys.readouterr().err
        summary = json.loads((elsewhere / f"ev{i}" / "summary.json").read_text())
        assert summary["checkpoint"].endswith("step_000003") and summary["n"] == 3

    assert main(["export", str(run), "--output", "exported"]) == 0, capsys.readouterr().err
    out = elsewhere / "exported"
    for name in ("model.safetensors", "config.json", "generation_config.json", "README.md", "tokenizer.json"):
        assert (out / name).is_file(), name
    assert not (out / "adapter_config.json").exists() and not (out / "trainer_state.pt").exists()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not any("lora_" in n for n, _ in exported.named_parameters())
    base = AutoModelForCausalLM.from_pretrained(work / "base").eval()
    ids = torch.tensor([[20, 21, 22, 3, 4, 5, 6], [9, 10, 11, 12, 13, 14, 15]])
    with torch.no_grad():
        base_logits = base(ids).logits
        with_adapter = (
            PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(work / "base"), ckpt).eval()(ids).logits
        )
        merged = exported(ids).logits
    assert torch.allclose(merged, with_adapter, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(base_logits, with_adapter, atol=1e-4)  # the adapter changed the model

    # chat of the run (adapter merged on load) answers as chat of the exported model
    capsys.readouterr()
    chat = ["chat", "--once", "what is 3 + 4 ?", "--temperature", "0", *PLAIN]
    assert main(["chat", "--model", str(run), *chat[1:]]) == 0
    from_run = capsys.readouterr().out
    assert main(["chat", "--model", str(out), *chat[1:]]) == 0
    assert capsys.readouterr().out == from_run and from_run.strip()


def test_a_lora_checkpoint_whose_base_is_gone_is_one_line_error(tmp_path, tiny_model, monkeypatch, capsys):
    from rlvr.models import load_model, lora

    ckpt = tmp_path / "adapter"
    lora.add_adapter(
        load_model(tiny_model), rank=2, alpha=4.0, dropout=0.0, target_modules=["q_proj"], base=str(tmp_path / "gone")
    ).save_pretrained(ckpt)
    shutil.copy(tiny_model / "tokenizer.json", ckpt)
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(ckpt), "--output", "out"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "base model" in err and "gone" in err, err
