"""The code_tests reward (rlvr.rewards.code): code taken from the completion's last fenced block,
run against its row's hidden tests in the sandbox; the built-in code task's rows; the r1_code template
and the code_simple preset; and the one-line refusal where bubblewrap is missing."""

from __future__ import annotations

import pytest

from rlvr.config import load_config
from rlvr.data.tasks import CODE_PROBLEMS, code
from rlvr.errors import UserError
from rlvr.rewards import get
from rlvr.rewards.code import extract_code
from rlvr.sandbox import bwrap_problem, check_isolation

needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"no bubblewrap here: {bwrap_problem()}")

TESTS = {"kind": "call", "fn_name": "add_k", "cases": [{"args": [1], "expected": 4}, {"args": [-3], "expected": 0}]}


@pytest.mark.parametrize(
    "completion, code",
    [
        ("<think>easy</think>\n```python\ndef f(x):\n    return x\n```", "def f(x):\n    return x\n"),
        ("```python\nA = 1\n```\nthen\n```py\nB = 2\n```", "B = 2\n"),  # the last Python block
        ("```\nprint(1)\n```", "print(1)\n"),  # no language tag
        ("```text\nnot code\n```\n```python\nC = 3\n```\n```text\nnotes\n```", "C = 3\n"),  # Python over others
        ("<think>x</think><answer>def g(): return 2</answer>", "def g(): return 2"),
        ("no code at all", None),
    ],
)
def test_the_code_is_the_last_fenced_block(completion, code):
    assert extract_code(completion) == code


@needs_bwrap
def test_code_tests_all_or_nothing_and_the_fraction():
    right = "```python\ndef add_k(x):\n    return x + 3\n```"
    half = "```python\ndef add_k(x):\n    return 4\n```"  # right on the first test only
    fields = {"fields": [{"tests": TESTS}] * 4}
    completions = [right, half, "no code", "```python\nsyntax error(\n```"]
    assert get("code_tests")(completions, [""] * 4, **fields) == [1.0, 0.0, 0.0, 0.0]
    assert get("code_tests_frac")(completions, [""] * 4, **fields) == [1.0, 0.5, 0.0, 0.0]
    assert get("code_tests")([right], [""], tests=[TESTS]) == [1.0]  # tests given as their own column
    assert get("code_tests")([right], [""]) == [0.0]  # a row without tests scores 0


@needs_bwrap
def test_every_built_in_code_problem_is_solvable_and_hidden():
    """Each problem's reference passes its own hidden tests in the sandbox, and a constant answer does
    not: the tests are not all one value. The question shows one example, never the hidden cases."""
    rows = code(60, seed=3, difficulty=2)
    assert {r["fields"]["tests"]["fn_name"] for r in rows} == {p[1] for p in CODE_PROBLEMS}
    refs = {
        "add_k": "lambda x: x + K", "times_k": "lambda x: x * K", "square": "lambda x: x * x",
        "digit_sum": "lambda x: sum(int(c) for c in str(x))", "is_even": "lambda x: x % 2 == 0",
        "reverse": "lambda s: s[::-1]", "count_vowels": "lambda s: sum(c in 'aeiou' for c in s)",
        "largest": "max", "second_largest": "lambda xs: sorted(set(xs))[-2]",
        "count_primes": "lambda n: sum(all(k % d for d in range(2, int(k ** 0.5) + 1)) for k in range(2, n))",
        "fibonacci": "lambda n: __import__('functools').reduce(lambda p, _: (p[1], p[0] + p[1]), range(n), (0, 1))[0]",
        "run_length": "lambda s: ''.join(f'{c}{len(list(g))}' for c, g in __import__('itertools').groupby(s))",
        "is_palindrome": "lambda s: s == s[::-1]", "gcd_k": "lambda x: __import__('math').gcd(x, K)",
    }  # fmt: skip
    for row in rows[:20]:
        tests = row["fields"]["tests"]
        name = tests["fn_name"]
        k = next((w for w in row["question"].split() if w.rstrip(".").isdigit() and "k" in name), "0").rstrip(".")
        ref = refs[name].replace("K", k)
        solution = f"```python\n{name} = {ref}\n```"
        assert get("code_tests")([solution], [""], tests=[tests]) == [1.0], (row["question"], tests)
        values = {repr(c["expected"]) for c in tests["cases"]}
        if len(values) > 1:
            const = f"```python\ndef {name}(x):\n    return {tests['cases'][0]['expected']!r}\n```"
            assert get("code_tests")([const], [""], tests=[tests]) == [0.0]


def test_the_code_preset_and_template():
    cfg = load_config("code_simple", [])
    assert cfg.data.task == "code" and cfg.data.template == "r1_code" and cfg.reward.accuracy_rule == "code_tests"
    assert "code_tests_frac" in cfg.reward.rules and cfg.reward.sandbox == "bwrap"
    with pytest.raises(UserError, match="reward.sandbox=docker: use bwrap"):
        check_isolation("docker")


def test_missing_bubblewrap_is_one_line_naming_the_package(monkeypatch):
    from rlvr import sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.bwrap_problem.cache_clear()
    try:
        with pytest.raises(UserError, match=r"bubblewrap \(bwrap\) is not installed; apt-get install bubblewrap"):
            check_isolation("bwrap")
        assert "WITHOUT isolation" in check_isolation("none")
    finally:
        sandbox.bwrap_problem.cache_clear()


@needs_bwrap
def test_the_step_metrics_count_what_ran_in_the_sandbox():
    """code/programs, code/timeouts, code/sandbox_errors and code/exec_s (drained once per step by
    rlvr.training.sampling.collect, which names them code/...)."""
    from rlvr.rewards.code import drain_stats

    drain_stats()
    slow = {"kind": "call", "fn_name": "f", "cases": [{"args": [1], "expected": 1}]}
    completions = ["```python\ndef f(x):\n    while True: pass\n```", "```python\ndef f(x):\n    return x\n```", "no"]
    from rlvr import sandbox

    real = sandbox.Limits
    try:
        import rlvr.rewards.code as code_rule

        code_rule.Limits = lambda: real(test_s=0.5, total_s=1.0)
        assert get("code_tests")(completions, [""] * 3, tests=[slow] * 3) == [0.0, 1.0, 0.0]
    finally:
        code_rule.Limits = real
    stats = drain_stats()
    assert stats["programs"] == 2 and stats["timeouts"] == 1 and stats["sandbox_errors"] == 0
    assert stats["exec_s"] > 0.5 and drain_stats() == {}


@needs_bwrap
def test_both_code_rules_and_identical_completions_run_each_program_once(monkeypatch):
    """code_tests_frac runs every test; code_tests (the preset's second rule) then reads that run, and G
    identical completions run once: the sandbox's work per step halves for code_simple's two rules."""
    import rlvr.rewards.code as code_rule
    from rlvr.rewards.code import drain_stats

    monkeypatch.setattr(code_rule, "_OUTCOMES", type(code_rule._OUTCOMES)())
    drain_stats()
    tests = {"kind": "call", "fn_name": "f", "cases": [{"args": [1], "expected": 2}, {"args": [2], "expected": 3}]}
    right, half = "```python\ndef f(x):\n    return x + 1\n```", "```python\ndef f(x):\n    return 2\n```"
    completions = [right, right, half, right, "no code"]
    assert get("code_tests_frac")(completions, [""] * 5, tests=[tests] * 5) == [1.0, 1.0, 0.5, 1.0, 0.0]
    assert drain_stats()["programs"] == 2  # two distinct programs
    assert get("code_tests")(completions, [""] * 5, tests=[tests] * 5) == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert drain_stats() == {}  # every answer was known from the full runs
    other = {**tests, "cases": [{"args": [5], "expected": 6}]}  # the same code, other tests: runs again
    assert get("code_tests")([half], [""], tests=[other]) == [0.0]
    assert drain_stats()["programs"] == 1
