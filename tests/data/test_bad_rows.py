"""``rlvr data preview`` on files holding every kind of bad row: each is exit 2 and
one ``error: FILE:LINE: ...`` line that names ``data.on_bad_row=skip``, never a traceback; with
``data.on_bad_row=skip`` every bad row, a line that is not JSON included, is
dropped and the good row is previewed."""

from __future__ import annotations

import json

import pytest

from rlvr.cli import main

GOOD = '{"question": "1+1?", "answer": "2"}'

NOT_JSON = "that is not valid JSON: 2"
NOT_OBJECT = "that is not a JSON object: 2"

# name -> (second line of a JSONL file, a word the error names, the note on_bad_row=skip prints
# for a line it skips before any preset sees it, or None for a row the preset rejects)
JSONL_ROWS = {
    "torn line": ('{"question": "2+2', "not valid JSON", NOT_JSON),
    "not JSON": ("hello world", "not valid JSON", NOT_JSON),
    "a number": ("42", "expected a JSON object", NOT_OBJECT),
    "null": ("null", "expected a JSON object", NOT_OBJECT),
    "a string": ('"abc"', "expected a JSON object", NOT_OBJECT),
    "NaN": ('{"question": "x", "answer": NaN}', "NaN", NOT_JSON),
    "Infinity": ('{"question": "x", "answer": -Infinity}', "Infinity", NOT_JSON),
    "5000-digit integer": ('{"question": "x", "answer": ' + "9" * 5000 + "}", "4300 digits", NOT_JSON),
    "100k-deep nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply", NOT_JSON),
    "deep nesting in a value": (
        '{"question": ' + "[" * 100_000 + "]" * 100_000 + ', "answer": "1"}',
        "nested",
        NOT_JSON,
    ),
    "a list row": ("[1, 2]", "no 'question'", None),
    "no question": ('{"answer": "2"}', "no 'question'", None),
    "no answer": ('{"question": "1+1?"}', "no 'answer'", None),
    "question is a list": ('{"question": ["a"], "answer": "2"}', "a list in 'question'", None),
    "question is an object": ('{"question": {"a": 1}, "answer": "2"}', "a dict in 'question'", None),
    "question is null": ('{"question": null, "answer": "2"}', "empty 'question'", None),
    "question is blank": ('{"question": "  ", "answer": "2"}', "empty 'question'", None),
    "answer is a bool": ('{"question": "x", "answer": true}', "a bool in 'answer'", None),
    "answer is a list": ('{"question": "x", "answer": [1]}', "a list in 'answer'", None),
    "answer is empty": ('{"question": "x", "answer": ""}', "empty 'answer'", None),
    "lone surrogate": ('{"question": "\\ud800", "answer": "2"}', "not valid Unicode", None),
    "surrogate in the system prompt": (
        '{"question": "x", "answer": "2", "system": "\\udfff"}',
        "not valid Unicode",
        None,
    ),
}


@pytest.fixture
def preview(tmp_path, monkeypatch, capsys, chat_model):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))

    def run(path, *extra):
        rc = main(
            ["data", "preview", str(path), f"model.path={chat_model}", "data.system_key=system", *extra, "--n", "3"]
        )
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return rc, out, err

    return run


def _one_error(rc, err, path, needle):
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {path}") and needle in err, err


@pytest.mark.parametrize("name", JSONL_ROWS)
def test_every_bad_jsonl_row_is_one_line_and_exit_2(name, tmp_path, preview):
    line, needle, note = JSONL_ROWS[name]
    path = tmp_path / "data.jsonl"
    path.write_text(GOOD + "\n" + line + "\n")
    rc, _, err = preview(path)
    _one_error(rc, err, path, needle)
    assert f"{path}:2:" in err and "data.on_bad_row=skip" in err  # the line, and the setting that skips it
    rc, out, err = preview(path, "data.on_bad_row=skip")  # the skip policy drops just that row
    assert rc == 0, err
    assert "1+1?" in out
    assert "1 train rows" in out
    if note:
        assert f"# train: skipped 1 line of {path} {note}\n" in out


@pytest.mark.parametrize(
    "name, content, needle",
    [
        ("not UTF-8", GOOD.encode() + b'\n{"question": "\xff\xfe", "answer": "2"}\n', "not UTF-8"),
        ("empty file", b"", "no rows"),
        ("blank lines only", b"\n\n \n", "no rows"),
        ("NUL in a row", GOOD.encode() + b'\n{"question": "a\x00b", "answer": "2"}\n', "not valid JSON"),
    ],
)
def test_bad_files(name, content, needle, tmp_path, preview):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    rc, _, err = preview(path)
    _one_error(rc, err, path, needle)


@pytest.mark.parametrize(
    "suffix, text, needle",
    [
        (".csv", 'question,answer\n1+1?,2\n"unterminated,3\n', "EOF inside string"),
        (".csv", "question,answer,extra\n1+1?,2\nx,3,4,5,6\n", "Expected 3 fields"),
        (".json", GOOD, "expected a JSON list"),
        (".json", "[1, 2", "not valid JSON"),
        (".parquet", "not parquet", "could not be read as parquet"),
    ],
)
def test_malformed_csv_json_parquet(suffix, text, needle, tmp_path, preview):
    path = tmp_path / f"data{suffix}"
    path.write_text(text)
    rc, _, err = preview(path)
    _one_error(rc, err, path, needle)


def test_skipped_lines_are_one_note_and_counted_in_preview_stats_prepare(tmp_path, preview, capsys, chat_model):
    """`data.on_bad_row=skip` used to stop at the first torn line; now every command skips it."""
    path = tmp_path / "bad.jsonl"
    lines = [GOOD, '{"question": "2+2', '{"question": "3+3?", "answer": "6"}', "", "", "", "{oops", "7"]
    path.write_text("\n".join(lines) + "\n")
    note = f"# train: skipped 2 lines of {path} that are not valid JSON: 2, 7\n"
    rc, out, err = preview(path, "data.on_bad_row=skip")
    assert rc == 0, err
    assert out.count(note) == 1 and "2 train rows" in out
    assert f"# train: skipped 1 line of {path} that is not a JSON object: 8\n" in out
    assert "left out 2 not valid JSON, 1 not a JSON object" in out
    for command in ("stats", "prepare"):
        argv = ["data", command, str(path), f"model.path={chat_model}", "data.on_bad_row=skip"]
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert out.count(note) == 1, (command, out, err)
    assert main(["data", "stats", str(path), f"model.path={chat_model}", "data.on_bad_row=skip", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["train"]
    assert stats["rows"] == 2 and stats["dropped"] == {"not valid JSON": 2, "not a JSON object": 1}


def test_a_file_of_only_bad_lines_has_no_usable_rows(tmp_path, preview):
    path = tmp_path / "data.jsonl"
    path.write_text('{"question": "2+2\n[1\n')
    rc, _, err = preview(path, "data.on_bad_row=skip")
    _one_error(rc, err, "no usable rows in", "2 not valid JSON left out")


def test_json_records_that_are_not_objects_are_skipped(tmp_path, preview):
    path = tmp_path / "data.json"
    path.write_text(f"[{GOOD}, 3, null]")
    rc, _, err = preview(path)
    _one_error(rc, err, path, "row 2: expected a JSON object, got int")
    assert "data.on_bad_row=skip" in err
    rc, out, err = preview(path, "data.on_bad_row=skip")
    assert rc == 0, err
    assert f"# train: skipped 2 rows of {path} that are not a JSON object: 2, 3\n" in out


def test_odd_but_valid_rows_preview(tmp_path, preview):
    """A numeric question, a NUL escaped in JSON, a 200 kB question, a BOM: readable, so shown."""
    path = tmp_path / "data.jsonl"
    rows = [
        {"question": 5, "answer": 2},
        {"question": "a\u0000b", "answer": "2"},
        {"question": "9" * 200_000, "answer": "1"},
    ]
    path.write_text("\ufeff" + "\n".join(json.dumps(r) for r in rows) + "\n")
    rc, out, err = preview(path)
    assert rc == 0, err
    assert "gold answer: '2'" in out


def test_system_key_applies_to_a_detected_preset(tmp_path, preview):
    """Found here: with data.preset=auto, data.system_key was ignored and the default system prompt used."""
    path = tmp_path / "data.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2", "system": "Be brief."}\n')
    rc, out, err = preview(path)
    assert rc == 0, err
    assert "Be brief." in out
