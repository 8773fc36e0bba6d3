"""A resume never rewrites a run: a refused or empty resume leaves every file of the run byte for
byte as it was; one that trains records its own config in RUN/resumes/ and config.yaml stays the
config the run started with. And a bad input is the first thing `rlvr train` prints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from tiny_run import metrics, tiny_args, tiny_config

from rlvr import cli
from rlvr.analysis.report import resume_lines
from rlvr.analysis.run import load_run
from rlvr.errors import UserError
from rlvr.run_dir import RunDir
from rlvr.training import preflight, train

pytestmark = pytest.mark.slow


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file's bytes and every link's target under ``root``, by relative path."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_bytes()
    return out


@pytest.fixture
def finished(tiny_dir, tmp_path):
    """A finished 2-step run with a checkpoint after each step."""
    run = tmp_path / "run"
    train(tiny_config(tiny_dir, run, "train.steps=2", "train.save_every=1", "train.keep_checkpoints=0"))
    return run


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """Rich wraps lines at 80 columns on a console that is not a terminal; these tests read whole lines."""
    monkeypatch.setenv("COLUMNS", "1000")


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(["train", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_refused_resume_leaves_the_run_byte_identical(finished, capsys):
    before = snapshot(finished)
    code, out, err = _cli([f"resume={finished}", "model.lora.rank=8"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: resume=") and "holds full weights but model.lora.rank=8" in err
    assert snapshot(finished) == before
    # and the plain resume is not poisoned by the refused one: it gets as far as "nothing to do"
    code, out, err = _cli([f"resume={finished}"], capsys)
    assert code == 0 and "already finished 2 steps" in err
    assert snapshot(finished) == before


def test_empty_resume_with_fewer_steps_changes_nothing(finished, capsys):
    before = snapshot(finished)
    code, _, err = _cli([f"resume={finished}", "train.steps=1"], capsys)
    assert code == 0 and "already finished 2 steps (train.steps=1); nothing to do" in err
    assert snapshot(finished) == before
    assert load_run(finished).config["train"]["steps"] == 2  # what the report reads


def test_resume_into_another_run_dir_is_one_line(finished, tmp_path, capsys):
    before = snapshot(finished)
    other = tmp_path / "other"
    code, out, err = _cli([f"resume={finished}", f"run_dir={other}", "train.steps=3"], capsys)
    assert code == 2 and out == ""
    assert f"run_dir={other} would be ignored" in err and "--config" in err
    assert snapshot(finished) == before and not other.exists()
    # the run's own directory, spelt another way, is no conflict
    code, _, _ = _cli([f"resume={finished}", f"run_dir={finished}/../run", "train.steps=2"], capsys)
    assert code == 0


def test_a_resume_that_trains_keeps_each_segment_config(finished, tmp_path, capsys):
    original = (finished / "config.yaml").read_bytes()
    code, _, err = _cli([f"resume={finished}", "train.steps=3", "train.lr=5e-3"], capsys)
    assert code == 0, err
    assert (finished / "config.yaml").read_bytes() == original  # the config the run started with
    segment = RunDir(finished).resume_config_file(2)
    saved = yaml.safe_load(segment.read_text())
    assert saved["train"]["steps"] == 3 and saved["train"]["lr"] == 5e-3
    assert saved["resume"] is None and saved["run_dir"] == str(finished)  # settings, so it can start a new run
    assert [r["step"] for r in metrics(finished)] == [1, 2, 3]
    assert load_run(finished).config["train"]["steps"] == 3  # the report reads the current config
    (line,) = resume_lines(finished)
    assert line.startswith("Resumed after step 2 with ") and "train.steps 2 -> 3, train.lr 0.01 -> 0.005" in line
    # a plain resume starts from the last segment's config (train.lr=5e-3), not from config.yaml
    code, _, err = _cli([f"resume={finished}", "train.steps=4"], capsys)
    assert code == 0, err
    latest = yaml.safe_load(RunDir(finished).resume_config_file(3).read_text())
    assert latest["train"]["lr"] == 5e-3 and latest["train"]["steps"] == 4
    assert [p.name for p in RunDir(finished).resume_config_files()] == ["step_000002.yaml", "step_000003.yaml"]


def test_overwrite_removes_the_resume_history(finished, tiny_dir, capsys):
    train(tiny_config(tiny_dir, finished, f"resume={finished}", "train.steps=3"))
    assert RunDir(finished).resume_config_files()
    train(tiny_config(tiny_dir, finished, "train.steps=1", "overwrite=true"))
    assert RunDir(finished).resume_config_files() == []


def test_errors_come_before_anything_is_printed(finished, tiny_dir, tmp_path, capsys):
    args = tiny_args(tiny_dir, finished, "train.steps=1")
    code, out, err = _cli(args, capsys)
    assert (code, out) == (2, "") and err.startswith("error: ") and "already holds a run" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1", "answer": "2"}\n{"question": \n')
    code, out, err = _cli(tiny_args(tiny_dir, tmp_path / "new", "data.task=files", f"data.path={bad}"), capsys)
    assert (code, out) == (2, "") and err.startswith("error: ") and "bad.jsonl" in err
    code, out, err = _cli(tiny_args(tmp_path / "no_model", tmp_path / "new"), capsys)
    assert (code, out) == (2, "") and err.startswith("error: ")
    assert not (tmp_path / "new").exists()


def test_misspelt_rule_is_named_before_the_weights_count(capsys):
    code = cli.main(["config", "reward.rules=[acuracy]"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown reward 'acuracy'; did you mean 'accuracy'" in err


def test_summary_then_notes_then_training(tiny_dir, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"question": "q{i}", "answer": "7"}}\n' for i in range(8)))
    run = tmp_path / "run"
    code, out, err = _cli(tiny_args(tiny_dir, run, "train.steps=1", "data.task=files", f"data.path={data}"), capsys)
    assert code == 0, err
    assert err.splitlines()[0] == f"new run {run}: the full config goes to {run / 'config.yaml'}"
    assert "note: no evaluation in this run" in err and "data.test_path=" in err
    assert "resolved config" not in out + err  # only with --print-config
    code, out, err = _cli([f"resume={run}", "train.steps=2", "--print-config"], capsys)
    assert code == 0 and "resolved config" in err and err.startswith(f"resuming {run} from step_")


def test_load_warning(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.3, 0.3, 0.3))
    assert preflight._load_note() == []
    monkeypatch.setattr(os, "getloadavg", lambda: (2.4, 2.0, 1.0))
    (line,) = preflight._load_note()
    assert line.startswith("warning: the load average is 2.4 on 2 cores") and "OMP_NUM_THREADS" in line


def test_preflight_writes_nothing(tiny_dir, tmp_path):
    checked = preflight.preflight(tiny_config(tiny_dir, tmp_path / "new" / "run"))
    assert checked.start_step == 0 and checked.resume_from is None
    assert not (tmp_path / "new").exists()


def test_a_run_being_trained_is_not_trained_twice(finished, capsys):
    held = RunDir(finished).lock()  # as the process that trains it holds it
    try:
        before = snapshot(finished)
        code, out, err = _cli([f"resume={finished}", "train.steps=3"], capsys)
        assert code == 2 and out == ""
        assert f"is being trained by another process (pid {os.getpid()}) right now" in err
        assert snapshot(finished) == before
    finally:
        held.close()
    code, _, err = _cli([f"resume={finished}", "train.steps=3"], capsys)
    assert code == 0, err


def test_the_summary_says_when_evaluation_is_off(tiny_dir, tmp_path):
    from tiny_run import tiny_config

    from rlvr.training.preflight import preflight, summary_lines

    off = ["eval.at_start=false", "eval.at_end=false", "eval.every_steps=0"]

    def data_line(run, *extra):
        return next(line for line in summary_lines(preflight(tiny_config(tiny_dir, run, *extra))) if "data " in line)

    off_line = data_line(tmp_path / "a", *off)
    assert "no evaluation (eval.at_start, eval.at_end and eval.every_steps are off)" in off_line
    assert "evaluated on" not in off_line and "evaluated on" in data_line(tmp_path / "b")


def test_wandb_missing_is_one_line_before_anything_loads(tiny_dir, tmp_path, monkeypatch):
    from tiny_run import tiny_config

    from rlvr.tracking import sinks
    from rlvr.training import preflight as pf

    monkeypatch.setattr(sinks, "wandb_available", lambda: False)
    monkeypatch.setattr(pf, "load_split", lambda *a, **k: pytest.fail("data loaded before the wandb check"))
    with pytest.raises(UserError, match="log.wandb=true but the wandb package is not installed; `pip install wandb`"):
        pf.preflight(tiny_config(tiny_dir, tmp_path / "run", "log.wandb=true"))
