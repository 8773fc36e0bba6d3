"""Prompt data: the arithmetic generator and the prompt stream (files, presets, templates, preparation and
countdown are in test_data_files.py and test_data_templates.py)."""

import re
from collections import Counter

import pytest

from rlvr.config import DataConfig
from rlvr.data import PromptStream, arithmetic, arithmetic_tool
from rlvr.data.loading import load_rows

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
    strip = lambda rows: [{"question": r["question"], "answer": r["answer"]} for r in rows]  # noqa: E731
    assert strip(train) == arithmetic(30, seed=5, difficulty=2)
    assert strip(test) == arithmetic(7, seed=6, difficulty=2)
    assert all(r["system"] is None and r["fields"] == {} for r in train + test)


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


# --- arithmetic_tool -------------------------------------------------------------------------

TOOL_QUESTION = re.compile(r"^What is ([0-9 +\-*()]+)\?$")


@pytest.mark.parametrize("difficulty", [1, 2])
def test_arithmetic_tool_is_seeded_exact_and_hard_to_do_in_the_head(difficulty):
    rows = arithmetic_tool(400, seed=5, difficulty=difficulty)
    assert (
        rows
        == arithmetic_tool(400, seed=5, difficulty=difficulty)
        != arithmetic_tool(400, seed=6, difficulty=difficulty)
    )
    shapes = Counter()
    for row in rows:
        expr = TOOL_QUESTION.match(row["question"]).group(1)
        assert row["answer"] == str(eval(expr)), row  # noqa: S307 - digits, + - * and parentheses (the regex)
        shapes[re.sub(r"\d+", "n", expr)] += 1
        assert int(row["answer"]) >= 1000 or "-" in expr  # at least four digits: no single-step mental sum
    if difficulty == 1:
        assert set(shapes) == {"n * n"}
        ops = [[int(x) for x in re.findall(r"\d+", r["question"])] for r in rows]
        assert all(100 <= a <= 999 and 10 <= b <= 99 for a, b in ops)
    else:
        assert set(shapes) == {"n * n", "n * n + n", "(n + n) * n", "n * n - n * n"}
    assert len({r["question"] for r in rows}) > 390  # 90,000 products: few repeats
