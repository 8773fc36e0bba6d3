"""Reward tables: extraction, equivalence, format rules, registry and scoring."""

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rlvr.errors import UserError
from rlvr.rewards import (
    REWARDS,
    accuracy,
    accuracy_lenient,
    answer_tag,
    answers_match,
    boxed,
    extract_answer,
    format_partial,
    format_r1,
    get_reward,
    last_boxed,
    last_number,
    normalize_number,
    score,
)

REPO = Path(__file__).resolve().parents[2]
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
    "s, expected",
    [
        ("1,234", "1234"),
        ("1{,}234", "1234"),
        ("$5$", "5"),
        ("5.0", "5"),
        ("5.", "5"),
        ("-0", "0"),
        ("\\frac{1}{2}", "1/2"),
        ("\\dfrac{-3}{6}", "-1/2"),
        ("-\\frac{1}{2}", "-1/2"),
        ("1/2", "1/2"),
        ("0.5", "1/2"),
        ("x = 5", "5"),
        ("12 \\text{ cm}", "12"),
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
        ("\\frac{1}{2}", "0.5", True),
        ("1/2", "\\frac{1}{2}", True),
        ("1,234", "1234", True),
        ("-3", "3", False),
        ("5", "6", False),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),  # symbolic, via math_verify
        ("x^2+1", "1+x^2", True),
        ("2\\sqrt{3}", "\\sqrt{12}", True),
        ("\\pi/2", "\\frac{\\pi}{2}", True),
        ("\\sqrt{3}", "\\sqrt{2}", False),
        ("", "5", False),
        ("5", "", False),
    ],
)
def test_answers_match(pred, gold, expected):
    assert answers_match(pred, gold) is expected


def test_answers_match_off_main_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(answers_match("x^2+1", "1+x^2")))
    t.start()
    t.join()
    assert out == [True]


def test_answers_match_slow_or_broken_verifier_is_false(monkeypatch):
    import rlvr.rewards.extract as ex

    monkeypatch.setattr(ex, "_math_verify", lambda p, g, t: time.sleep(5) or True)
    out, t0 = [], time.monotonic()
    worker = threading.Thread(target=lambda: out.append(answers_match("x", "y", timeout_s=0.2)))
    worker.start()
    worker.join()
    assert out == [False] and time.monotonic() - t0 < 2

    def boom(p, g, t):
        raise RuntimeError("sympy exploded")

    monkeypatch.setattr(ex, "_math_verify", boom)
    assert answers_match("x", "y") is False


@pytest.mark.parametrize(
    "completion, gold, acc, lenient",
    [
        (R1, "5", 1.0, 1.0),
        ("<answer>\\boxed{\\frac{1}{2}}</answer>", "0.5", 1.0, 1.0),
        ("\\boxed{1,234} trailing words 99", "1234", 1.0, 1.0),  # trailing text ignored
        ("\\boxed{-3}", "-3", 1.0, 1.0),
        ("\\boxed{3}", "-3", 0.0, 0.0),
        ("\\boxed{2} then \\boxed{5}", "5", 1.0, 1.0),
        ("<answer>5</answer>", "5", 1.0, 1.0),  # tag without boxed
        ("the answer is 5.", "5", 0.0, 1.0),  # missing answer: only the lenient rule falls back
        ("the answer is \\boxed{5", "5", 0.0, 1.0),  # unclosed brace
        ("<answer>5", "5", 0.0, 1.0),  # unclosed tag
        ("", "5", 0.0, 0.0),
    ],
)
def test_accuracy(completion, gold, acc, lenient):
    assert accuracy(completion, gold) == acc
    assert accuracy_lenient(completion, gold) == lenient


@pytest.mark.parametrize(
    "completion, fmt, partial",
    [
        (R1, 1.0, 1.0),
        ("\n <think>a</think>\n<answer>b</answer>\n", 1.0, 0.75),  # whitespace ok; no box
        ("<think>a</think><answer>\\boxed{}</answer>", 1.0, 0.75),  # empty box earns nothing
        ("<think>a</think> extra <answer>b</answer>", 0.0, 0.75),  # text between blocks
        ("<think>a</think><answer>b</answer> trailing", 0.0, 0.75),
        ("<think>a</think><think>b</think><answer>c</answer>", 0.0, 0.75),  # tag twice
        ("<answer>b</answer><think>a</think>", 0.0, 0.5),  # wrong order
        ("<think>a</think> the answer is 5", 0.0, 0.5),
        ("<think>a</think><answer>\\boxed{5}", 0.0, 0.5),  # unclosed answer
        ("<think> still thinking", 0.0, 0.25),
        ("</think> <think>", 0.0, 0.25),
        ("plain text \\boxed{5}", 0.0, 0.0),
    ],
)
def test_format_rules(completion, fmt, partial):
    assert format_r1(completion, "") == fmt
    assert format_partial(completion, "") == partial


@pytest.mark.parametrize(
    "completion, expected",
    [("\\boxed{5}", 1.0), ("\\boxed{}", 0.0), ("\\boxed{5", 0.0), ("5", 0.0)],
)
def test_boxed(completion, expected):
    assert boxed(completion, "") == expected


def test_registry_names():
    assert set(REWARDS) == {"accuracy", "accuracy_lenient", "format", "format_partial", "boxed"}
    assert get_reward("format") is format_r1


def test_unknown_reward_suggests():
    with pytest.raises(UserError, match="unknown reward 'acuracy'; did you mean 'accuracy'") as e:
        get_reward("acuracy")
    assert "known: accuracy, accuracy_lenient" in str(e.value) and "\n" not in str(e.value)


def test_reward_from_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("def length(c, a):\n    return len(c) / 10\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get_reward("my_rewards:length")("abcde", "") == 0.5
    with pytest.raises(UserError, match="has no function 'nope'"):
        get_reward("my_rewards:nope")
    with pytest.raises(UserError, match="cannot import reward module 'no_such_mod_xyz'"):
        get_reward("no_such_mod_xyz:f")


def test_score_weights_and_errors(tmp_path, monkeypatch):
    (tmp_path / "flaky_rewards.py").write_text(
        "def flaky(c, a):\n    if c == 'bad':\n        raise RuntimeError('boom')\n    return 1.0\n"
        "def nan(c, a):\n    return float('nan')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    res = score(
        [R1, "\\boxed{4}", "bad"],
        ["5", "5", "5"],
        {"accuracy": 1.0, "format": 0.5, "flaky_rewards:flaky": 0.1, "flaky_rewards:nan": 2.0},
    )
    # sample 0: 1*1 + 0.5*1 + 0.1*1 = 1.6; sample 1: 0.1*1 = 0.1; sample 2: flaky raised -> 0
    assert res.total == pytest.approx([1.6, 0.1, 0.0])
    assert res.per_rule["accuracy"] == [1.0, 0.0, 0.0]
    assert res.per_rule["format"] == [1.0, 0.0, 0.0]
    assert res.errors == {
        "accuracy": 0, "format": 0, "flaky_rewards:flaky": 1, "flaky_rewards:nan": 3
    }


def test_score_rejects_bad_input():
    with pytest.raises(UserError, match="did you mean 'format'"):
        score(["x"], ["1"], {"fromat": 1.0})
    with pytest.raises(UserError):
        score(["x"], ["1"], {})
    with pytest.raises(ValueError):
        score(["x"], [], {"accuracy": 1.0})


def test_import_without_torch():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        import rlvr.rewards as r
        assert r.accuracy("\\\\boxed{x^2+1}", "1+x^2") == 1.0
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO)
