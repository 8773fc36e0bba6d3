"""RunDir: a run's layout, finding its checkpoints, and its JSONL files (one reader, one writer)."""

import json
import os

import pytest
import torch

from rlvr.errors import UserError
from rlvr.jsonl import JsonlWriter, parse_lines, read_jsonl, truncate_jsonl
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.run_dir import OUTPUTS, RunDir, is_checkpoint, step_name, step_of
from rlvr.training.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _model(seed=0):
    return tiny_model(seed=seed, layers=1, hidden=16)


def _fake_checkpoint(run_dir, name, *, state=True):
    """A step directory as save_checkpoint leaves it (weights config + trainer state), or a torn one."""
    d = run_dir / "checkpoints" / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    if state:
        (d / "trainer_state.pt").write_bytes(b"x")
    return d


# -- layout ----------------------------------------------------------------------------------


def test_layout(tmp_path):
    run = RunDir(str(tmp_path / "r"))  # a str is taken as a path
    r = tmp_path / "r"
    assert run.path == r
    assert run.config_file == r / "config.yaml"
    assert run.metrics_file == r / "metrics.jsonl"
    assert run.samples_file == r / "samples.jsonl"
    assert run.eval_dir(20) == r / "eval" / "step_000020"
    assert run.eval_history_file == r / "eval" / "history.jsonl"
    assert run.checkpoint_dir(20) == r / "checkpoints" / "step_000020"
    assert run.checkpoint_dir(1234567) == r / "checkpoints" / "step_1234567"
    assert run.last_link == r / "checkpoints" / "last"
    assert (run.tensorboard_dir, run.wandb_dir, run.report_dir) == (r / "tensorboard", r / "wandb", r / "report")
    assert RunDir(r) == run  # frozen, compares by path
    with pytest.raises(AttributeError):
        run.path = tmp_path


def test_step_names_round_trip():
    assert step_name(0) == "step_000000" and step_name(20) == "step_000020"
    assert step_of(step_name(20)) == 20 and step_of("step_1234567") == 1234567
    for other in ("last", "step_20", ".step_000020.tmp-42", "step_000020.old", "history.jsonl"):
        assert step_of(other) is None


def test_save_checkpoint_writes_where_run_dir_says(tmp_path, tok):
    run = RunDir(tmp_path)
    path = save_checkpoint(tmp_path, 3, _model(), tok, {"step": 3})
    assert path == run.checkpoint_dir(3) and is_checkpoint(path)
    assert run.last_link.resolve() == path.resolve()
    assert run.checkpoints() == [path]


def test_of_checkpoint(tmp_path):
    ckpt = _fake_checkpoint(tmp_path, "step_000004")
    assert RunDir.of_checkpoint(ckpt) == RunDir(tmp_path)
    assert RunDir.of_checkpoint(tmp_path / "exported") is None  # a loose model directory


def test_is_run_and_read_config(tmp_path):
    run = RunDir(tmp_path)
    assert not run.is_run() and run.read_config() is None
    run.metrics_file.write_text("")
    assert run.is_run()
    run.metrics_file.unlink()
    run.config_file.write_text("train:\n  steps: 5\n")
    assert run.is_run() and run.read_config() == {"train": {"steps": 5}}
    run.config_file.write_text("")
    assert run.read_config() == {}  # readable, but not a mapping
    run.config_file.write_text("- a\n- b\n")
    assert run.read_config() == {}
    run.config_file.write_text("train: [unclosed\n")
    assert run.read_config() is None  # does not parse
    run.config_file.write_bytes(b"train: \xff\xfe\n")
    assert run.read_config() is None  # not UTF-8


def test_remove_outputs_keeps_config_and_what_it_is_told(tmp_path):
    run = RunDir(tmp_path)
    run.config_file.write_text("seed: 1\n")
    run.metrics_file.write_text("{}\n")
    run.samples_file.write_text("{}\n")
    run.eval_dir(0).mkdir(parents=True)
    _fake_checkpoint(tmp_path, "step_000001")
    run.report_dir.mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    run.remove_outputs(keep=("checkpoints",))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "config.yaml", "notes.txt"]
    run.remove_outputs()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "notes.txt"]
    assert "checkpoints" in OUTPUTS and "config.yaml" not in OUTPUTS


# -- finding checkpoints -----------------------------------------------------------------------


def test_checkpoints_are_complete_step_dirs_in_step_order(tmp_path):
    run = RunDir(tmp_path)
    assert run.checkpoints() == [] and run.last_checkpoint() is None  # no checkpoints/ at all
    for name in ("step_000010", "step_000002", "step_1000000", "step_999999"):
        _fake_checkpoint(tmp_path, name)
    _fake_checkpoint(tmp_path, "step_000011", state=False)  # torn: the trainer state never landed
    _fake_checkpoint(tmp_path, ".step_000012.tmp-42")  # a save in progress
    _fake_checkpoint(tmp_path, "step_7")  # not a name rlvr writes
    (tmp_path / "checkpoints" / "step_000013").write_text("a file")
    assert [p.name for p in run.checkpoints()] == ["step_000002", "step_000010", "step_999999", "step_1000000"]
    assert run.last_checkpoint() == tmp_path / "checkpoints" / "step_1000000"  # no `last`: the newest


def test_last_checkpoint_follows_the_link(tmp_path):
    run = RunDir(tmp_path)
    for name in ("step_000001", "step_000002"):
        _fake_checkpoint(tmp_path, name)
    os.symlink("step_000001", run.last_link)  # e.g. a re-save of step 1 after step 2 was written
    assert run.last_checkpoint() == (tmp_path / "checkpoints" / "step_000001").resolve()
    assert run.resume_checkpoint() == run.last_checkpoint()


def test_a_dangling_or_torn_last_falls_back_to_the_newest_complete_step(tmp_path):
    run = RunDir(tmp_path)
    _fake_checkpoint(tmp_path, "step_000001")
    _fake_checkpoint(tmp_path, "step_000003", state=False)
    os.symlink("step_000009", run.last_link)  # dangling
    assert run.last_checkpoint() == tmp_path / "checkpoints" / "step_000001"
    run.last_link.unlink()
    os.symlink("step_000003", run.last_link)  # points at a torn directory
    assert run.last_checkpoint() == tmp_path / "checkpoints" / "step_000001"


def test_usable_decides_what_counts(tmp_path):
    """Evaluation needs weights, not the trainer state: a step dir without it still loads."""
    run = RunDir(tmp_path)
    _fake_checkpoint(tmp_path, "step_000001")
    _fake_checkpoint(tmp_path, "step_000002", state=False)
    has_weights = lambda p: (p / "config.json").is_file()  # noqa: E731
    assert run.last_checkpoint().name == "step_000001"
    assert run.last_checkpoint(usable=has_weights).name == "step_000002"


def test_last_checkpoint_falls_back_when_link_is_missing(tmp_path, tok):
    model = _model()
    for step in (1, 2):
        save_checkpoint(tmp_path, step, model, tok, {"step": step})
    (tmp_path / "checkpoints" / "last").unlink()
    assert RunDir(tmp_path).resume_checkpoint() == tmp_path / "checkpoints" / "step_000002"


def test_last_checkpoint_missing_run_dir(tmp_path):
    with pytest.raises(UserError, match=r"resume=.*nope: no such run directory"):
        RunDir(tmp_path / "nope").resume_checkpoint()


def test_last_checkpoint_run_without_checkpoints(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(UserError, match="has no checkpoint yet"):
        RunDir(tmp_path).resume_checkpoint()
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(UserError, match="has no checkpoint yet"):
        RunDir(tmp_path).resume_checkpoint()


def test_eval_dirs_and_history(tmp_path):
    run = RunDir(tmp_path)
    assert run.eval_dirs() == [] and run.read_eval_history() == []
    for step in (10, 0, 2):
        run.eval_dir(step).mkdir(parents=True)
    run.eval_history_file.write_text('{"step": 0, "eval/accuracy": 0.5}\n')
    assert [step_of(d) for d in run.eval_dirs()] == [0, 2, 10]
    assert run.read_eval_history() == [{"step": 0, "eval/accuracy": 0.5}]


# -- JSONL --------------------------------------------------------------------------------------


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_read_jsonl_skips_a_torn_last_line_and_non_objects(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": NaN}\n\n[1, 2]\n"text"\n{"step": 2, "s": "\xff"}\r\n{"step": 3, "lo')
    rows = read_jsonl(path)
    assert [r["step"] for r in rows] == [1, 2]  # the cut line, the blank line and non-objects are skipped
    assert rows[0]["loss"] != rows[0]["loss"]  # NaN is what a diverged run logs; it is kept
    assert rows[1]["s"] == "\ufffd"  # a bad byte is replaced, not fatal
    run = RunDir(tmp_path)
    assert run.read_metrics() == rows and run.read_samples() == []


def test_parse_lines_numbers_lines_and_reports_bad_ones():
    text = '{"a": 1}\n\n  \n[2]\nnope\n'
    assert parse_lines(text) == [(1, {"a": 1}), (4, [2])]
    seen = []

    def on_error(lineno, e):
        seen.append((lineno, type(e).__name__))
        raise UserError(f"line {lineno}")

    with pytest.raises(UserError, match="line 5"):
        parse_lines(text, on_error=on_error)
    assert seen == [(5, "JSONDecodeError")]


def test_truncate_jsonl_drops_later_steps_and_a_cut_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": s / 10}) for s in range(1, 6)]
    lines.insert(0, json.dumps({"note": "no step"}))  # rows without a step count as step 0
    path.write_text("\n".join(lines) + '\n{"step": 6, "lo')
    truncate_jsonl(path, 3)
    assert _rows(path) == [{"note": "no step"}] + [{"step": s, "loss": s / 10} for s in (1, 2, 3)]
    assert path.read_text().endswith("\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no .tmp left
    truncate_jsonl(path, 0)
    assert _rows(path) == [{"note": "no step"}]


def test_truncate_jsonl_missing_file_is_a_no_op(tmp_path):
    truncate_jsonl(tmp_path / "none.jsonl", 3)
    assert list(tmp_path.iterdir()) == []


def test_jsonl_writer_appends_and_converts_tensors(tmp_path):
    path = tmp_path / "sub" / "samples.jsonl"
    w = JsonlWriter(path)
    w.write({"step": 1, "x": torch.tensor(1.5), "v": torch.tensor([1, 2]), "s": "é"})
    w.close()
    w = JsonlWriter(path)  # a resumed run reopens the file
    w.write({"step": 2})
    w.close()
    assert _rows(path) == [{"step": 1, "x": 1.5, "v": [1, 2], "s": "é"}, {"step": 2}]
    assert "é" in path.read_text(encoding="utf-8")  # ensure_ascii=False


def test_jsonl_writer_fsyncs_every_line(tmp_path, monkeypatch):
    from rlvr import jsonl

    synced = []
    real_fsync = jsonl.os.fsync

    def fsync(fd):
        synced.append(path.read_text().count("\n"))  # the line is flushed before it is synced
        real_fsync(fd)

    monkeypatch.setattr(jsonl.os, "fsync", fsync)
    path = tmp_path / "metrics.jsonl"
    with JsonlWriter(path) as w:
        for s in range(1, 4):
            w.write({"step": s})
    assert synced == [1, 2, 3]


def test_jsonl_writer_refuses_what_json_cannot_hold(tmp_path):
    with JsonlWriter(tmp_path / "x.jsonl") as w, pytest.raises(TypeError, match="object is not JSON serializable"):
        w.write({"step": 1, "bad": object()})


def test_truncate_then_append_continues_cleanly(tmp_path):
    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path)
    for s in range(1, 5):
        w.write({"step": s})
    w.close()
    with path.open("a") as f:
        f.write('{"step": 5, ')  # crash mid-line
    truncate_jsonl(path, 2)
    w = JsonlWriter(path)
    w.write({"step": 3, "resumed": True})
    w.close()
    assert _rows(path) == [{"step": 1}, {"step": 2}, {"step": 3, "resumed": True}]
