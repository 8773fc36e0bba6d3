"""Prompt data: the arithmetic generator, JSONL loading and its errors, the prompt stream, prompt rendering."""

import json
import re
from collections import Counter

import pytest

from rlvr.config import DataConfig
from rlvr.data import R1_INSTRUCTION, PromptStream, arithmetic, build_messages, load_jsonl, render_prompt
from rlvr.data.loading import load_rows
from rlvr.errors import UserError
from rlvr.models.tiny import tiny_tokenizer

QUESTION = re.compile(r"^What is ([0-9 +\-*]+)\?$")


def _expr(row: dict) -> str:
    m = QUESTION.match(row["question"])
    assert m, row["question"]
    return m.group(1)


# --- arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_arithmetic_deterministic_per_seed(difficulty):
    a = arithmetic(50, seed=3, difficulty=difficulty)
    b = arithmetic(50, seed=3, difficulty=difficulty)
    c = arithmetic(50, seed=4, difficulty=difficulty)
    assert a == b
    assert a != c
    assert len(a) == 50


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_arithmetic_answers_are_correct(difficulty):
    for row in arithmetic(300, seed=11, difficulty=difficulty):
        expr = _expr(row)
        assert row["answer"] == str(eval(expr)), row  # noqa: S307 - digits and + - * only (checked by the regex)


def _operands(rows):
    return [[int(x) for x in re.findall(r"\d+", _expr(r))] for r in rows]


def test_arithmetic_difficulty_1_is_single_digit_addition():
    rows = arithmetic(400, seed=0, difficulty=1)
    for row, ops in zip(rows, _operands(rows)):
        assert re.fullmatch(r"\d \+ \d", _expr(row))
        assert all(1 <= x <= 9 for x in ops)
    # only 81 distinct problems exist; 400 draws see most of them
    assert len({r["question"] for r in rows}) > 60


def test_arithmetic_difficulty_2_is_add_or_subtract_up_to_20_never_negative():
    rows = arithmetic(400, seed=0, difficulty=2)
    kinds = Counter()
    for row, ops in zip(rows, _operands(rows)):
        expr = _expr(row)
        assert re.fullmatch(r"\d+ [+-] \d+", expr)
        assert all(1 <= x <= 20 for x in ops)
        assert int(row["answer"]) >= 0
        kinds["+" if "+" in expr else "-"] += 1
    assert kinds["+"] > 50 and kinds["-"] > 50


def test_arithmetic_difficulty_3_products_and_three_terms():
    rows = arithmetic(400, seed=0, difficulty=3)
    kinds = Counter()
    for row, ops in zip(rows, _operands(rows)):
        expr = _expr(row)
        if "*" in expr:
            assert re.fullmatch(r"\d+ \* \d+", expr)
            assert all(2 <= x <= 12 for x in ops)
            kinds["*"] += 1
        else:
            assert re.fullmatch(r"\d+ - \d+ \+ \d+", expr)
            a, b, c = ops
            assert 10 <= a <= 99 and 1 <= b <= 50 and 1 <= c <= 50
            kinds["-+"] += 1
    assert kinds["*"] > 50 and kinds["-+"] > 50


def test_arithmetic_difficulty_4_three_operands_up_to_99():
    rows = arithmetic(400, seed=0, difficulty=4)
    ops_seen = set()
    for row, ops in zip(rows, _operands(rows)):
        expr = _expr(row)
        assert len(ops) == 3
        assert sum(2 <= x <= 9 for x in ops) >= 1  # the small multiplier
        assert all(2 <= x <= 99 for x in ops)
        assert "*" in expr
        ops_seen.add(re.fullmatch(r"\d+ ([+\-*]) \d+ [*+] \d+", expr).group(1))
    assert ops_seen == {"+", "-", "*"}


def test_arithmetic_exclude_keeps_test_problems_out_when_possible():
    test = arithmetic(20, seed=2, difficulty=3)
    exclude = {r["question"] for r in test}
    train = arithmetic(200, seed=1, difficulty=3, exclude=exclude)
    assert len(train) == 200
    assert not exclude & {r["question"] for r in train}


def test_arithmetic_exclude_gives_up_when_impossible():
    everything = {f"What is {a} + {b}?" for a in range(1, 10) for b in range(1, 10)}
    rows = arithmetic(5, seed=0, difficulty=1, exclude=everything)  # must terminate
    assert len(rows) == 5


def test_load_rows_arithmetic_uses_config_seeds():
    train, test = load_rows(DataConfig(train_size=30, test_size=7, train_seed=5, test_seed=6, difficulty=2))
    assert train == arithmetic(30, seed=5, difficulty=2)
    assert test == arithmetic(7, seed=6, difficulty=2)


# --- JSONL -----------------------------------------------------------------------------------


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_load_jsonl_custom_keys_gsm8k_and_blank_lines(tmp_path):
    path = _write(
        tmp_path / "d.jsonl",
        [
            json.dumps({"problem": "2+2?", "solution": "Add them.\n#### 4"}),
            "",
            "   ",
            json.dumps({"problem": "Big?", "solution": "#### 1,000", "extra": 1}),
            json.dumps({"problem": "Int?", "solution": 42}),
        ],
    )
    rows = load_jsonl(path, question_key="problem", answer_key="solution")
    assert rows == [
        {"question": "2+2?", "answer": "4"},
        {"question": "Big?", "answer": "1,000"},
        {"question": "Int?", "answer": "42"},
    ]


def test_load_jsonl_default_keys_and_unicode(tmp_path):
    path = _write(tmp_path / "d.jsonl", [json.dumps({"question": "Wie viel ist 3·4? ü", "answer": "12"}, ensure_ascii=False)])
    assert load_jsonl(path) == [{"question": "Wie viel ist 3·4? ü", "answer": "12"}]


def test_load_jsonl_missing_file(tmp_path):
    with pytest.raises(UserError, match=r"data file .*nope\.jsonl not found"):
        load_jsonl(tmp_path / "nope.jsonl")


def test_load_jsonl_bad_json_names_file_and_line(tmp_path):
    path = _write(tmp_path / "d.jsonl", [json.dumps({"question": "q", "answer": "1"}), "", '{"question": "q", "answer": '])
    with pytest.raises(UserError) as e:
        load_jsonl(path)
    assert f"{path}:3: not valid JSON" in str(e.value)
    assert "\n" not in str(e.value)


def test_load_jsonl_non_object_line(tmp_path):
    path = _write(tmp_path / "d.jsonl", [json.dumps({"question": "q", "answer": "1"}), json.dumps(["q", "1"])])
    with pytest.raises(UserError, match=rf"{re.escape(str(path))}:2: expected a JSON object, got list"):
        load_jsonl(path)


def test_load_jsonl_row_without_answer_key(tmp_path):
    path = _write(
        tmp_path / "d.jsonl",
        [json.dumps({"question": "q", "answer": "1"}), json.dumps({"question": "q2", "target": "2", "id": 7})],
    )
    with pytest.raises(UserError) as e:
        load_jsonl(path)
    msg = str(e.value)
    assert f"{path}:2:" in msg
    assert "no 'answer'" in msg
    assert "keys present: id, question, target" in msg
    assert "data.answer_key" in msg


def test_load_jsonl_row_without_question_key(tmp_path):
    path = _write(tmp_path / "d.jsonl", [json.dumps({"prompt": "q", "answer": "1"})])
    with pytest.raises(UserError, match=r":1: row has no 'question'.*keys present: answer, prompt.*data\.question_key"):
        load_jsonl(path)


def test_load_jsonl_empty_answer_counts_as_missing(tmp_path):
    path = _write(tmp_path / "d.jsonl", [json.dumps({"question": "q", "answer": ""})])
    with pytest.raises(UserError, match="no 'answer'"):
        load_jsonl(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_load_jsonl_empty_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(UserError, match="holds no rows"):
        load_jsonl(path)


def test_load_jsonl_not_utf8(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"question": "café", "answer": "1"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        load_jsonl(path)


def test_load_rows_jsonl_train_and_test(tmp_path):
    train = _write(tmp_path / "train.jsonl", [json.dumps({"q": "a", "a": "1"}), json.dumps({"q": "b", "a": "2"})])
    test = _write(tmp_path / "test.jsonl", [json.dumps({"q": "c", "a": "3"})])
    cfg = DataConfig(task="jsonl", path=str(train), test_path=str(test), question_key="q", answer_key="a")
    tr, te = load_rows(cfg)
    assert [r["answer"] for r in tr] == ["1", "2"]
    assert te == [{"question": "c", "answer": "3"}]
    tr, te = load_rows(DataConfig(task="jsonl", path=str(train), question_key="q", answer_key="a"))
    assert te == []


# --- PromptStream ----------------------------------------------------------------------------


def test_stream_is_a_pure_function_of_seed_and_step():
    walked = PromptStream(23, 4, seed=5)
    history = [walked.batch(s) for s in range(8)]
    fresh = PromptStream(23, 4, seed=5)
    assert fresh.batch(7) == history[7]
    # out of order and repeated calls give the same batches
    assert [fresh.batch(s) for s in (3, 0, 7, 3)] == [history[3], history[0], history[7], history[3]]
    other = PromptStream(23, 4, seed=6)
    assert [other.batch(s) for s in range(8)] != history


def test_stream_covers_every_row_once_per_epoch_and_reshuffles():
    n, per_step = 10, 3  # epochs do not align with steps
    stream = PromptStream(n, per_step, seed=1)
    flat = [i for s in range(20) for i in stream.batch(s)]  # 60 positions = 6 epochs
    epochs = [flat[e * n : (e + 1) * n] for e in range(6)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(n))
    assert len({tuple(e) for e in epochs}) > 1  # a new order each epoch
    assert epochs[0] != list(range(n))  # shuffled, not in file order


def test_stream_batch_sizes_and_range():
    stream = PromptStream(5, 8, seed=0)  # more prompts per step than rows: wraps into the next epoch
    batch = stream.batch(0)
    assert len(batch) == 8
    assert all(0 <= i < 5 for i in batch)
    assert sorted(batch[:5]) == list(range(5))


# --- prompt rendering ------------------------------------------------------------------------


def test_build_messages():
    msgs = build_messages("What is 2 + 2?", template="r1", system_prompt="Be brief.")
    assert msgs == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": R1_INSTRUCTION + "What is 2 + 2?"},
    ]
    assert build_messages("Q", template="plain") == [{"role": "user", "content": "Q"}]


def test_render_prompt_without_chat_template():
    tok = tiny_tokenizer()
    assert not getattr(tok, "chat_template", None)
    text = render_prompt(tok, "What is 3 + 4?", system_prompt="You are terse.", assistant_prefix="<think>")
    assert R1_INSTRUCTION in text
    assert "What is 3 + 4?" in text
    assert "You are terse." in text
    assert text.index("You are terse.") < text.index(R1_INSTRUCTION) < text.index("What is 3 + 4?")
    assert text.endswith("assistant: <think>")


def test_render_prompt_plain_template_and_no_system():
    text = render_prompt(tiny_tokenizer(), "What is 3 + 4?", template="plain")
    assert R1_INSTRUCTION not in text
    assert "system" not in text
    assert text == "user: What is 3 + 4?\nassistant: "


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_render_prompt_with_chat_template():
    tok = tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    text = render_prompt(tok, "What is 3 + 4?", system_prompt="You are terse.", assistant_prefix="<think>")
    assert text == (
        "<|system|>You are terse.<|end|>"
        f"<|user|>{R1_INSTRUCTION}What is 3 + 4?<|end|>"
        "<|assistant|><think>"
    )
    # no prefix: ends right where the assistant turn opens
    assert render_prompt(tok, "Q", template="plain").endswith("<|user|>Q<|end|><|assistant|>")
