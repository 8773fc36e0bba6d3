"""Hostile data files (issue 62.3): a JSONL line of 1 GiB, a file of 10^5 columns, a prompt of 10^6 tokens.
Each ends fast, with bounded memory, as exit 2 and one ``error:`` line that names the file or row and the
limit, through ``rlvr data preview`` (the command that reads data as training does) or ``load_split``."""

from __future__ import annotations

import importlib
import json
import time
import tracemalloc

import pytest

from rlvr.cli import main
from rlvr.config import DataConfig
from rlvr.data import load_split
from rlvr.data.files import MAX_COLUMNS, MAX_LINE_MIB, read_file
from rlvr.errors import UserError
from rlvr.models.tiny import save_tiny_model

GOOD = '{"question": "1+1?", "answer": "2"}'
PREPARE = importlib.import_module("rlvr.data.prepare")  # the module (rlvr.data.prepare is also a function's name)


@pytest.fixture
def preview(tmp_path, monkeypatch, capsys, chat_model):
    """``rlvr data preview PATH`` on the tiny chat model: (exit code, stdout, stderr)."""
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))

    def run(path, *extra, model=chat_model):
        rc = main(["data", "preview", str(path), f"model.path={model}", *extra, "--n", "1"])
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return rc, out, err

    return run


def _one_line(rc: int, err: str, *needles: str) -> str:
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err
    return err.strip()


# --- a JSONL line of 1 GiB -------------------------------------------------------------------


def test_the_line_limit_is_the_config_default():
    assert DataConfig().max_line_mib == MAX_LINE_MIB


def test_a_gib_line_is_refused_holding_a_mib(tmp_path):
    """A sparse file (no disk, no time to write): line 2 is 1 GiB of NULs with no newline. The default
    limit refuses it after looking 256 MiB ahead, a MiB at a time; nothing near the line is ever held."""
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.write(GOOD.encode() + b'\n{"question": "')
        f.truncate(f.tell() + (1 << 30))
    tracemalloc.start()
    try:
        with pytest.raises(UserError) as e:
            load_split(DataConfig(task="files", path=str(path)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(e.value) == (
        f"{path}:2: a line of more than 256 MiB (data.max_line_mib=256), too long for one row; "
        "write one JSON object per line, or raise data.max_line_mib"
    )
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB traced while refusing the line"


def test_a_line_over_data_max_line_mib_is_one_line_and_exit_2(tmp_path, preview):
    path = tmp_path / "d.jsonl"
    path.write_text(GOOD + "\n" + json.dumps({"question": "9" * (3 << 19), "answer": "7"}) + "\n")  # a 1.5 MiB word
    for extra in ([], ["data.on_bad_row=skip"]):  # a resource bound, not a bad row: skip does not skip it
        rc, _, err = preview(path, "data.max_line_mib=1", *extra)
        _one_line(
            rc, err, f"error: {path}:2: a line of more than 1 MiB (data.max_line_mib=1)", "raise data.max_line_mib"
        )
    rc, out, err = preview(path, "data.max_line_mib=2")
    assert rc == 0 and "2 train rows" in out, err


def test_lines_longer_than_a_read_chunk_parse_and_count_as_before(tmp_path):
    """A long line is read twice (its end found, then the line): its value and the line numbers after it
    are those of a file read whole, a BOM and a last line without a newline included."""
    rows = [{"question": "x" * (5 << 19), "answer": "1"}, {"question": "q", "answer": "3"}]
    rows.append({"question": "é" * (3 << 20), "answer": "2"})  # 6 MiB in UTF-8
    path = tmp_path / "d.jsonl"
    path.write_text("\ufeff" + "\n\n".join(json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8")
    source = read_file(path)
    assert source.records == rows and source.lines == [1, 3, 5]
    path.write_text(path.read_text(encoding="utf-8") + "\n{oops\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"{path.name}:6: not valid JSON"):
        read_file(path)


# --- 10^5 columns ----------------------------------------------------------------------------


def _wide_files(tmp_path, n: int) -> dict[str, tuple]:
    """name -> (path, columns): one row of ``n`` extra columns besides question and answer, per format."""
    row = {"question": "1+1?", "answer": "2", **{f"k{i}": "v" for i in range(n)}}
    files = {}
    files["jsonl"] = tmp_path / "wide.jsonl"
    files["jsonl"].write_text(json.dumps(row) + "\n")
    files["json list"] = tmp_path / "list.json"
    files["json list"].write_text(json.dumps([row]))
    files["json columns"] = tmp_path / "columns.json"
    files["json columns"].write_text(json.dumps({k: [v] for k, v in row.items()}))
    files["csv"] = tmp_path / "wide.csv"
    files["csv"].write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    return {name: (path, n + 2) for name, path in files.items()}


def _arrow_files(tmp_path, n: int) -> dict[str, tuple]:
    """Parquet and Arrow stream files of ``n + 2`` columns (building 10^5 Arrow columns takes seconds)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"question": ["1+1?"], "answer": ["2"], **{f"k{i}": ["v"] for i in range(n)}})
    pq.write_table(table, tmp_path / "wide.parquet")
    with pa.OSFile(str(tmp_path / "wide.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return {"parquet": (tmp_path / "wide.parquet", n + 2), "arrow": (tmp_path / "wide.arrow", n + 2)}


def test_a_file_of_a_hundred_thousand_columns_is_one_line_at_once(tmp_path, preview):
    """10^5 columns, in every format that names them: refused from the row, header or schema. The CSV
    took over a minute and a GiB inside pandas and Arrow before this check."""
    files = {**_wide_files(tmp_path, 100_000), **_arrow_files(tmp_path, MAX_COLUMNS)}
    for name, (path, columns) in files.items():
        t0 = time.perf_counter()
        rc, _, err = preview(path)
        where = f"{path}:1" if name == "jsonl" else f"{path} row 1" if name == "json list" else f"{path}"
        _one_line(rc, err, f"error: {where}: {columns:,} columns (keys), more than the 1,000 a data row may have")
        assert len(err) < 300, err  # not a list of the keys
        assert time.perf_counter() - t0 < 30, name  # a guard against the minute, not a timing claim


def test_a_thousand_columns_are_read(tmp_path, preview):
    for path, _ in _wide_files(tmp_path, MAX_COLUMNS - 2).values():
        rc, out, err = preview(path)
        assert rc == 0 and "1 train rows" in out, (path, err)


def test_a_saved_dataset_of_too_many_columns(tmp_path, preview):
    """A save_to_disk folder (a Dataset and a DatasetDict): its columns are counted before its rows are listed."""
    import datasets

    datasets.disable_progress_bars()  # as rlvr does
    ds = datasets.Dataset.from_dict({"question": ["1+1?"], "answer": ["2"], **{f"k{i}": ["v"] for i in range(1000)}})
    ds.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    for folder, where in ((tmp_path / "one", tmp_path / "one"), (tmp_path / "dict", f"{tmp_path / 'dict'}[train]")):
        rc, _, err = preview(folder)
        _one_line(rc, err, f"error: {where}: 1,002 columns (keys), more than the 1,000")


# --- a prompt of 10^6 tokens -----------------------------------------------------------------


def _byte_level_model(path):
    """A tiny model whose tokenizer is byte-level BPE without merges: a token per byte, a tokenizer that
    encodes every byte as most LLMs' do (its longest entries, '<pad>' and '<eos>', are 5 characters)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    save_tiny_model(path)  # max_position_embeddings 256: the context
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", *sorted(pre_tokenizers.ByteLevel.alphabet())])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>").save_pretrained(path)
    return path


@pytest.fixture
def counted(monkeypatch) -> list:
    """Every token count preparation returns, None for a prompt refused by its characters (not tokenised)."""
    seen: list = []
    real = PREPARE._render_chunk

    def spy(bounds):
        prompts, counts = real(bounds)
        seen.extend(counts)
        return prompts, counts

    monkeypatch.setattr(PREPARE, "_render_chunk", spy)
    return seen


def test_a_prompt_of_a_million_tokens_is_refused_without_tokenising_it(tmp_path, preview, counted):
    model = _byte_level_model(tmp_path / "m")
    path = tmp_path / "d.jsonl"
    path.write_text(GOOD + "\n" + json.dumps({"question": "7" * 10**6, "answer": "7"}) + "\n")
    rc, _, err = preview(path, "data.template=plain", "data.assistant_prefix=", model=model)
    _one_line(
        rc,
        err,
        "error: train row 2: the prompt is 1,000,000 characters, more than the model's context of 256 tokens can hold",
        "set data.max_prompt_tokens to at most 256 to drop such prompts",
    )
    assert counted[0] is not None and counted[1] is None  # the path: row 2 was never tokenised
    counted.clear()
    rc, out, err = preview(
        path, "data.template=plain", "data.assistant_prefix=", "data.max_prompt_tokens=64", model=model
    )  # drop: counted
    assert rc == 0 and "dropped 1 prompts over data.max_prompt_tokens=64" in out and "1 train rows" in out, err
    assert counted == [counted[0], None]


def test_a_prompt_over_the_context_is_counted_where_characters_bound_nothing(tmp_path, preview, counted):
    """A word-level tokenizer may read a whole word as one unknown token: no character bound, the prompt is
    tokenised and its count named."""
    path = tmp_path / "d.jsonl"
    path.write_text(GOOD + "\n" + json.dumps({"question": " ".join(["7"] * 300), "answer": "7"}) + "\n")
    rc, _, err = preview(path)
    _one_line(rc, err, "error: train row 2: the prompt is 3", " tokens, over the model's context of 256 tokens")
    assert None not in counted


def test_the_character_bound_holds_for_a_trained_byte_level_bpe():
    """chars_bound's claim, that a prompt of c characters is at least c / K tokens (K: the longest entry),
    checked on a byte-level BPE with merges, for text it was trained on and text it was not."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["the answer is 42", "7 7 7 7 7 7", "=" * 64, "über straße ünd ärger", "数学 问题 答案"] * 50
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core)
    longest = PREPARE.chars_bound(tok, 1) // 2
    assert longest == max(map(len, tok.get_vocab())) > 10
    for text in [*set(corpus), "=" * 1000, "7 " * 500, "数学" * 300, "zzz qqq"]:
        assert len(tok(text)["input_ids"]) >= len(text) / longest, text
    from rlvr.models.tiny import tiny_tokenizer

    assert PREPARE.chars_bound(tiny_tokenizer(), 256) == 0  # word-level: an unknown word is one token
    assert PREPARE.chars_bound(tok, 0) == 0
