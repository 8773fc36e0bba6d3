"""Every command that reads a config takes ``--config``/``-c`` as `rlvr train` does:
`rlvr data preview --config my.yaml` was a usage error."""

import json

import pytest

from rlvr.cli import build_parser, main

# the commands that build a Config from a preset plus key=value overrides
CONFIG_COMMANDS = [
    ["train"],
    ["config"],
    ["estimate"],
    ["sweep"],
    ["data", "preview"],
    ["data", "stats"],
    ["data", "prepare"],
]


@pytest.mark.parametrize("command", CONFIG_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("flag", ["--config", "-c"])
def test_every_config_command_takes_config_flag(command, flag):
    args = build_parser().parse_args([*command, flag, "my.yaml", "train.steps=3"])
    assert args.config == "my.yaml"
    assert args.overrides == ["train.steps=3"]


@pytest.fixture
def cwd(tmp_path, monkeypatch, tiny_model):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a.jsonl").write_text(json.dumps({"question": "What is 1+1?", "answer": "2"}) + "\n")
    (tmp_path / "b.jsonl").write_text(
        "".join(json.dumps({"question": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(3))
    )
    (tmp_path / "c.yaml").write_text(
        f"model:\n  path: {tiny_model}\ndata:\n  task: files\n  path: a.jsonl\n  template: plain\n  system_prompt: ''\n"
    )
    return tmp_path


def test_data_preview_reads_the_config(cwd, capsys):
    assert main(["data", "preview", "--config", "c.yaml", "--n", "1"]) == 0
    out = capsys.readouterr().out
    assert "# template plain;" in out and "1 train rows" in out
    assert "What is 1+1?" in out


def test_a_data_file_after_the_config_replaces_its_data_path(cwd, capsys):
    assert main(["data", "stats", "-c", "c.yaml", "b.jsonl", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["rows"] == 3


def test_two_configs_is_one_line(cwd, capsys):
    assert main(["data", "preview", "-c", "c.yaml", "c.yaml"]) == 2
    err = capsys.readouterr().err
    assert err == "error: two configs: --config c.yaml and c.yaml; give one\n"


def test_a_missing_config_is_the_same_error_as_train(cwd, capsys):
    assert main(["train", "--config", "missing.yaml"]) == 2
    train_err = capsys.readouterr().err
    assert main(["data", "preview", "--config", "missing.yaml"]) == 2
    assert capsys.readouterr().err == train_err
    assert "missing.yaml not found" in train_err


@pytest.mark.parametrize("command", CONFIG_COMMANDS, ids=" ".join)
def test_overrides_before_and_after_the_config_flag_in_any_mix(command):
    """As Hydra and TRL users type them: overrides on either side of --config, in the order given (the
    last of a key wins later), where argparse alone said "unrecognized arguments"."""
    from rlvr.cli import parse

    args = parse(build_parser(), [*command, "train.steps=2", "--config", "grpo", "rollout.max_new_tokens=16", "a=3"])
    assert args.config == "grpo" and args.overrides == ["train.steps=2", "rollout.max_new_tokens=16", "a=3"]


def test_mixed_overrides_reach_the_config(capsys):
    assert main(["config", "train.steps=2", "--config", "grpo", "rollout.max_new_tokens=16", "train.steps=5"]) == 0
    out = capsys.readouterr().out
    assert "max_new_tokens: 16" in out and "steps: 5" in out  # the last one of a key wins


def test_a_real_usage_error_shows_the_subcommands_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "train.steps=2", "--config", "grpo", "--bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: rlvr train ") and "unrecognized arguments: --bogus" in err
    with pytest.raises(SystemExit):
        main(["data", "preview", "--config", "grpo", "x=1", "--nope"])
    assert capsys.readouterr().err.startswith("usage: rlvr data preview ")
