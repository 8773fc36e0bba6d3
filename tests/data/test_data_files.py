"""Data files of every format and preset schema (built in tmp dirs), bad inputs, preparation and caching."""

import json
import os
import re

import pytest

from rlvr.cli import main
from rlvr.config import DataConfig
from rlvr.data import load_rows, load_split, prepare_rows
from rlvr.data.prepare import render_all
from rlvr.data.templates import get_template
from rlvr.errors import UserError
from rlvr.models.tiny import tiny_tokenizer

GSM = [
    {"question": "Natalia sold 48 clips. How many?", "answer": "48 + 24 = 72\n#### 1,234"},
    {"question": "Weng earns $12 an hour. How much?", "answer": "#### 10"},
]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))


def files(**kw) -> DataConfig:
    return DataConfig(task="files", **kw)


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def qa(rows):
    return [(r["question"], r["answer"]) for r in rows]


# --- formats ---------------------------------------------------------------------------------


def test_every_format_reads_the_same_rows(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(GSM)
    paths = {
        "jsonl": jsonl(tmp_path / "d.jsonl", GSM),
        "json_list": tmp_path / "list.json",
        "json_columns": tmp_path / "cols.json",
        "json_data_key": tmp_path / "wrapped.json",
        "parquet": tmp_path / "d.parquet",
        "csv": tmp_path / "d.csv",
    }
    paths["json_list"].write_text(json.dumps(GSM))
    paths["json_columns"].write_text(json.dumps({k: [r[k] for r in GSM] for k in GSM[0]}))
    paths["json_data_key"].write_text(json.dumps({"data": GSM}))
    ds.to_parquet(str(paths["parquet"]))
    ds.to_csv(str(paths["csv"]), index=False)
    ds.save_to_disk(str(tmp_path / "saved"))
    paths["saved"] = tmp_path / "saved"
    paths["arrow"] = next((tmp_path / "saved").glob("*.arrow"))
    expected = [("Natalia sold 48 clips. How many?", "1234"), ("Weng earns $12 an hour. How much?", "10")]
    for name, path in paths.items():
        split = load_split(files(path=str(path)))
        assert qa(split.rows) == expected, name
        assert split.preset == "gsm8k", name
        assert split.rows[0]["fields"] == {"solution": "48 + 24 = 72\n#### 1,234"}, name


def test_dataset_dict_folder_splits_and_globs(tmp_path):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(GSM), "test": datasets.Dataset.from_list(GSM[:1])})
    dd.save_to_disk(str(tmp_path / "dd"))
    train, test = load_rows(files(path=str(tmp_path / "dd")))
    assert len(train) == 2 and len(test) == 1
    with pytest.raises(UserError, match=r"has no split 'validation' \(it has: train, test\)"):
        load_split(files(path=str(tmp_path / "dd"), train_split="validation"))
    # a folder of split-named files, and a glob, and a comma list
    folder = tmp_path / "gsm"
    folder.mkdir()
    jsonl(folder / "train.jsonl", GSM)
    jsonl(folder / "test.jsonl", GSM[1:])
    train, test = load_rows(files(path=str(folder)))
    assert (len(train), len(test)) == (2, 1)
    assert len(load_split(files(path=str(folder / "*.jsonl")), "train").rows) == 2  # deduped across files
    assert len(load_split(files(path=f"{folder / 'train.jsonl'},{folder / 'test.jsonl'}", dedupe=False)).rows) == 3
    # an explicit test file
    train, test = load_rows(files(path=str(folder / "train.jsonl"), test_path=str(folder / "test.jsonl")))
    assert qa(test) == [("Weng earns $12 an hour. How much?", "10")]
    assert load_split(files(path=str(folder / "train.jsonl")), "test").rows == []  # a plain file has no test split


def test_limit_and_seeded_shuffle(tmp_path):
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(50)]
    path = str(jsonl(tmp_path / "d.jsonl", rows))
    assert [r["answer"] for r in load_split(files(path=path, limit=3)).rows] == ["0", "1", "2"]
    a = load_split(files(path=path, limit=5, shuffle=True)).rows
    assert a == load_split(files(path=path, limit=5, shuffle=True)).rows
    assert a != load_split(files(path=path, limit=5, shuffle=True, train_seed=9)).rows
    assert [r["answer"] for r in a] != ["0", "1", "2", "3", "4"]


# --- presets ---------------------------------------------------------------------------------

MATH = {"problem": "Half of 1?", "solution": "So it is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1", "type": "Algebra"}
PRESET_CASES = [
    # (records, preset auto-detected, question, answer, some fields)
    (GSM[:1], "gsm8k", GSM[0]["question"], "1234", {"solution": GSM[0]["answer"]}),
    ([MATH], "math", "Half of 1?", "\\frac{1}{2}", {"level": "Level 1", "type": "Algebra"}),
    (
        [
            {
                "problem": "P",
                "solution": "x \\boxed{\\sqrt{2}} y \\boxed{3}",
                "answer": "3",
                "subject": "Algebra",
                "level": 1,
                "unique_id": "u",
            }
        ],
        "math",
        "P",
        "3",
        {"subject": "Algebra", "unique_id": "u"},
    ),
    (
        [{"problem": "P", "answer": "\\frac{3}{4}", "solution": "long"}],
        "deepscaler",
        "P",
        "\\frac{3}{4}",
        {"solution": "long"},
    ),
    (
        [[{"from": "human", "value": "ORZ Q"}, {"from": "assistant", "ground_truth": {"value": "17"}}]],
        "orz",
        "ORZ Q",
        "17",
        {},
    ),
    (
        [
            {
                "data_source": "math_dapo",
                "prompt": [{"role": "user", "content": "Solve it."}],
                "ability": "MATH",
                "reward_model": {"ground_truth": "34", "style": "rule-math"},
                "extra_info": {"index": "a1"},
            }
        ],
        "dapo_math",
        "Solve it.",
        "34",
        {"data_source": "math_dapo", "extra_info": {"index": "a1"}},
    ),
    (
        [{"instruction": "Add", "input": "2 and 3", "output": "5", "system": "Be exact."}],
        "alpaca",
        "Add\n2 and 3",
        "5",
        {},
    ),
    ([{"question": "Q", "answer": 42}], "custom", "Q", "42", {}),
    (  # TRL's conversational rows: a worked solution's box is the gold
        [
            {
                "prompt": [{"role": "system", "content": "Think first."}, {"role": "user", "content": "Half of 1?"}],
                "solution": "It is $\\boxed{\\frac{1}{2}}$.",
            }
        ],
        "trl",
        "Half of 1?",
        "\\frac{1}{2}",
        {},
    ),
    ([{"prompt": [{"role": "user", "content": "2+2?"}], "solution": "4"}], "trl", "2+2?", "4", {}),  # a bare answer
]


@pytest.mark.parametrize(
    "records, preset, question, answer, fields", PRESET_CASES, ids=[c[1] + str(i) for i, c in enumerate(PRESET_CASES)]
)
def test_presets_auto_and_by_name(tmp_path, records, preset, question, answer, fields):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(records))
    for chosen in ("auto", preset):
        split = load_split(files(path=str(path), preset=chosen))
        row = split.rows[0]
        assert (split.preset, row["question"], row["answer"]) == (preset, question, answer)
        assert fields.items() <= row["fields"].items()
    assert any(f"preset auto -> {preset}" in n for n in load_split(files(path=str(path))).notes)


def test_trl_rows_system_message_and_standard_format(tmp_path):
    """A TRL row's first message is its system text only when its role is system; TRL's standard format
    (prompt as a string) is read too."""
    rows = [{"prompt": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "Q"}], "solution": "7"}]
    row = load_split(files(path=str(jsonl(tmp_path / "a.jsonl", rows)))).rows[0]
    assert (row["question"], row["system"], row["answer"]) == ("Q", "Be exact.", "7")
    rows = [{"prompt": [{"role": "user", "content": "Q"}], "solution": "#### 7"}]
    row = load_split(files(path=str(jsonl(tmp_path / "b.jsonl", rows)))).rows[0]
    assert (row["question"], row["system"], row["answer"]) == ("Q", None, "7")
    rows = [{"prompt": "What is 3 + 4?", "solution": "So \\boxed{7}."}]
    split = load_split(files(path=str(jsonl(tmp_path / "c.jsonl", rows))))
    assert (split.preset, split.rows[0]["question"], split.rows[0]["answer"]) == ("trl", "What is 3 + 4?", "7")


def test_alpaca_system_and_dapo_note(tmp_path):
    path = jsonl(tmp_path / "a.jsonl", [{"instruction": "Add", "input": "", "output": "5", "system": "Be exact."}])
    row = load_split(files(path=str(path))).rows[0]
    assert (row["question"], row["system"]) == ("Add", "Be exact.")
    path = tmp_path / "dapo.json"
    path.write_text(json.dumps(PRESET_CASES[5][0]))
    assert any("data.template=plain" in n for n in load_split(files(path=str(path))).notes)


def test_custom_keys_dotted_paths_and_extra_keys(tmp_path):
    rows = [{"meta": {"q": "Q1", "gold": [7]}, "id": 3, "info": {"level": 2}}]
    path = str(jsonl(tmp_path / "d.jsonl", rows))
    row = load_split(
        files(
            path=path,
            question_key="meta.q",
            answer_key="meta.gold.0",
            extra_keys=["id", "lvl=info.level", "info.level"],
        )
    ).rows[0]
    assert (row["question"], row["answer"]) == ("Q1", "7")
    assert row["fields"] == {"id": 3, "lvl": 2, "info_level": 2}


def test_gold_extraction_edge_cases(tmp_path):
    rows = [{"question": "a", "answer": "x #### 1,234,567 "}, {"question": "b", "answer": "#### -3.5"}]
    assert [r["answer"] for r in load_split(files(path=str(jsonl(tmp_path / "g.jsonl", rows)))).rows] == [
        "1234567",
        "-3.5",
    ]
    nested = {"problem": "p", "solution": "\\boxed{\\frac{a}{\\sqrt{b}}} and \\boxed{x^{2}}", "level": "L"}
    path = tmp_path / "m.json"
    path.write_text(json.dumps([nested]))
    assert load_split(files(path=str(path))).rows[0]["answer"] == "x^{2}"


# --- bad input -------------------------------------------------------------------------------


def one_line_error(cfg, split="train") -> str:
    with pytest.raises(UserError) as e:
        load_split(cfg, split)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_file_and_unknown_format(tmp_path):
    assert "data file " in one_line_error(files(path=str(tmp_path / "nope.jsonl")))
    (tmp_path / "d.txt").write_text("hello")
    assert "unknown data format '.txt'" in one_line_error(files(path=str(tmp_path / "d.txt")))
    assert "matches no data file" in one_line_error(files(path=str(tmp_path / "*.parquet")))
    (tmp_path / "bad.parquet").write_text("not parquet")
    assert "bad.parquet could not be read as parquet" in one_line_error(files(path=str(tmp_path / "bad.parquet")))


def test_missing_key_names_file_line_and_keys(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GSM[0]) + "\n\n" + json.dumps({"question": "q2", "solution": "4", "id": 7}) + "\n")
    msg = one_line_error(files(path=str(path)))
    assert msg.startswith(f"{path}:3: row has no 'answer'")  # line 3: the blank line counts
    assert "keys present: id, question, solution" in msg and "data.answer_key" in msg and "data.on_bad_row=skip" in msg


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"question": "q", "answer": ""}, "row has empty 'answer'"),
        ({"question": "  ", "answer": "1"}, "row has empty 'question'"),
        ({"question": "q", "answer": [1, 2]}, "row has a list in 'answer' (not a string or number)"),
        ({"question": "q", "answer": {"v": 1}}, "row has a dict in 'answer'"),
        ({"question": "q", "answer": True}, "row has a bool in 'answer'"),
        ({"question": "q", "answer": None}, "row has empty 'answer'"),
    ],
)
def test_bad_values(tmp_path, bad, needle):
    path = jsonl(tmp_path / "d.jsonl", [{"question": "ok", "answer": "1"}, bad])
    msg = one_line_error(files(path=str(path), preset="custom"))
    assert f"{path}:2: {needle}" in msg


def test_bad_row_in_parquet_names_row_number(tmp_path):
    import datasets

    datasets.Dataset.from_list(
        [{"problem": "p", "solution": "no box"}, {"problem": "p2", "solution": "\\boxed{1}"}]
    ).to_parquet(str(tmp_path / "m.parquet"))
    msg = one_line_error(files(path=str(tmp_path / "m.parquet"), preset="math"))
    assert msg.startswith(
        f"{tmp_path / 'm.parquet'} row 1: row has no \\boxed{{}} answer in 'solution' "
        "(math preset; keys present: problem, solution)"
    )


def test_skip_counts_bad_rows_and_duplicates(tmp_path):
    rows = [
        {"question": "a", "answer": "1"},
        {"question": "b"},
        {"question": "a", "answer": "1"},
        {"question": "c", "answer": [1]},
        {"question": "d", "answer": 4},
    ]
    split = load_split(files(path=str(jsonl(tmp_path / "d.jsonl", rows)), preset="custom", on_bad_row="skip"))
    assert qa(split.rows) == [("a", "1"), ("d", "4")]
    assert dict(split.dropped) == {
        "no 'answer'": 1,
        "duplicate question": 1,
        "a list in 'answer' (not a string or number)": 1,
    }
    assert any("2 rows, left out" in n for n in split.notes)
    all_bad = jsonl(tmp_path / "bad.jsonl", [{"question": "b"}])
    assert "no usable rows" in one_line_error(files(path=str(all_bad), preset="custom", on_bad_row="skip"))


def test_skip_covers_lines_that_are_not_json(tmp_path):
    """data.on_bad_row=skip skips a torn line too (it used to stop the run)."""
    good = json.dumps({"question": "a", "answer": "1"})
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join([good, '{"question": "b', json.dumps({"question": "c", "answer": "3"}), "", "[1,"]))
    test = tmp_path / "test.jsonl"
    test.write_text('{"question": NaN}\n' + good + "\n")
    cfg = files(path=str(train), test_path=str(test), preset="custom", on_bad_row="skip")
    split = load_split(cfg, "train")
    assert qa(split.rows) == [("a", "1"), ("c", "3")]
    assert dict(split.dropped) == {"not valid JSON": 2}
    assert [n for n in split.notes if "skipped" in n] == [
        f"train: skipped 2 lines of {train} that are not valid JSON: 2, 5"
    ]
    assert "train: 2 rows, left out 2 not valid JSON" in split.notes
    test_split = load_split(cfg, "test")
    assert qa(test_split.rows) == [("a", "1")]
    assert f"test: skipped 1 line of {test} that is not valid JSON: 1" in test_split.notes
    msg = one_line_error(files(path=str(train), preset="custom"))  # the default stops at the first one
    assert msg.startswith(f"{train}:2: not valid JSON") and msg.endswith("fix it or set data.on_bad_row=skip")


def test_skipped_line_numbers_stay_one_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([json.dumps({"question": "a", "answer": "1"})] + ["{"] * 25))
    notes = load_split(files(path=str(path), preset="custom", on_bad_row="skip")).notes
    assert (
        f"train: skipped 25 lines of {path} that are not valid JSON: "
        + ", ".join(map(str, range(2, 22)))
        + (", … (5 more)")
        in notes
    )


def test_file_level_errors(tmp_path):
    (tmp_path / "l.jsonl").write_bytes('{"question": "café", "answer": "1"}\n'.encode("latin-1"))
    assert "not UTF-8" in one_line_error(files(path=str(tmp_path / "l.jsonl")))
    (tmp_path / "l.csv").write_bytes("question,answer\ncafé,1\n".encode("latin-1"))
    assert "l.csv is not UTF-8" in one_line_error(files(path=str(tmp_path / "l.csv")))
    (tmp_path / "b.jsonl").write_text('{"question": "q", "answer": "1"}\n{"question": \n')
    assert re.search(r"b\.jsonl:2: not valid JSON", one_line_error(files(path=str(tmp_path / "b.jsonl"))))
    (tmp_path / "s.jsonl").write_text('"just a string"\n')
    assert "s.jsonl:1: expected a JSON object, got str" in one_line_error(files(path=str(tmp_path / "s.jsonl")))
    (tmp_path / "e.jsonl").write_text("\n \n")
    assert "holds no rows" in one_line_error(files(path=str(tmp_path / "e.jsonl")))
    (tmp_path / "x.jsonl").write_text(json.dumps({"foo": 1, "bar": 2}) + "\n")
    assert "cannot tell the dataset schema from its keys (bar, foo)" in one_line_error(
        files(path=str(tmp_path / "x.jsonl"))
    )
    assert "row has no 'lvl'" in one_line_error(files(path=str(jsonl(tmp_path / "q.jsonl", GSM)), extra_keys=["lvl"]))


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(task="jsonl"), "data.task=jsonl: use arithmetic, arithmetic_tool, countdown, code or files"),
        (dict(task="files"), "data.task=files needs data.path"),
        (dict(path="x.jsonl"), "add data.task=files"),
        (dict(preset="gsm9k"), "data.preset=gsm9k: use one of auto, gsm8k"),
        (dict(on_bad_row="warn"), "data.on_bad_row=warn: use error or skip"),
        (dict(on_long_prompt="cut"), "data.on_long_prompt=cut: use drop or error"),
        (dict(format="xml"), "data.format=xml"),
    ],
)
def test_config_errors(kwargs, needle):
    with pytest.raises(UserError, match=re.escape(needle)):
        DataConfig(**kwargs)


# --- preparation -----------------------------------------------------------------------------


def test_prepare_counts_tokens_drops_long_prompts_and_caches(tmp_path):
    tok = tiny_tokenizer()
    rows = [{"question": " ".join(["1"] * n), "answer": str(n)} for n in (1, 5, 9, 2)]
    path = jsonl(tmp_path / "d.jsonl", rows)
    cfg = files(path=str(path), template="plain", max_prompt_tokens=5)
    prepared = prepare_rows(load_split(cfg), cfg, tok)
    assert [r["prompt_tokens"] for r in prepared.rows] == [1, 5, 2]
    assert [r["prompt"] for r in prepared.rows] == ["1", "1 1 1 1 1", "1 1"]
    assert prepared.dropped == {"prompt over 5 tokens": 1} and not prepared.cached
    again = prepare_rows(load_split(cfg), cfg, tok)
    assert again.cached and again.rows == prepared.rows and again.dropped == prepared.dropped
    # a different template, or an edited file, misses the cache
    assert not prepare_rows(load_split(cfg), DataConfig(**{**cfg.__dict__, "system_prompt": "S"}), tok).cached
    jsonl(path, rows + [{"question": "2", "answer": "2"}])
    os.utime(path, ns=(1, 1))
    assert len(prepare_rows(load_split(cfg), cfg, tok).rows) == 4
    err = files(path=str(path), template="plain", max_prompt_tokens=5, on_long_prompt="error")
    with pytest.raises(UserError, match=r"train row 3: the prompt is 9 tokens, over data.max_prompt_tokens=5"):
        prepare_rows(load_split(err), err, tok)


def test_parallel_preparation_equals_serial():
    tok = tiny_tokenizer()
    rows = [
        {"question": f"what is {i % 97} + {i % 13}", "answer": "x", "system": None, "fields": {}} for i in range(2500)
    ]
    t = get_template("r1_base")
    assert render_all(rows, tok, t, num_workers=2) == render_all(rows, tok, t, num_workers=1)


def test_builtin_task_order_is_untouched_by_preparation():
    from rlvr.data import arithmetic

    cfg = DataConfig(template="plain", train_size=300)
    prepared = prepare_rows(load_split(cfg), cfg, tiny_tokenizer())
    assert [r["question"] for r in prepared.rows] == [r["question"] for r in arithmetic(300, seed=1, difficulty=1)]


# --- CLI -------------------------------------------------------------------------------------


def test_cli_preview_stats_prepare(tmp_path, capsys, chat_model):
    path = jsonl(tmp_path / "gsm.jsonl", GSM)
    assert main(["data", "preview", str(path), f"model.path={chat_model}", "data.system_prompt=", "--n", "1"]) == 0
    out = capsys.readouterr().out
    assert "preset auto -> gsm8k" in out
    assert "<|user|>A conversation between User and Assistant." in out
    assert "Natalia sold 48 clips. How many?\n<|assistant|><think>⟪END⟫" in out
    assert "gold answer: '1234'" in out
    assert main(["data", "stats", str(path), f"model.path={chat_model}", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["train"]["rows"] == 2 and stats["test"]["rows"] == 0
    assert main(["data", "prepare", str(path), f"model.path={chat_model}"]) == 0
    assert "train: 2 rows already cached" in capsys.readouterr().out  # preview and stats built the cache


def test_cli_data_errors_are_one_line(tmp_path, capsys, chat_model):
    path = jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "1"}, {"question": "q2", "solution": "4"}])
    assert main(["data", "preview", str(path), f"model.path={chat_model}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ") and "d.jsonl:2: row has no 'answer'" in err
    assert main(["data", "stats", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl not found" in capsys.readouterr().err
