"""rlvr's Python API (rlvr.api, docs/python-api.md): train and evaluate as the commands run them, in a
child process with the command's environment; mistakes raise rlvr.UserError, never SystemExit."""

from __future__ import annotations

import pytest
from tiny_run import FORMAT_REWARD

import rlvr
from rlvr.api import _overrides
from rlvr.models.tiny import save_tiny_model

pytestmark = pytest.mark.slow

TINY = {
    "model.device": "cpu",
    "data.template": "plain",
    "data.system_prompt": "",
    "data.assistant_prefix": "",
    "rollout.max_new_tokens": 4,
    "rollout.samples_per_prompt": 2,
    "rollout.dtype": "float32",
    "model.autocast_bf16": False,
    "train.prompts_per_step": 2,
    "train.micro_batch_seqs": 4,
    "eval.limit": 2,
    "log.tensorboard": False,
    "log.progress": False,
    **dict(o.split("=", 1) for o in FORMAT_REWARD),
}


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_overrides_from_python_values():
    texts = _overrides({"reward.rules": ["accuracy", "format"], "data.system_prompt": ""}, {"train__steps": 2})
    assert texts == ['reward.rules=["accuracy", "format"]', "data.system_prompt=", "train.steps=2"]
    assert _overrides(None, {"log__wandb": False, "resume": None, "train__lr": 1e-5}) == [
        "log.wandb=false",
        "resume=null",
        "train.lr=1e-05",
    ]


def test_train_then_evaluate(here):
    model = save_tiny_model(here / "tiny")
    run = rlvr.train(None, {**TINY, "model.path": str(model)}, train__steps=2)
    assert isinstance(run, rlvr.Run) and run.path == (here / "runs" / "quickstart").resolve()
    assert [m["step"] for m in run.metrics] == [1, 2] and run.complete and run.checkpoints[-1] == 2
    assert run.series("rollout/reward_mean")[0] == [1, 2]
    assert (run.path / "report" / "report.md").is_file()
    again = rlvr.train(None, {**TINY, "model.path": str(model)}, train__steps=1)  # a folder of its own
    assert again.path.name == "quickstart-2" and len(again.metrics) == 1
    summary = rlvr.evaluate(run.path, "arithmetic", limit=4, output=here / "ev")
    assert summary["n"] == 4 and 0 <= summary["accuracy"] <= 1 and summary["output"] == str(here / "ev")


def test_mistakes_raise_user_error_not_system_exit(here):
    with pytest.raises(rlvr.UserError, match="unknown config key 'train.stpes'"):
        rlvr.train(None, train__stpes=2)  # found here, before anything starts
    with pytest.raises(rlvr.UserError, match="model.path=no/such-model-here"):
        rlvr.train(None, {**TINY, "model.path": "no/such-model-here"}, train__steps=1)  # found by the child
    with pytest.raises(rlvr.UserError, match="missing.jsonl"):
        rlvr.evaluate(save_tiny_model(here / "tiny"), here / "missing.jsonl", limit=1)
