"""``rlvr data preview`` on files holding every kind of bad row (issue 11, item 5): each is exit 2 and
one ``error: FILE:LINE: ...`` line, never a traceback; with ``data.on_bad_row=skip`` the row-level
ones are dropped and the good row is previewed."""

from __future__ import annotations

import json

import pytest

from rlvr.cli import main

GOOD = '{"question": "1+1?", "answer": "2"}'

# name -> (second line of a JSONL file, a word the error names, dropped by on_bad_row=skip)
JSONL_ROWS = {
    "torn line": ('{"question": "2+2', "not valid JSON", False),
    "not JSON": ("hello world", "not valid JSON", False),
    "a number": ("42", "expected a JSON object", False),
    "null": ("null", "expected a JSON object", False),
    "a string": ('"abc"', "expected a JSON object", False),
    "NaN": ('{"question": "x", "answer": NaN}', "NaN", False),
    "Infinity": ('{"question": "x", "answer": -Infinity}', "Infinity", False),
    "5000-digit integer": ('{"question": "x", "answer": ' + "9" * 5000 + "}", "4300 digits", False),
    "100k-deep nesting": ("[" * 100_000 + "]" * 100_000, "nested too deeply", False),
    "deep nesting in a value": ('{"question": ' + "[" * 100_000 + "]" * 100_000 + ', "answer": "1"}', "nested", False),
    "a list row": ("[1, 2]", "no 'question'", True),
    "no question": ('{"answer": "2"}', "no 'question'", True),
    "no answer": ('{"question": "1+1?"}', "no 'answer'", True),
    "question is a list": ('{"question": ["a"], "answer": "2"}', "a list in 'question'", True),
    "question is an object": ('{"question": {"a": 1}, "answer": "2"}', "a dict in 'question'", True),
    "question is null": ('{"question": null, "answer": "2"}', "empty 'question'", True),
    "question is blank": ('{"question": "  ", "answer": "2"}', "empty 'question'", True),
    "answer is a bool": ('{"question": "x", "answer": true}', "a bool in 'answer'", True),
    "answer is a list": ('{"question": "x", "answer": [1]}', "a list in 'answer'", True),
    "answer is empty": ('{"question": "x", "answer": ""}', "empty 'answer'", True),
    "lone surrogate": ('{"question": "\\ud800", "answer": "2"}', "not valid Unicode", True),
    "surrogate in the system prompt": (
        '{"question": "x", "answer": "2", "system": "\\udfff"}',
        "not valid Unicode",
        True,
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
    line, needle, skippable = JSONL_ROWS[name]
    path = tmp_path / "data.jsonl"
    path.write_text(GOOD + "\n" + line + "\n")
    rc, _, err = preview(path)
    _one_error(rc, err, path, needle)
    if skippable:  # a row-level problem names the line, and the skip policy drops just that row
        assert f"{path}:2:" in err
        rc, out, err = preview(path, "data.on_bad_row=skip")
        assert rc == 0, err
        assert "1+1?" in out


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
