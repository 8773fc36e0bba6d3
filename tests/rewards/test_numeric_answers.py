"""One rule for numeric gold answers (rlvr.rewards.extract.denoted_number), checked on a table.

``numeric_answers.jsonl`` (beside this file) holds completions in the answer styles of GSM8K and MATH
solutions, each with its gold and the score every accuracy rule must give: every notation of a number
in both directions, the arithmetic a model could copy from the question, bounds, and wrong numbers.
The same table runs through ``rlvr reward score`` (a verdict per row), through the Scorer that
training and ``rlvr eval`` use, and through each accuracy-type rule."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.evaluation.evaluate import _vote_key
from rlvr.rewards import Scorer, extract_answer, get, number_key
from rlvr.rewards.verify import numeric_match

TABLE = Path(__file__).with_name("numeric_answers.jsonl")
ROWS = [json.loads(line) for line in TABLE.read_text(encoding="utf-8").splitlines()]
RULES = ("accuracy", "accuracy_lenient")
NOTATIONS = ("thousands separator", "decimal", "fraction", "scientific notation", "currency", "unit text",
             "degree sign")  # fmt: skip
"""The notation classes the table has in both directions."""


def _expected(row: dict, rule: str) -> float:
    want = row["expected"]
    return float(want[rule] if isinstance(want, dict) else want)


def test_the_table_covers_every_notation_and_hack():
    classes = {r["class"] for r in ROWS}
    assert len(ROWS) >= 40
    assert {*NOTATIONS, "x = N", "percentage", "answer sentence", "work shown before", "arithmetic (hack)",
            "too coarse", "different number"} <= classes  # fmt: skip

    def bare(text: str, decimals: bool = True) -> bool:
        return re.fullmatch(r"-?\d+(\.\d+)?" if decimals else r"-?\d+", text) is not None

    for cls in NOTATIONS:  # both directions: the notation in the prediction, and in the gold
        rows = [r for r in ROWS if r["class"] == cls]
        assert any(bare(r["label"]) and extract_answer(r["completion"]) != r["label"] for r in rows), cls
        assert any(not bare(r["label"], decimals=False) and r["expected"] == 1 for r in rows), cls


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("row", ROWS, ids=[f"{i + 1}-{r['class']}" for i, r in enumerate(ROWS)])
def test_each_row_scores_as_expected(row, rule):
    assert get(rule)([row["completion"]], [row["label"]]) == [_expected(row, rule)]


def test_the_scorer_training_and_eval_use_agrees_with_the_table():
    """One batch through the Scorer with its worker pool (training's path; ``rlvr eval`` judges through it)."""
    res = Scorer(list(RULES), [1.0, 0.5], workers=1).score([r["completion"] for r in ROWS], [r["label"] for r in ROWS])
    for rule in RULES:
        assert res.per_rule[rule] == [_expected(r, rule) for r in ROWS]
    assert res.errors == {rule: 0 for rule in RULES}


@pytest.mark.parametrize("rule", ["math_17k_acc", "base_acc"])
def test_the_mindspeed_accuracy_rules_share_the_rule(rule):
    """The boxed-answer rules of the Ascend stacks grade the boxed rows as accuracy does (the same match)."""
    rows = [
        r
        for r in ROWS
        if r["completion"].startswith("<think>")
        and "\\boxed{" in r["completion"]
        and r["completion"].endswith("}</answer>")
    ]
    assert len(rows) > 30
    got = get(rule)([r["completion"] for r in rows], [r["label"] for r in rows])
    assert got == [_expected(r, "accuracy") for r in rows]


def test_rlvr_reward_score_gives_a_verdict_per_row(capsys):
    rc = main(["reward", "score", "--rules", ",".join(RULES), "--input", str(TABLE), "--workers", "0"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"{len(ROWS)} of {len(ROWS)} rows as expected" in out
    assert "[degree sign] answer '90^\\\\circ' gold '90'" in out


def test_a_row_scored_otherwise_is_a_bad_verdict_and_exit_1(tmp_path, capsys):
    """The negative control: the copied question claimed to be right is reported, and the command fails."""
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"completion": "<answer>\\boxed{3 + 4}</answer>", "label": "7", "expected": 1}) + "\n")
    rc = main(["reward", "score", "--rules", "accuracy", "--input", str(path), "--workers", "0"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "BAD  accuracy=0 (expected 1)" in out and "0 of 1 rows as expected" in out


@pytest.mark.parametrize(
    "a, b",
    [
        ("90^\\circ", "90"),
        ("1,234", "1234"),
        ("\\frac{1}{2}", "0.5"),
        ("x = 7", "7"),
        ("The answer is 18.", "18 dollars"),
        ("3 + 4 = 7", "\\$7"),
    ],
)
def test_answers_that_denote_one_number_vote_together(a, b):
    """maj@k in rlvr eval counts answers by the number they denote (the same rule), not by their text."""
    assert number_key(a) == number_key(b) is not None
    assert _vote_key(a) == _vote_key(b)


def test_an_expression_is_no_vote_for_its_value():
    assert _vote_key("3 + 4") != _vote_key("7")


@pytest.mark.parametrize(
    "pred",
    [
        "1" * 1_000_000,
        "9" * 4000,
        "1" * 5000 + ".5",
        "\\frac{" * 5000 + "1" + "}{2}" * 5000,
        "The answer is " + "1" * 1_000_000 + ".",
        "<answer>" * 10_000,
    ],
)
@pytest.mark.parametrize("gold", ["7", "\\frac{\\sqrt{2}}{2}"])
def test_huge_or_deeply_nested_predictions_end_within_the_time_limit_with_a_score(pred, gold):
    """A number of 10^6 digits or 5,000 nested \\frac: a score (0, or the error score after math-verify's
    time limit), no exception, and done within the limit (a generous bound, not a speed target)."""
    scorer = Scorer(["accuracy"], [1.0], timeout_s=2.0, workers=1)
    start = time.monotonic()
    res = scorer.score([f"<answer>\\boxed{{{pred}}}</answer>"], [gold])
    assert res.per_rule["accuracy"] == [0.0]
    assert time.monotonic() - start < 2.0 * 3 + 5
    assert numeric_match(pred, "7") in (False, None)
