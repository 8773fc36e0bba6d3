"""Code with execution feedback as an environment: each finished turn's code (its last fenced block,
as the ``code_tests`` reward reads it) runs in the sandbox against the row's tests; a passing attempt,
or the ``rollout.max_turns``-th, ends the episode; otherwise the first failing test (its input, what
was expected, what the code gave, each cut to :data:`FEEDBACK_CHARS`) comes back as a user turn."""

from __future__ import annotations

import os

from rlvr.environments.base import Environment, Step, Turn

FEEDBACK_CHARS = 300
"""Characters of a test's input, expected and actual output quoted back to the model."""


def _clip(text: str) -> str:
    text = str(text)
    return text if len(text) <= FEEDBACK_CHARS else text[:FEEDBACK_CHARS] + "..."


def feedback_text(tests: dict, passed: list[bool], why: list[str], code: str | None) -> str:
    """The user turn after a failing attempt: the first failing test, or that no code was found."""
    if code is None:
        return "I found no code in your answer. Give the whole program in one ```python fenced block."
    i = passed.index(False)
    case = tests["cases"][i]
    if tests["kind"] == "call":
        args = ", ".join(repr(a) for a in case["args"])
        want = case.get("expected", (case.get("expected_any") or [None])[0])
        test = f"{tests['fn_name']}({_clip(args)}) should return {_clip(repr(want))}"
    else:
        test = f"for the input {_clip(repr(case['input']))} the output should be {_clip(repr(case['output']))}"
    return (
        f"Your code failed a test: {test}, but it {_clip(why[i]) or 'failed'}. "
        "Fix it and give the whole program again in one ```python fenced block."
    )


class CodeFeedback(Environment):
    """One code episode: the row's ``fields["tests"]`` (the form of :mod:`rlvr.rewards.code`), up to
    ``max_turns`` attempts. A row without tests is single-turn. The reward is left to the rules
    (``code_tests`` reads the final attempt)."""

    def __init__(self, max_turns: int = 3) -> None:
        self.max_turns = max_turns
        self.tests: dict | None = None

    def reset(self, row: dict) -> None:
        self.tests = (row.get("fields") or {}).get("tests") or row.get("tests")
        return None

    def step(self, turn: Turn) -> Step:
        from rlvr.rewards.code import SANDBOX_ENV, extract_code
        from rlvr.sandbox import Limits, run_tests

        tests = self.tests
        if not tests or not tests.get("cases") or turn.index + 1 >= self.max_turns:
            return Step(done=True)
        code = extract_code(turn.text)
        passed: list[bool] = []
        why: list[str] = []
        if code is not None:
            outcome = run_tests(
                code, tests["kind"], tests["cases"], fn_name=tests.get("fn_name", ""), setup=tests.get("setup", ""),
                limits=Limits(), stop_on_fail=True, isolation=os.environ.get(SANDBOX_ENV, "bwrap"),
            )  # fmt: skip
            if all(outcome.passed):
                return Step(done=True)
            passed, why = outcome.passed, outcome.why
        return Step(observation=[{"role": "user", "content": feedback_text(tests, passed, why, code)}], done=False)
