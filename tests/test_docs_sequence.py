"""The docs' training commands, typed in the order a reader meets them, in one folder: the README's
`rlvr train` (what `make quickstart` runs), then docs/data.md's own-data command, then the quickstart
again. Each must train, in a folder of its own (the own-data command used to stop on
"runs/quickstart already holds a run"). The commands are read from the pages, so a page that drops
or changes them fails here; the tiny model and a few short steps are appended to each."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from tiny_run import FORMAT_REWARD

from rlvr.cli import main
from rlvr.models.tiny import save_tiny_model
from rlvr.run_dir import RunDir

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TINY = (
    "model.device=cpu",
    "data.template=plain",
    "data.system_prompt=",
    "data.assistant_prefix=",
    "rollout.max_new_tokens=4",
    "rollout.samples_per_prompt=2",
    "rollout.dtype=float32",
    "model.autocast_bf16=false",
    *FORMAT_REWARD,
    "train.prompts_per_step=2",
    "train.micro_batch_seqs=4",
    "train.steps=1",
    "eval.limit=2",
    "log.tensorboard=false",
    "log.progress=false",
    "log.report=false",
)


def _command(page: str, pattern: str) -> list[str]:
    """The argv after ``rlvr`` of the command that ``pattern``'s group ``cmd`` matches first in ``page``."""
    m = re.search(pattern, (REPO / page).read_text(encoding="utf-8"), re.MULTILINE)
    assert m is not None, f"{page} has no command matching {pattern}"
    return m.group("cmd").split()[1:]


def test_the_docs_training_commands_in_sequence(tmp_path, monkeypatch, capsys):
    quickstart = _command("README.md", r"`make quickstart` is `(?P<cmd>rlvr train)` with no arguments")
    own_data = _command("docs/data.md", r"^(?P<cmd>rlvr train data\.task=files data\.path=examples/gsm8k_train[^#\n]*)")
    assert quickstart == ["train"] and "data.path=examples/gsm8k_train.jsonl" in own_data
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    model = save_tiny_model(tmp_path / "tiny")
    tiny = [f"model.path={model}", *TINY]
    steps = [
        (quickstart, "runs/quickstart"),
        (own_data, "runs/gsm8k_train"),
        (quickstart, "runs/quickstart-2"),
        (own_data, "runs/gsm8k_train-2"),
    ]
    for argv, folder in steps:
        rc = main([*argv, *tiny])
        err = capsys.readouterr().err
        assert rc == 0, err[-2000:]
        assert len(RunDir(tmp_path / folder).read_metrics()) == 1, f"{argv}: nothing trained in {folder}"
        assert f"new run {folder}:" in err
        if folder.endswith("-2"):  # says why, and how to continue the other one
            assert f"{folder}, as {folder[:-2]} holds an earlier run (resume={folder[:-2]} continues that one)" in err
    # named folders are the user's: still refused, with the ways out
    assert main([*quickstart, *tiny, "run_dir=runs/quickstart"]) == 2
    assert "already holds a run" in capsys.readouterr().err
