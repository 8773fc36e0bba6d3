"""``rlvr`` CLI, in process: every user mistake is exit 2 and one ``error: ...`` line on stderr, no traceback,
and nothing is written to the run directory before the inputs are checked."""

import json

import pytest

from rlvr.cli import main


def _error_line(capsys, argv, needles):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in line, line
    return line


def _no_run_written(cwd):
    assert not (cwd / "r").exists()
    assert not (cwd / "runs").exists()


@pytest.mark.parametrize("command", ["train", "config"])
@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["trian.lr=1e-5"], ["unknown config key 'trian.lr'", "did you mean 'train.lr'"]),
        (["train.stpes=3"], ["unknown config key 'train.stpes'", "'train.steps'"]),
        (["train.steps=abc"], ["train.steps='abc'", "expected an integer"]),
        (["algo.kl_estimator=k7"], ["algo.kl_estimator=k7", "k1, k2, k3"]),
        (["algo.clip_low=1.5"], ["algo.clip_low must be in [0, 1)"]),
        (
            ["train.prompts_per_step=3", "rollout.samples_per_prompt=5", "train.micro_batch_seqs=4"],
            ["15 sequences per step", "train.micro_batch_seqs=4"],
        ),
        (["train.lr"], ["must look like key=value"]),
    ],
)
def test_config_errors(cwd, capsys, command, overrides, needles):
    _error_line(capsys, [command, "run_dir=r", *overrides], needles)
    _no_run_written(cwd)


def test_missing_model_path(cwd, capsys):
    _error_line(capsys, ["train", "run_dir=r", "model.path=/nonexistent"], ["model.path=/nonexistent not found"])
    _no_run_written(cwd)


def test_model_path_without_config_json(cwd, capsys):
    (cwd / "empty_model").mkdir()
    _error_line(capsys, ["train", "run_dir=r", "model.path=empty_model"], ["not a Hugging Face model directory"])
    _no_run_written(cwd)


def test_missing_gguf_file(cwd, capsys):
    _error_line(capsys, ["train", "run_dir=r", "model.path=missing.gguf"], ["GGUF file not found"])
    _no_run_written(cwd)


def test_files_task_without_path(cwd, capsys):
    _error_line(capsys, ["train", "run_dir=r", "data.task=files"], ["data.task=files needs data.path"])
    _no_run_written(cwd)


def test_missing_data_file(cwd, capsys, tiny_model):
    argv = ["train", "run_dir=r", f"model.path={tiny_model}", "data.task=files", "data.path=missing.jsonl"]
    _error_line(capsys, argv, ["data file missing.jsonl not found", "data.path"])
    _no_run_written(cwd)


def test_missing_test_data_file(cwd, capsys, tiny_model):
    (cwd / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    argv = [
        "train",
        "run_dir=r",
        f"model.path={tiny_model}",
        "data.task=files",
        "data.path=train.jsonl",
        "data.test_path=t.jsonl",
    ]
    _error_line(capsys, argv, ["data file t.jsonl not found"])
    _no_run_written(cwd)


def test_data_row_without_answer_key(cwd, capsys, tiny_model):
    rows = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "What is 2 + 2?", "solution": "4"}]
    (cwd / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["train", "run_dir=r", f"model.path={tiny_model}", "data.task=files", "data.path=d.jsonl"]
    _error_line(capsys, argv, ["d.jsonl:2:", "no 'answer'", "keys present: question, solution", "data.answer_key"])
    _no_run_written(cwd)


def test_data_file_not_utf8(cwd, capsys, tiny_model):
    (cwd / "d.jsonl").write_bytes('{"question": "café", "answer": "1"}\n'.encode("latin-1"))
    argv = ["train", "run_dir=r", f"model.path={tiny_model}", "data.task=files", "data.path=d.jsonl"]
    _error_line(capsys, argv, ["d.jsonl", "not UTF-8"])
    _no_run_written(cwd)


def test_unknown_reward_name(cwd, capsys, tiny_model):
    argv = ["train", "run_dir=r", f"model.path={tiny_model}", "reward.rules=[acuracy]", "reward.weights=[1]"]
    _error_line(capsys, argv, ["unknown reward 'acuracy'", "did you mean 'accuracy'"])
    _no_run_written(cwd)


def test_unknown_accuracy_rule(cwd, capsys, tiny_model):
    argv = ["train", "run_dir=r", f"model.path={tiny_model}", "reward.accuracy_rule=acuracy"]
    _error_line(capsys, argv, ["unknown reward 'acuracy'"])
    _no_run_written(cwd)


def test_unimportable_reward_module(cwd, capsys, tiny_model):
    argv = [
        "train",
        "run_dir=r",
        f"model.path={tiny_model}",
        "reward.rules=[no_such_pkg_xyz.mod:fn]",
        "reward.weights=[1]",
    ]
    _error_line(capsys, argv, ["cannot import reward module 'no_such_pkg_xyz.mod'"])
    _no_run_written(cwd)


def test_resume_missing_directory(cwd, capsys):
    _error_line(capsys, ["train", "resume=nowhere"], ["resume=nowhere", "not found", "run directory"])
    assert not (cwd / "nowhere").exists()
    _no_run_written(cwd)


def test_resume_missing_directory_with_config(cwd, capsys, tiny_model):
    # with --config the run's saved config is not read, but a missing run must still not be created
    argv = ["train", "--config", "quickstart", f"model.path={tiny_model}", "resume=nowhere"]
    _error_line(capsys, argv, ["resume=nowhere"])
    assert not (cwd / "nowhere").exists()


def test_resume_directory_that_is_not_a_run(cwd, capsys):
    (cwd / "notarun").mkdir()
    _error_line(capsys, ["train", "resume=notarun"], ["resume=notarun", "config.yaml not found"])
    assert list((cwd / "notarun").iterdir()) == []


def test_existing_run_is_not_overwritten(cwd, capsys, tiny_model):
    run = cwd / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    _error_line(capsys, ["train", "run_dir=r", f"model.path={tiny_model}"], ["already holds a run", "resume="])
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert not (run / "config.yaml").exists()


@pytest.mark.parametrize("command", ["train", "config"])
def test_config_file_missing(cwd, capsys, command):
    _error_line(capsys, [command, "--config", "missing.yaml", "run_dir=r"], ["missing.yaml not found", "quickstart"])
    _no_run_written(cwd)


def test_config_file_invalid_yaml(cwd, capsys):
    (cwd / "bad.yaml").write_text("train: [1,\n")
    _error_line(capsys, ["train", "--config", "bad.yaml", "run_dir=r"], ["bad.yaml is not valid YAML"])
    _no_run_written(cwd)


def test_config_file_binary(cwd, capsys):
    (cwd / "w.bin").write_bytes(b"\x80\x81\xff\x00")
    _error_line(capsys, ["train", "--config", "w.bin", "run_dir=r"], ["w.bin is not a UTF-8 text file"])
    _no_run_written(cwd)


def test_markup_like_config_values_do_not_crash(cwd, capsys):
    # config values reach the console (the summary, --print-config); '[/x]' must not be read as markup
    argv = ["train", "run_dir=r", "model.path=/nonexistent", "data.system_prompt=[/x] be [red]brief"]
    _error_line(capsys, argv, ["model.path=/nonexistent not found"])
    _no_run_written(cwd)


def test_config_docs_lists_every_key(capsys):
    assert main(["config", "--docs"]) == 0
    out = capsys.readouterr().out
    assert "train.lr = 1e-06" in out
    assert "Peak learning rate" in out
    assert "reward.rules = ['accuracy', 'format']" in out
    from rlvr.config import all_keys

    for key in all_keys():
        assert f"\n{key} = " in "\n" + out, key


def test_config_prints_resolved_yaml(cwd, capsys):
    assert main(["config", "train.steps=9", "algo.kl_estimator=k2"]) == 0
    out = capsys.readouterr().out
    assert "  steps: 9\n" in out
    assert "  kl_estimator: k2\n" in out
    (cwd / "c.yaml").write_text(out)
    assert main(["config", "--config", "c.yaml"]) == 0
    assert capsys.readouterr().out == out  # the printed config is itself a valid preset


def test_rewards_lists_builtins(capsys):
    assert main(["rewards"]) == 0
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines()]
    assert "accuracy" in names and "format" in names and "boxed" in names


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert "usage: rlvr" in out
    assert "train" in out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["trian"], "unknown command 'trian'; did you mean 'train'?"),
        (["rewards", "list"], "unknown command 'rewards list'; did you mean 'reward list'?"),
        (["data", "previw", "x.jsonl"], "unknown command 'data previw'; did you mean 'data preview'?"),
        (["reward", "scor", "--rules", "format"], "unknown command 'reward scor'; did you mean 'reward score'?"),
        (["xyzzy"], "unknown command 'xyzzy'; use one of train, config,"),
    ],
)
def test_unknown_command_names_the_nearest(capsys, argv, needle):
    """An unknown command is one line naming the closest, not argparse's usage and every choice."""
    _error_line(capsys, argv, [needle])


def test_data_line_that_is_not_json(cwd, capsys, tiny_model):
    """A data line that is not JSON: one line naming file, line and the skip setting; with it training reads on."""
    (cwd / "d.jsonl").write_text('{"question": "What is 1 + 1?", "answer": "2"}\n{"question": "What\n')
    argv = ["train", "run_dir=r", "data.task=files", "data.path=d.jsonl"]
    _error_line(capsys, [*argv, f"model.path={tiny_model}"], ["d.jsonl:2: not valid JSON", "data.on_bad_row=skip"])
    _no_run_written(cwd)
    # the data loads before the model path is checked: reaching that error means the line was skipped
    skip = [*argv, "data.on_bad_row=skip", "model.path=/nonexistent"]
    _error_line(capsys, skip, ["model.path=/nonexistent not found"])
    _no_run_written(cwd)


def test_data_path_without_files_task(cwd, capsys):
    _error_line(
        capsys, ["train", "run_dir=r", "data.path=d.jsonl"], ["data.path/data.test_path are set", "data.task=files"]
    )
    _no_run_written(cwd)


def test_data_bad_label_type_names_row_and_keys(cwd, capsys, tiny_model):
    rows = [{"question": "q", "answer": "1"}, {"question": "q2", "answer": [1, 2], "id": 3}]
    (cwd / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["train", "run_dir=r", f"model.path={tiny_model}", "data.task=files", "data.path=d.jsonl"]
    _error_line(
        capsys,
        argv,
        ["d.jsonl:2:", "a list in 'answer' (not a string or number)", "keys present: answer, id, question"],
    )
    _no_run_written(cwd)


def test_data_unknown_format(cwd, capsys, tiny_model):
    (cwd / "d.txt").write_text("q\n")
    argv = ["train", "run_dir=r", f"model.path={tiny_model}", "data.task=files", "data.path=d.txt"]
    _error_line(capsys, argv, ["d.txt: unknown data format '.txt'", "data.format"])
    _no_run_written(cwd)


def test_a_closed_pipe_is_no_traceback():
    """`rlvr reward list | head`: the reader leaves before rlvr writes (``true`` reads nothing); rlvr ends quietly."""
    import subprocess
    import sys

    proc = subprocess.run(
        f"{sys.executable} -m rlvr.cli reward list | true", shell=True, capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_long_lines_stay_whole_into_a_file_or_pipe():
    """rich wraps at 80 columns when the output is not a terminal; a command rlvr tells the user to
    run (``continue with: rlvr train resume=...``) must paste as one line."""
    import io

    from rlvr.tracking.console import StepPrinter, make_console

    out = io.StringIO()
    command = "continue with: rlvr train resume=" + "/a-long-folder-name" * 12
    StepPrinter(3, console=make_console(file=out)).note(command)
    make_console(file=out).print(command, highlight=False)
    assert out.getvalue().splitlines() == [command, command]


# --- hostile inputs (issue 62.3): each is one line and exit 2 before anything is written -------------


def test_a_prompt_longer_than_the_model_context_stops_training(cwd, capsys, tiny_model):
    """The tiny model's context is 256 tokens (max_position_embeddings); a 300-token prompt stops the run
    before its model loads, naming the row (tests/data/test_hostile_data.py: a 10^6-token one)."""
    rows = [{"question": "1 + 1", "answer": "2"}, {"question": " ".join(["7"] * 300), "answer": "7"}]
    (cwd / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["train", "run_dir=r", f"model.path={tiny_model}", "data.task=files", "data.path=d.jsonl"]
    argv += ["data.template=plain", "data.assistant_prefix="]
    _error_line(capsys, argv, ["train row 2: the prompt is 300 tokens, over the model's context of 256 tokens"])
    _no_run_written(cwd)


PLUGIN_FILES = {
    "a syntax error": ("def fn(:\n", "SyntaxError: invalid syntax"),
    "raises at import": ('raise RuntimeError("no network\\n" + "x" * 10_000)\n', "RuntimeError: no network"),
    "exits at import": ("import sys\nsys.exit(3)\n", "SystemExit: 3"),
}


@pytest.mark.parametrize("name", PLUGIN_FILES)
def test_a_reward_file_outside_the_project_that_fails_to_import(cwd, capsys, tiny_model, tmp_path_factory, name):
    """``reward.rules=[/elsewhere/bad.py:fn]``: the file and its exception in one line (its first line, cut
    at 200 characters); ``sys.exit`` at import used to end rlvr with status 3 and no word."""
    source, exception = PLUGIN_FILES[name]
    bad = tmp_path_factory.mktemp("elsewhere") / "bad.py"
    bad.write_text(source)
    argv = ["train", "run_dir=r", f"model.path={tiny_model}", f"reward.rules=[{bad}:fn]", "reward.weights=[1]"]
    line = _error_line(capsys, argv, [f"reward plugin file {bad} failed to import: {exception}"])
    assert len(line) < 400, line
    _no_run_written(cwd)


def test_a_reward_module_that_raises_at_import(cwd, capsys, tiny_model, monkeypatch):
    (cwd / "raising_rule_62.py").write_text("raise ValueError('half-configured')\n")
    monkeypatch.syspath_prepend(str(cwd))
    argv = ["train", "run_dir=r", f"model.path={tiny_model}", "reward.rules=[raising_rule_62:fn]", "reward.weights=[1]"]
    _error_line(capsys, argv, ["reward module 'raising_rule_62'", "failed to import: ValueError: half-configured"])
    _no_run_written(cwd)


def _model_with_code(folder, tiny_model, *, config=None, tokenizer=None):
    """A copy of the tiny model whose config.json / tokenizer_config.json get the keys given, beside a
    ``remote.py`` that leaves a file ``ran`` next to it when it is imported."""
    import shutil

    shutil.copytree(tiny_model, folder)
    for name, extra in (("config.json", config), ("tokenizer_config.json", tokenizer)):
        if extra:
            path = folder / name
            path.write_text(json.dumps({**json.loads(path.read_text()), **extra}))
    (folder / "remote.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('ran').write_text('x')\n"
        "from transformers import PreTrainedTokenizerFast, PretrainedConfig\n"
        "class RemoteTokenizer(PreTrainedTokenizerFast): pass\n"
        "class RemoteConfig(PretrainedConfig): model_type = 'remote_arch'\n"
    )
    return folder


REMOTE = {
    "config.json": dict(config={"model_type": "remote_arch", "auto_map": {"AutoConfig": "remote.RemoteConfig"}}),
    "tokenizer_config.json": dict(
        tokenizer={
            "tokenizer_class": "RemoteTokenizer",
            "auto_map": {"AutoTokenizer": [None, "remote.RemoteTokenizer"]},
        }
    ),
}


@pytest.mark.parametrize("where", REMOTE)
@pytest.mark.parametrize("command", ["train", "data preview"])
def test_a_model_folder_that_asks_for_remote_code_is_refused(cwd, capsys, tiny_model, monkeypatch, where, command):
    """A local ``model.path`` whose config.json or tokenizer_config.json maps a class to the folder's own
    code. transformers, asked with trust_remote_code unset, prompts on stdin and runs the code on 'y':
    here the answer waits on stdin, and nothing runs."""
    import io

    folder = _model_with_code(cwd / "shared_model", tiny_model, **REMOTE[where])
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 10))
    argv = [*command.split(), "run_dir=r", f"model.path={folder}"] if command == "train" else None
    if argv is None:
        (cwd / "d.jsonl").write_text('{"question": "1 + 1", "answer": "2"}\n')
        argv = ["data", "preview", "d.jsonl", f"model.path={folder}", "data.template=plain"]
    _error_line(
        capsys, argv, [f"model.path={folder}: this model needs trust_remote_code (its {where} maps", "never runs"]
    )
    assert not (folder / "ran").exists()
    _no_run_written(cwd)


def test_transformers_is_never_asked_to_run_a_repos_code(cwd, tiny_model, monkeypatch):
    """The net under the check above: the loader passes trust_remote_code=False, so transformers refuses
    (one line here) instead of prompting, whatever the check misses."""
    import io

    from rlvr.errors import UserError
    from rlvr.models import load_tokenizer

    folder = _model_with_code(cwd / "shared_model", tiny_model, **REMOTE["tokenizer_config.json"])
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 10))
    with pytest.raises(UserError, match="could not load the tokenizer from .*custom code"):
        load_tokenizer(folder)
    assert not (folder / "ran").exists()
