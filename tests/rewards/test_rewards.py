"""Reward tables: extraction, equivalence, accuracy and format rules (pure, fast)."""

import math

import pytest

from rlvr.rewards import (
    REWARDS,
    answer_is,
    answer_tag,
    answers_match,
    extract_answer,
    get,
    gold_answer,
    gsm8k_answer,
    last_boxed,
    last_number,
    minerva_answer,
    normalize_number,
)
from rlvr.rewards.rules import minerva_normalize
from rlvr.rewards.verify import numeric_match

TH = "<think>She sells 16 - 3 - 4 = 9 eggs at $2 each: 9 * 2 = 18.</think>"
R1 = "<think>2+3 is 5</think> <answer>\\boxed{5}</answer>"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{5}", "5"),
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{{a}{b{c}}}", "{a}{b{c}}"),
        ("\\boxed{1} then \\boxed{2}", "2"),  # last wins
        ("\\fbox{7}", "7"),
        ("\\boxed {\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces do not count
        ("\\boxed{1} and \\boxed{2", None),  # last one unclosed
        ("no box here", None),
        ("\\boxed{}", ""),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer> 42 </answer>", "42"),
        ("<answer>1</answer> x <answer>2</answer>", "2"),
        ("<answer>1", None),
        ("1</answer>", None),
        ("", None),
    ],
)
def test_answer_tag(text, expected):
    assert answer_tag(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("x = -3", "-3"),
        ("x = \u22123", "-3"),  # unicode minus
        ("total 1,234 apples", "1234"),
        ("it is 2.5.", "2.5"),
        ("it is 3/4.", "3/4"),
        ("pages 3-4", "4"),
        ("1, 2, 3", "3"),
        ("no digits", None),
    ],
)
def test_last_number(text, expected):
    assert last_number(text) == expected


@pytest.mark.parametrize(
    "text, fallback, expected",
    [
        ("\\boxed{1} <answer>\\boxed{2}</answer> \\boxed{3}", False, "2"),  # boxed in <answer> wins
        ("<answer>7</answer> \\boxed{3}", False, "3"),
        ("<answer>7</answer>", False, "7"),
        ("<answer> </answer>", False, None),
        ("answer is 9", False, None),
        ("answer is 9", True, "9"),
        ("<answer></answer> so 9", True, "9"),
    ],
)
def test_extract_answer(text, fallback, expected):
    assert extract_answer(text, fallback_last_number=fallback) == expected


@pytest.mark.parametrize(
    "fn, text, expected",
    [
        (gsm8k_answer, "so 9 * 2 = 18\n#### 18", "18"),
        (gsm8k_answer, "#### 1,234", "1234"),
        (gsm8k_answer, "no marker", None),
        (answer_is, "Thus, the answer is 18.", "18"),
        (answer_is, "The answer is $\\frac{1}{2}$.\nDone", "\\frac{1}{2}"),
        (answer_is, "the answer is 3. Then the answer is 4", "4"),
        (answer_is, "no phrase 5", None),
        (minerva_answer, "work\nAnswer: 18 dollars", "18 dollars"),
        (minerva_answer, "Answer: 1\nanswer:2", "2"),
        (minerva_answer, "no answer line", None),
        (gold_answer, "Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
        (gold_answer, "So the total is $\\boxed{\\frac{3}{4}}$.", "\\frac{3}{4}"),
        (gold_answer, "$18$", "18"),
        (gold_answer, 18, "18"),
        (gold_answer, "  \\frac{1}{2} ", "\\frac{1}{2}"),
        (gold_answer, "$", "$"),
    ],
)
def test_marker_extractors_and_gold(fn, text, expected):
    assert fn(text) == expected


@pytest.mark.parametrize(
    "s, expected",
    [
        ("1,234", "1234"),
        ("1{,}234", "1234"),
        ("$5$", "5"),
        ("5.0", "5"),
        ("5.", "5"),
        ("-0", "0"),
        ("\u22125", "-5"),
        ("\\frac{1}{2}", "1/2"),
        ("\\dfrac{-3}{6}", "-1/2"),
        ("-\\frac{1}{2}", "-1/2"),
        ("1/2", "1/2"),
        ("0.5", "1/2"),
        ("x = 5", "5"),
        ("12 \\text{ cm}", "12"),
        ("18 dollars", "18"),
        ("5 km per hour", "5"),
        ("3 x", None),  # a single letter is a variable, not a unit
        ("2 pi", None),
        ("1/0", None),
        ("1 2", None),
        ("1,2", None),
        ("\\sqrt{2}", None),
        ("abc", None),
    ],
)
def test_normalize_number(s, expected):
    assert normalize_number(s) == expected


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        # a number gold asks for a number literal: arithmetic in the prediction is never evaluated
        ("9 + 9", "18", False),
        ("3 \\times 6", "18", False),
        ("(2+3)*4", "20", False),
        ("2**10", "1024", False),
        ("1/0", "1", False),
        ("\\sqrt{4}", "2", False),
        ("x \\geq 7", "7", False),
        ("9 + 9 = 18", "18", True),  # the number after the last '=' is the stated answer
        ("x = 18", "18", True),
        ("1.5 \\times 10^{3}", "1500", True),  # scientific notation is a literal
        ("1.5\\cdot10^3", "1500", True),
        ("\\frac{36}{2}", "18", True),  # a fraction is a literal, reduced or not
        ("25\\%", "25", True),
        ("25\\%", "0.25", True),
        ("25%", "0.5", False),
        ("12", "12 percent", True),
        ("\\sqrt{4}", "\\sqrt{4}", None),  # a gold that is not a number: math-verify decides
        ("2", "\\sqrt{4}", None),
    ],
)
def test_numeric_match(pred, gold, expected):
    assert numeric_match(pred, gold) is expected


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("1/2", "\\frac{1}{2}", True),
        ("1,234", "1234", True),
        ("-3", "3", False),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),  # symbolic, via math_verify
        ("x^2+1", "1+x^2", True),
        ("\\sqrt{3}", "\\sqrt{2}", False),
        ("", "5", False),
    ],
)
def test_answers_match_in_process(pred, gold, expected):
    assert answers_match(pred, gold) is expected


# (completion, gold, accuracy, accuracy_lenient, math_17k_acc, base_acc, acc, acc_for_dapo, qwen_accuracy_reward)
ACCURACY_RULES = [
    "accuracy",
    "accuracy_lenient",
    "math_17k_acc",
    "base_acc",
    "acc",
    "acc_for_dapo",
    "qwen_accuracy_reward",
]
ACCURACY_TABLE = [
    # R1 format, clean answers
    (TH + "<answer>\\boxed{18}</answer>", "18", 1, 1, 1, 1, 1, -1, 1),
    (TH + "<answer>\\boxed{18}</answer>", "Janet sells 9 eggs.\n#### 18", 1, 1, 1, 1, 1, -1, 1),  # GSM8K gold
    (TH + "<answer>\\boxed{18.00}</answer>", "18", 1, 1, 1, 1, 1, -1, 0),  # qwen: string compare
    (TH + "<answer>\\boxed{\\$18}</answer>", "18", 1, 1, 1, 1, 1, -1, 0),
    (TH + "<answer>\\boxed{18 \\text{ dollars}}</answer>", "18", 1, 1, 1, 1, 1, -1, 0),
    (TH + "<answer>\\boxed{18 dollars}</answer>", "18", 1, 1, 1, 1, 1, -1, 0),
    (TH + "<answer>\\boxed{17}</answer>", "18", 0, 0, 0, 0, -0.5, -1, 0),
    (TH + "<answer>18</answer>", "18", 1, 1, 0, 0, -1, -1, 0),  # no box: tag content counts for accuracy
    (TH + "<answer>\\boxed{18}</answer>\n", "18", 1, 1, 1, 0, 1, -1, 1),  # base_acc: must end at </answer>
    (" " + TH + "<answer>\\boxed{18}</answer>", "18", 1, 1, 1, 0, 1, -1, 1),  # base_acc: must start with <think>
    (TH + " <answer> \\boxed{18} </answer> extra", "18", 1, 1, 1, 0, 1, -1, 1),
    (
        "<think>a</think>\n<answer>\nThe final answer is \\boxed{\\frac{3}{4}}.\n</answer>",
        "\\frac{3}{4}",
        1,
        1,
        1,
        1,
        1,
        -1,
        0,
    ),
    (
        "<think>\nStep 1: 16 - 3 - 4 = 9.\nStep 2: 9 * 2 = 18.\n</think>\n<answer>\n\\boxed{18}\n</answer>",
        "18",
        1,
        1,
        1,
        1,
        1,
        -1,
        1,
    ),
    ("<answer>\\boxed{18}</answer>", "18", 1, 1, 1, 0, 1, -1, 1),  # no <think>
    # boxes inside <think>, several boxes, last one wins
    ("<think>\\boxed{18}</think> <answer>18</answer>", "18", 1, 1, 1, 0, 1, -1, 1),
    ("<think>Maybe \\boxed{17}.</think><answer>\\boxed{18}</answer>", "18", 1, 1, 1, 1, 1, -1, 1),
    ("<think>It is 18.</think><answer>\\boxed{17}</answer>", "18", 0, 0, 0, 0, -0.5, -1, 0),
    ("<think>a</think><answer>\\boxed{18}</answer><answer>\\boxed{17}</answer>", "18", 0, 0, 0, 0, -0.5, -1, 0),
    ("\\boxed{1} then \\boxed{2}", "2", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{2} then \\boxed{1}", "2", 0, 0, 0, 0, -0.5, -1, 0),
    ("\\boxed{18} \\boxed{18}", "18", 1, 1, 1, 0, 1, -1, 1),
    # missing closing tags, empty and missing answers
    ("<think>It is 18.</think> <answer>\\boxed{18}", "18", 1, 1, 1, 0, 1, -1, 1),
    ("<think>It is 18. <answer>\\boxed{18}</answer>", "18", 1, 1, 1, 0, 1, -1, 1),
    ("<think>It is 18.</think> <answer></answer>", "18", 0, 1, 0, 0, -1, -1, 0),
    ("<think>It is 18.</think> <answer>\\boxed{}</answer>", "18", 0, 0, 0, 0, -1, -1, 0),
    ("", "18", 0, 0, 0, 0, -1, -1, 0),
    ("I don't know.", "18", 0, 0, 0, 0, -1, -1, 0),
    ("\\boxed{18", "18", 0, 1, 0, 0, -1, -1, 0),  # unclosed box
    ("The answer is 18.", "18", 0, 1, 0, 0, -1, -1, 0),
    ("<think>First, 16 - 3 - 4 = 9. Then 9 * 2 = 18.</think>\n<answer>18</answer>", "18", 1, 1, 0, 0, -1, -1, 0),
    # trailing text
    ("So she makes \\boxed{18} dollars every day.", "18", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{18}.\n\nLet me know if you need anything else!", "18", 1, 1, 1, 0, 1, -1, 1),
    ("The total is \\boxed{18}. Also, 5 + 5 = 10.", "18", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{18} apples", "18", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{18}\\%", "18", 1, 1, 1, 0, 1, -1, 1),
    # thousands separators
    ("\\boxed{1,234}", "1234", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{1234}", "1,234", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{1{,}234}", "1234", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{10,000}", "10000", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{10,000}", "#### 10000", 1, 1, 1, 0, 1, -1, 1),
    # negative numbers, unicode minus
    ("\\boxed{-3}", "-3", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{\u22123}", "-3", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{3}", "-3", 0, 0, 0, 0, -0.5, -1, 0),
    ("\\boxed{-0}", "0", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{-\\frac{1}{2}}", "-0.5", 1, 1, 1, 0, 1, -1, 0),
    # fractions vs decimals
    ("\\boxed{\\frac{1}{2}}", "0.5", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1, 1, 1, 0, 1, -1, 0),  # qwen: gold's first number is 1
    ("\\boxed{\\dfrac{3}{4}}", "0.75", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{3.5}", "\\frac{7}{2}", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{\\frac{36}{2}}", "18", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{0.333}", "\\frac{1}{3}", 0, 0, 0, 0, -0.5, -1, 0),
    # decimals and near misses
    ("\\boxed{18}", "18.0", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{018}", "18", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{ 18 }", "18", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{18.5}", "18", 0, 0, 0, 0, -0.5, -1, 0),
    ("\\boxed{1.8}", "18", 0, 0, 0, 0, -0.5, -1, 0),
    ("\\boxed{180}", "18", 0, 0, 0, 0, -0.5, -1, 0),
    # percentages, $ and units
    ("\\boxed{50\\%}", "50", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{0.5}", "50\\%", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{$18$}", "18", 1, 1, 1, 0, 1, -1, 0),
    ("$\\boxed{18}$", "18", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{18}", "$18$", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{18}", "The answer is $\\boxed{18}$.", 1, 1, 1, 0, 1, -1, 1),  # MATH-style solution as gold
    # expressions, equations, sets, intervals
    ("\\boxed{x = 18}", "18", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{18}", "x = 18", 1, 1, 1, 0, 1, -1, 1),
    ("\\boxed{x = 3}", "3", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{9 + 9}", "18", 0, 0, 0, 0, -0.5, -1, 0),  # a number gold needs a number literal
    ("\\boxed{3 \\times 6}", "18", 0, 0, 0, 0, -0.5, -1, 0),  # a number gold needs a number literal
    ("\\boxed{\\sqrt{324}}", "18", 0, 0, 0, 0, -0.5, -1, 0),  # a number gold needs a number literal
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{x^2+1}", "1+x^2", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{\\pi/2}", "\\frac{\\pi}{2}", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{(1, 2)}", "(1,2)", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{[1, 2)}", "[1,2)", 1, 1, 1, 0, 1, -1, 0),
    ("\\boxed{(1, 2]}", "[1,2)", 0, 0, 0, 0, -0.5, -1, 0),
    ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", 1, 1, 1, 0, 1, -1, 0),
    # \fbox counts as a box, but MindSpeed's rules look for the word "boxed"
    ("\\fbox{18}", "18", 1, 1, 1, 0, -1, -1, 0),
    # Minerva "Answer:" lines (acc_for_dapo)
    ("Answer: 18", "18", 0, 1, 0, 0, -1, 1, 0),
    ("Answer: $18$", "18", 0, 1, 0, 0, -1, 1, 0),
    ("So the total is 18 dollars.\nAnswer: 18 dollars", "18", 0, 1, 0, 0, -1, 1, 0),
    ("Answer: \\boxed{18}", "18", 1, 1, 1, 0, 1, 1, 1),
    ("Answer: 17\nWait, recheck.\nAnswer: 18", "18", 0, 1, 0, 0, -1, 1, 0),
    ("Answer: 18\nWait, no.\nAnswer: 17", "18", 0, 0, 0, 0, -1, -1, 0),
    ("Answer: 1,234", "1234", 0, 1, 0, 0, -1, 1, 0),
    ("Answer: x = 18", "18", 0, 1, 0, 0, -1, 1, 0),
    ("Answer: 0.5", "\\frac{1}{2}", 0, 1, 0, 0, -1, -1, 0),  # dapo: exact strings only
    ("Answer: 18\n" + "x" * 400, "18", 0, 1, 0, 0, -1, -1, 0),  # dapo reads the last 300 characters
    ("answer: 18", "18", 0, 1, 0, 0, -1, 1, 0),
    ("Answer: 18 \\text{ dollars}", "18", 0, 1, 0, 0, -1, 1, 0),
    # MindSpeed acc cuts at the assistant turn and the first end token
    ("<|im_start|>assistant\n\\boxed{18}<|im_end|>\\boxed{17}", "18", 0, 0, 0, 0, 1, -1, 0),
    ("\\boxed{18}</s>ignored \\boxed{17}", "18", 0, 0, 0, 0, 1, -1, 0),
]


@pytest.mark.parametrize("column, rule", list(enumerate(ACCURACY_RULES)))
@pytest.mark.parametrize("completion, gold, expected", [(r[0], r[1], r[2:]) for r in ACCURACY_TABLE])
def test_accuracy_rules(column, rule, completion, gold, expected):
    assert get(rule)([completion], [gold]) == [expected[column]]


@pytest.mark.parametrize("rule", ACCURACY_RULES)
def test_accuracy_rules_batch_equals_items(rule):
    completions, golds = [row[0] for row in ACCURACY_TABLE], [row[1] for row in ACCURACY_TABLE]
    col = ACCURACY_RULES.index(rule) + 2
    assert get(rule)(completions, golds) == [row[col] for row in ACCURACY_TABLE]


def test_minerva_normalize():
    assert minerva_normalize("\\frac12") == "\\frac{1}{2}"
    assert minerva_normalize("x = 18 \\text{ dollars}") == "18"
    assert minerva_normalize("\\boxed{1,000}") == "1000"


# (completion, format, strict_format, format_partial, tag_count, ms_strict_format, format_reward)
FORMAT_RULES = ["format", "strict_format", "format_partial", "tag_count", "ms_strict_format", "format_reward"]
FORMAT_TABLE = [
    (R1, 1, 1, 1, 1, 1, 1),
    ("\n <think>a</think>\n<answer>b</answer>\n", 1, 0, 0.75, 1, -0.5, 0),  # whitespace ok; no box
    ("<think>a</think><answer>\\boxed{}</answer>", 1, 0, 0.75, 1, 1, 1),  # empty box: only MindSpeed's check passes it
    ("<think>\\boxed{5}</think><answer>5</answer>", 1, 0, 0.75, 1, -0.5, 1),  # box only in <think>
    ("<think>a</think> extra <answer>b</answer>", 0, 0, 0.75, 1, -0.5, 0),  # text between blocks
    ("<think>a</think><answer>\\boxed{5}</answer> trailing", 0, 0, 1, 1, -0.5, 0),
    ("<think>a</think><answer>\\boxed{5}</answer>\ntrailing", 0, 0, 1, 1, -0.5, 1),  # MULTILINE `$` quirk
    ("<think>a</think><think>b</think><answer>c</answer>", 0, 0, 0.75, 0.5, -0.5, 1),  # tag twice
    ("<answer>b</answer><think>a</think>", 0, 0, 0.5, 1, -0.5, 0),  # wrong order
    ("<think>a</think> the answer is 5", 0, 0, 0.5, 0.5, -0.5, 0),
    ("<think>a</think><answer>\\boxed{5}", 0, 0, 0.5, 0.75, -0.5, 0),  # unclosed answer
    ("<think> still thinking", 0, 0, 0.25, 0.25, -0.5, 0),
    ("</think> <think>", 0, 0, 0.25, 0.5, -0.5, 0),
    ("plain text \\boxed{5}", 0, 0, 0, 0, -0.5, 0),
    ("<think>a</think><answer>\\boxed{1} or \\boxed{2}</answer>", 1, 1, 1, 1, -0.5, 1),  # ms: one box only
    (" <think>a</think><answer>\\boxed{5}</answer> ", 1, 1, 1, 1, 1, 0),
]


@pytest.mark.parametrize("column, rule", list(enumerate(FORMAT_RULES)))
@pytest.mark.parametrize("completion, expected", [(r[0], r[1:]) for r in FORMAT_TABLE])
def test_format_rules(column, rule, completion, expected):
    assert get(rule)([completion], [""]) == [expected[column]]


@pytest.mark.parametrize(
    "completion, steps, ms_step",
    [
        ("Step 1: add. Step 2: double. Step 3: done.", 1.0, 1.0),
        ("Step 1: add.", 1 / 3, 1 / 3),
        ("1. add\n2. double", 2 / 3, 1 / 3),  # MindSpeed's ^ is not multi-line
        ("First, add. Next, double. Finally, report.", 1.0, 1.0),
        ("list:\n- a\n- b\n* c\n- d", 1.0, 1.0),
        ("just an answer", 0.0, 0.0),
    ],
)
def test_reasoning_steps(completion, steps, ms_step):
    assert get("reasoning_steps")([completion], [""]) == [pytest.approx(steps)]
    assert get("step")([completion], [""]) == [pytest.approx(ms_step)]


@pytest.mark.parametrize(
    "completion, expected", [("\\boxed{5}", 1.0), ("\\boxed{}", 0.0), ("\\boxed{5", 0.0), ("5", 0.0)]
)
def test_boxed(completion, expected):
    assert get("boxed")([completion], [""]) == [expected]


def test_qwen_accuracy_label_without_number_is_an_error():
    assert math.isnan(get("qwen_accuracy_reward")(["\\boxed{5}"], ["five"])[0])  # counted as an error by the Scorer


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think><tool>calculator: 437*58</tool><result>25346</result></think><answer>25346</answer>", 1.0),
        ("<tool>calculator: 1+</tool><result>error: not an arithmetic expression</result> so 2", 0.5),
        ("<tool>calculator: 2*3</tool><result>6</result><tool>x: 1</tool><result>error: no tool 'x'</result>", 0.5),
        ("<tool>calculator: 2*3</tool><result>6", 1.0),  # a result cut by the length limit
        ("<tool>calculator 2*3", 0.25),
        ("</tool><result>6</result>", 0.0),
        ("<answer>\\boxed{6}</answer>", 0.0),
    ],
)
def test_tool_format(completion, expected):
    assert get("tool_format")([completion], [""]) == [expected]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>4 + 7 = 11</think><answer>11</answer>", 1.0),  # no call: what a good call scores
        ("<think><tool>calculator: 437*58</tool><result>25346</result></think><answer>25346</answer>", 1.0),
        ("<tool>calculator: 1+</tool><result>error: not an arithmetic expression</result> so 2", 0.5),
        ("<tool>calculator: 2*3</tool><result>6</result> and <tool>calculator 2*", 0.0),  # one call never formed
        ("<tool>calculator 2*3", 0.0),
    ],
)
def test_tool_wellformed_pays_for_calling_well_not_for_calling(completion, expected):
    assert get("tool_wellformed")([completion], [""]) == [expected]


def test_registry_names():
    assert {
        "accuracy", "accuracy_lenient", "format", "strict_format", "format_partial", "tag_count", "reasoning_steps",
        "boxed", "countdown", "base_acc", "acc", "ms_strict_format", "math_17k_acc", "acc_for_dapo", "step",
        "qwen_accuracy_reward", "format_reward", "tool_format", "tool_wellformed", "code_tests",
        "code_tests_frac",
    } == set(REWARDS)  # fmt: skip
