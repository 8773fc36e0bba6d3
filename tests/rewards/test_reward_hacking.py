"""Copying the question never pays on a built-in task.

Every built-in task's rows (arithmetic difficulty 1-4, countdown 1-4) are scored the way the
trainer scores them (``rule(completions, labels, **fields)`` with the rows' other keys as
fields) with copies of the question in every wrapping a model could use."""

from __future__ import annotations

import re

import pytest

from rlvr.config import DataConfig
from rlvr.data import load_split
from rlvr.rewards import Scorer, get

ACCURACY_RULES = ["accuracy", "accuracy_lenient", "math_17k_acc", "base_acc"]
QUICKSTART = (["accuracy", "accuracy_lenient", "format_partial"], [1.0, 0.5, 0.5])


def _copies(question: str) -> list[str]:
    """The question, and for arithmetic its expression (``What is 3 + 4?`` -> ``3 + 4``, ``3+4``),
    bare, in ``<answer>``, boxed, and in the full R1 format."""
    texts = [question]
    expr = re.fullmatch(r"What is (.*)\?", question)
    if expr:
        texts += [expr.group(1), expr.group(1).replace(" ", "")]
    out = []
    for t in texts:
        out += [
            t,
            f"<answer>{t}</answer>",
            f"<answer>\\boxed{{{t}}}</answer>",
            f"\\boxed{{{t}}}",
            f"<think>{question}</think><answer>\\boxed{{{t}}}</answer>",
            f"<think>{t} = ?</think><answer>{t}</answer>",
        ]
    return out


def _batch(task: str, difficulty: int, n: int = 60):
    rows = load_split(DataConfig(task=task, difficulty=difficulty, test_size=n), "test").rows
    completions, labels, fields = [], [], {k: [] for k in rows[0] if k != "answer"}
    for r in rows:
        for c in _copies(r["question"]):
            completions.append(c)
            labels.append(r["answer"])
            for k in fields:
                fields[k].append(r[k])
    return completions, labels, fields


TASKS = [(t, d) for t in ("arithmetic", "countdown") for d in (1, 2, 3, 4)]


@pytest.mark.parametrize("task, difficulty", TASKS)
@pytest.mark.parametrize("rule", ACCURACY_RULES)
def test_copying_the_question_scores_zero(task, difficulty, rule):
    completions, labels, fields = _batch(task, difficulty)
    scores = get(rule)(completions, labels, **fields)
    paid = [(c, a) for c, a, s in zip(completions, labels, scores) if s != 0.0]
    assert not paid, paid[:5]


@pytest.mark.parametrize("task, difficulty", TASKS)
def test_copying_the_question_earns_no_quickstart_accuracy(task, difficulty):
    completions, labels, fields = _batch(task, difficulty)
    res = Scorer(*QUICKSTART, workers=0).score(completions, labels, fields)
    assert set(res.per_rule["accuracy"]) == set(res.per_rule["accuracy_lenient"]) == {0.0}
    assert res.errors == {"accuracy": 0, "accuracy_lenient": 0, "format_partial": 0}
    bare = [t for c, t in zip(completions, res.total) if "<" not in c and "\\boxed" not in c]
    assert bare and set(bare) == {0.0}  # the copy alone, untagged: 0 in total


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>\\boxed{3 + 4}</answer>",
        "<answer>3+4</answer>",
        "<answer>3 + 4</answer>",
        "\\boxed{3 \\times 1 + 4}",
        "What is 3 + 4?",
    ],
)
def test_issue_examples(completion):
    for rule in ("accuracy", "accuracy_lenient"):
        assert get(rule)([completion], ["7"]) == [0.0]


def test_lenient_still_pays_for_a_stated_result():
    lenient = get("accuracy_lenient")
    assert lenient(["<think> 6 + 2 = 8", "so 14 - 7 = 7.", "the sum is 8"], ["8", "7", "8"]) == [1.0, 1.0, 1.0]
    assert lenient(["What is 14 - 7?", "14 - 7"], ["7", "7"]) == [0.0, 0.0]  # the copy's last number is an operand


def test_countdown_grades_the_expression_not_the_target():
    row = load_split(DataConfig(task="countdown", test_size=1), "test").rows[0]
    f = row["fields"]
    good, target = f"<think>x</think><answer>{f['solution']}</answer>", f"<answer>\\boxed{{{row['answer']}}}</answer>"
    for rule in ("accuracy", "accuracy_lenient", "countdown"):
        assert get(rule)([good, target], [row["answer"]] * 2, fields=[f, f]) == [1.0, 0.0], rule
    assert get("countdown")([good], [row["answer"]], numbers=[f["numbers"]]) == [1.0]  # `rlvr reward score` shape


# -- the R1 template's example text copied back (issue 59) ---------------------------------------------

TEMPLATE = "<think> reasoning process here </think><answer> answer here </answer>"
WORKED = "<think>7 and 5 make 12</think><answer>\\boxed{12}</answer>"


@pytest.mark.parametrize(
    "completion, scores",
    [
        # completion: (format, strict_format, format_partial, tag_count)
        (TEMPLATE, (0.0, 0.0, 0.25, 0.0)),  # the instruction's example, word for word
        ("<think>Reasoning process here.</think>\n<answer>Answer here.</answer>", (0.0, 0.0, 0.25, 0.0)),
        ("<think></think><answer>\\boxed{12}</answer>", (0.0, 0.0, 0.25, 0.5)),  # an empty think
        ("<think> \n ... </think><answer>\\boxed{12}</answer>", (0.0, 0.0, 0.25, 0.5)),  # punctuation only
        ("<think>7 and 5 make 12</think><answer> answer here </answer>", (0.0, 0.0, 0.5, 0.5)),
        ("<think>7 and 5 make 12</think><answer></answer>", (0.0, 0.0, 0.5, 0.5)),
        (WORKED, (1.0, 1.0, 1.0, 1.0)),  # real text in both blocks pays as before
        ("<think>the reasoning process here is short</think><answer>\\boxed{12}</answer>", (1.0, 1.0, 1.0, 1.0)),
    ],
)
def test_rlvrs_format_rules_pay_nothing_for_the_templates_placeholders(completion, scores):
    got = tuple(
        get(rule)([completion], ["12"])[0] for rule in ("format", "strict_format", "format_partial", "tag_count")
    )
    assert got == scores


@pytest.mark.parametrize("rule, pays", [("format_reward", 1.0), ("ms_strict_format", -0.5)])
def test_the_replicas_keep_their_originals_behaviour(rule, pays):
    """MindRLHF's format_reward (= MindSpeed-RL's format) pays for the template's text as its original
    does; MindSpeed-RL's strict_format wants a box, so it never did."""
    assert get(rule)([TEMPLATE], ["12"]) == [pays]
