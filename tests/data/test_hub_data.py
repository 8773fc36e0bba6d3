"""Hugging Face Hub data sets by name (``org/name[:config][@revision]``), offline: each test builds a
hub-style cache in a temporary HF_HOME (tests/data/hub_cache.py) with HF_HUB_OFFLINE=1, in the layouts
of openai/gsm8k (README configs, parquet shards), HuggingFaceH4/MATH-500 (test.jsonl) and
agentica-org/DeepScaleR-Preview-Dataset (one .json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import hub_cache
import pytest
import tiny_run
import yaml

from rlvr.cli import main
from rlvr.config import Config, DataConfig, EvalConfig
from rlvr.data import hub, load_split
from rlvr.data.files import hub_name, pin
from rlvr.data.loading import pin_hub_data
from rlvr.data.presets import detect
from rlvr.errors import UserError
from rlvr.evaluation import load_eval_rows

MATH500 = [
    {"problem": "What is $1+1$?", "solution": "$\\boxed{2}$", "answer": "2", "subject": "Algebra", "level": 1},
    {"problem": "What is $2+2$?", "solution": "$\\boxed{4}$", "answer": "4", "subject": "Algebra", "level": 1},
]
DEEPSCALER = [{"problem": f"What is {i} times 3?", "answer": str(3 * i), "solution": "..."} for i in range(4)]


@pytest.fixture
def hf_hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache ``tmp/hf/hub`` as this process's, offline; the cwd is ``tmp``."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read from HF_HOME when the hub was imported
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "_RESOLVED", {})
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "rlvr"))
    monkeypatch.chdir(tmp_path)
    return cache


def files(path: str, **kw) -> DataConfig:
    return DataConfig(task="files", path=path, **kw)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("openai/gsm8k", ("openai/gsm8k", None, None)),
        ("openai/gsm8k:main", ("openai/gsm8k", "main", None)),
        ("HuggingFaceH4/MATH-500@ff5b202", ("HuggingFaceH4/MATH-500", None, "ff5b202")),
        ("org/data.v2:cfg_1@refs/convert/parquet", ("org/data.v2", "cfg_1", "refs/convert/parquet")),
        ("gsm8k", None),  # no org
        ("a/b/c", None),
        ("/abs/path", None),
        ("./org/name", None),
        ("org/na--me", None),  # the Hub forbids '--' and '..'
        ("org/a..b", None),
    ],
)
def test_parse(text, expected):
    name = hub.parse(text)
    assert (None if name is None else (name.repo, name.config, name.revision)) == expected
    if name is not None:
        assert str(name) == text


def test_local_paths_win(hf_hub):
    assert hub_name("data/deepscaler.jsonl") is None  # a missing data file stays a file ...
    assert hub_name("data/*.parquet") is None
    assert hub_name("org/data") is not None
    Path("org/data").mkdir(parents=True)
    Path("org/data/train.jsonl").write_text(hub_cache.jsonl(hub_cache.gsm8k_rows("train")))
    assert hub_name("org/data") is None  # ... and an existing path is the path
    assert len(load_split(files("org/data")).rows) == 3


def test_gsm8k_layout_config_and_splits(hf_hub):
    commit = hub_cache.gsm8k(hf_hub)
    train, test = load_split(files("openai/gsm8k:main")), load_split(files("openai/gsm8k:main"), "test")
    assert [r["question"] for r in train.rows][0] == "main train 0: what is 0 + 0?"
    assert [r["answer"] for r in test.rows] == ["0", "2", "4"]
    assert test.rows[0]["question"].startswith("main test")
    assert train.preset == "gsm8k" and "the Hub data set openai/gsm8k" in train.notes[0]
    assert pin("openai/gsm8k:main") == f"openai/gsm8k:main@{commit}"
    assert pin(f"openai/gsm8k:socratic@{commit}") == f"openai/gsm8k:socratic@{commit}"
    socratic = load_split(files(f"openai/gsm8k:socratic@{commit}"), "test")
    assert socratic.rows[0]["question"].startswith("socratic test")
    with pytest.raises(UserError, match=r"several configs \(main, socratic\); name one, e.g. openai/gsm8k:main$"):
        load_split(files("openai/gsm8k"))
    with pytest.raises(UserError, match="has no config 'nope' \\(its configs: main, socratic\\)"):
        load_split(files("openai/gsm8k:nope"))
    with pytest.raises(UserError, match="has no split 'validation' \\(it has: train, test\\)"):
        load_split(files("openai/gsm8k:main", train_split="validation"))


def test_test_only_and_single_file_layouts(hf_hub):
    hub_cache.put_dataset(
        hf_hub, "HuggingFaceH4/MATH-500", {"README.md": "# MATH-500\n", "test.jsonl": hub_cache.jsonl(MATH500)}
    )
    hub_cache.put_dataset(
        hf_hub, "agentica-org/DeepScaleR-Preview-Dataset", {"deepscaler.json": json.dumps(DEEPSCALER)}
    )
    cfg = files("agentica-org/DeepScaleR-Preview-Dataset", test_path="HuggingFaceH4/MATH-500")
    train, test = load_split(cfg), load_split(cfg, "test")
    assert [r["answer"] for r in train.rows] == ["0", "3", "6", "9"] and train.preset == "deepscaler"
    assert [r["answer"] for r in test.rows] == ["2", "4"]
    assert test.preset == "math500"  # MATH's columns; the name says which
    assert load_split(files("agentica-org/DeepScaleR-Preview-Dataset"), "test").rows == []  # no test split
    with pytest.raises(UserError, match="no split 'train' \\(it has: test\\).*data.test_path or eval.data"):
        load_split(files("HuggingFaceH4/MATH-500"))
    assert [r["answer"] for r in load_eval_rows("HuggingFaceH4/MATH-500")] == ["2", "4"]


def test_preset_by_name_only_where_the_columns_fit():
    rows = [{"problem": "1+1?", "answer": "2"}]
    assert detect(rows)[0].name == "deepscaler"  # by the columns: DeepScaleR, ORZ and MATH-500 look alike
    assert detect(rows, "huggingfaceh4/math-500")[0].name == "math500"
    assert detect([[{"value": "1+1?"}, {"ground_truth": {"value": "2"}}]], "pe-nlp/orz_math_57k")[0].name == "orz"
    assert detect([{"question": "1+1?", "answer": "2"}], "HuggingFaceH4/MATH-500")[0].name == "custom"


def test_config_folder_without_card_and_bad_rows(hf_hub):
    """A config named by its folder when the card lists none; data.on_bad_row applies as to local files."""
    rows = hub_cache.jsonl(hub_cache.gsm8k_rows("train"))
    hub_cache.put_dataset(hf_hub, "org/data", {"main/train.jsonl": rows + "{torn\n", "other/train.jsonl": rows})
    with pytest.raises(UserError, match=r"main/train.jsonl:4: not valid JSON"):
        load_split(files("org/data:main"))
    split = load_split(files("org/data:main", on_bad_row="skip"))
    assert len(split.rows) == 3 and split.dropped["not valid JSON"] == 1
    with pytest.raises(UserError, match="has no config 'x' \\(it has no configs and no folder of that name\\)"):
        load_split(files("org/data:x"))


def test_missing_data_set_is_one_line(hf_hub):
    with pytest.raises(UserError) as err:
        load_split(files("org/missing"))
    message = str(err.value)
    assert "\n" not in message
    for needle in (
        "data.path=org/missing",
        str(hf_hub),
        "HF_HUB_OFFLINE",
        "hf download org/missing --repo-type dataset",
    ):
        assert needle in message


def test_pin_hub_data_records_commits_and_keeps_a_resumed_runs(hf_hub):
    commit = hub_cache.gsm8k(hf_hub)
    hub_cache.put_dataset(hf_hub, "HuggingFaceH4/MATH-500", {"test.jsonl": hub_cache.jsonl(MATH500)})
    cfg = Config(data=files("openai/gsm8k:main,extra.jsonl"), eval=EvalConfig(data="HuggingFaceH4/MATH-500"))
    pinned = pin_hub_data(cfg)
    assert pinned.data.path == f"openai/gsm8k:main@{commit},extra.jsonl"
    assert pinned.eval.data.startswith("HuggingFaceH4/MATH-500@") and len(pinned.eval.data.split("@")[1]) == 40
    card, shard = hub_cache.GSM8K_CARD, hub_cache.parquet(hub_cache.gsm8k_rows("train", n=1))
    before = hub_cache.put_dataset(  # an older commit, which a resumed run recorded
        hf_hub,
        "openai/gsm8k",
        {"README.md": card, "main/train-0.parquet": shard, "main/test-0.parquet": shard},
        revision="v0",
    )
    earlier = {"data": {"path": f"openai/gsm8k:main@{before},extra.jsonl"}}
    assert pin_hub_data(cfg, earlier=earlier).data.path == earlier["data"]["path"]
    other = {"data": {"path": f"openai/gsm8k:socratic@{before},extra.jsonl"}}  # another config: not this data
    assert pin_hub_data(cfg, earlier=other).data.path == pinned.data.path


@pytest.mark.slow
def test_train_and_eval_on_a_cached_data_set(hf_hub, tiny_model, capsys):
    """`rlvr train ... data.path=org/data` for one step, in a fresh process that finds the cache through
    HF_HOME alone; `rlvr eval --data org/data`; a data set missing from the cache: one line, exit 2."""
    commit = hub_cache.gsm8k(hf_hub, "org/data")
    env = {**os.environ, "HF_HOME": str(hf_hub.parent), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    args = tiny_run.tiny_args(tiny_model, "run", *tiny_run.FORMAT_REWARD, "data.task=files", "data.path=org/data:main")
    args += ["train.steps=1", "eval.at_start=false", "eval.limit=2", "reward.workers=0"]
    done = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    saved = yaml.safe_load(Path("run/config.yaml").read_text())
    assert saved["data"]["path"] == f"org/data:main@{commit}"  # the run can be repeated from its config
    assert [m["step"] for m in tiny_run.metrics("run")] == [1]
    assert json.loads(Path("run/eval/step_000001/summary.json").read_text())["n"] == 2  # the test split

    plain = ["--template", "plain", "--system", "", "--max-new-tokens", "4", "--device", "cpu"]
    rc = main(["eval", "--model", str(tiny_model), "--data", "org/data:main", "--limit", "2", "-o", "ev", *plain])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads(Path("ev/summary.json").read_text())
    assert summary["n"] == 2 and summary["data"] == f"org/data:main@{commit}"  # the data it read, pinned

    capsys.readouterr()
    assert main(["eval", "--model", str(tiny_model), "--data", "org/missing"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "org/missing" in err and str(hf_hub) in err, err


def test_data_preview_takes_a_hub_name_as_its_argument(hf_hub, capsys):
    from rlvr.cli import main

    hub_cache.gsm8k(hf_hub)
    assert main(["data", "preview", "openai/gsm8k:main", "--n", "1"]) == 0
    assert "main train 0: what is 0 + 0?" in capsys.readouterr().out
    assert main(["data", "preview", "org/missing", "--n", "1"]) == 2  # a Hub name, not a preset: the cache error
    assert "org/missing" in capsys.readouterr().err
