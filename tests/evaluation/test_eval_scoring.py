"""Evaluation scores through the Scorer (worker pool, hard time limit, same rules
as training), and an item's time limit times the item's own work, not start-up or imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlvr.config import DataConfig
from rlvr.data import load_split
from rlvr.rewards import Scorer, verify

REPO = Path(__file__).resolve().parents[2]

SLOW_IMPORT = """
import time
time.sleep(1.5)  # an import slower than the item limit (a heavy plugin, a busy machine)

def one(completions, labels, **fields):
    out = []
    for c in completions:
        while c == "hang":
            pass
        out.append(1.0)
    return out
"""


@pytest.fixture(autouse=True)
def default_pool():
    verify.configure(timeout_s=2.0, workers=2)
    yield


class _Lengths(list):
    def tolist(self):
        return list(self)


class _Generated:
    def __init__(self, texts):
        self.texts, self.response_lengths, self.truncated = texts, _Lengths(len(t) for t in texts), [False] * len(texts)


class EchoEngine:
    """A rollout engine that answers each prompt with ``answer(prompt)``."""

    def __init__(self, answer):
        self.answer = answer

    def generate(self, prompts, samples, **kwargs):
        return _Generated([self.answer(p) for p in prompts for _ in range(samples)])


@pytest.mark.slow  # waits out a time limit
def test_plugin_import_slower_than_the_limit_scores_its_first_item(tmp_path):
    (tmp_path / "slow_plugin.py").write_text(SLOW_IMPORT)
    rule = f"{tmp_path}/slow_plugin.py:one"
    res = Scorer([rule], timeout_s=0.5).score(["a", "b", "c"], ["1"] * 3)  # a fresh pool: first batch
    assert res.per_rule[rule] == [1.0, 1.0, 1.0] and res.errors == {rule: 0}
    # the worker that replaces a timed-out one imports the plugin again, outside the next item's limit
    res = Scorer([rule], timeout_s=0.5).score(["a", "hang", "b", "c", "d"], ["1"] * 5)
    assert res.per_rule[rule] == [1.0, 0.0, 1.0, 1.0, 1.0] and res.errors == {rule: 1}


def _eval_rows(task: str, n: int = 6) -> list[dict]:
    return load_split(DataConfig(task=task, test_size=n), "test").rows


def test_evaluation_uses_the_training_rules():
    from rlvr.evaluation.evaluate import PromptStyle, evaluate

    rows = _eval_rows("arithmetic")
    gold = {r["question"]: r["answer"] for r in rows}

    def answer(prompt):  # half copy the question into the answer, half answer right
        q = prompt.strip()
        i = list(gold).index(q)
        return f"<think>x</think><answer>{q[8:-1] if i % 2 else gold[q]}</answer>"

    res = evaluate(EchoEngine(answer), None, rows, style=PromptStyle("plain", system_prompt=""), samples=2)
    correct = [p["correct"] for p in res.predictions]
    assert correct == [i % 2 == 0 for i in range(len(rows))]  # "3 + 4" is not "7"
    assert res.summary["accuracy"] == res.summary["accuracy_lenient"] == 0.5
    assert res.summary["format_rate"] == 1.0 and res.summary["pass@2"] == 0.5

    rows = _eval_rows("countdown")
    solution = {r["question"]: r for r in rows}

    def countdown(prompt):  # the bare target for the first half, a valid expression for the rest
        r = solution[prompt.strip()]
        i = rows.index(r)
        return f"<answer>{r['answer'] if i < 3 else r['fields']['solution']}</answer>"

    res = evaluate(EchoEngine(countdown), None, rows, style=PromptStyle("plain", system_prompt=""))
    assert [p["correct"] for p in res.predictions] == [False] * 3 + [True] * 3


# A stand-in for math_verify whose verify hangs inside C code (catastrophic regex backtracking)
# on a "HANG" answer: signals (math-verify's SIGALRM time-out) cannot interrupt it, only a kill can.
FAKE_MATH_VERIFY = """
import re

def parse(text, parsing_timeout=None):
    return [text.strip("$")]

def verify(gold, pred, timeout_seconds=None):
    if "HANG" in pred[0]:
        re.match(r"(a+)+$", "a" * 60 + "b")
    return gold == pred
"""

HANG_EVAL = textwrap.dedent(
    """
    import json, os, time
    from rlvr.evaluation.evaluate import PromptStyle, evaluate

    class Generated:
        def __init__(self, texts):
            self.texts, self.truncated = texts, [False] * len(texts)
            self.response_lengths = type("L", (list,), {"tolist": lambda s: list(s)})(len(t) for t in texts)

    class EchoEngine:
        def generate(self, prompts, samples, **kwargs):
            return Generated(
                ["<answer>\\\\boxed{HANG}</answer>" if "q1" in p else "<answer>x</answer>" for p in prompts]
            )

    rows = [{"question": "q1", "answer": "x"}, {"question": "q2", "answer": "x"}]
    t0 = time.monotonic()
    res = evaluate(EchoEngine(), None, rows, style=PromptStyle("plain", system_prompt=""))
    print(json.dumps({"elapsed": time.monotonic() - t0, "summary": res.summary, "predictions": res.predictions}))
    """
)


@pytest.mark.slow  # waits out a time limit
def test_evaluation_of_a_hanging_answer_returns_within_the_limit(tmp_path):
    # in a subprocess whose math_verify (here and in the reward workers) hangs where no signal
    # reaches it; before the fix evaluation ran the verifier in its own thread and never returned
    (tmp_path / "math_verify").mkdir()
    (tmp_path / "math_verify" / "__init__.py").write_text(FAKE_MATH_VERIFY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])}
    try:
        out = subprocess.run(
            [sys.executable, "-c", HANG_EVAL], timeout=60, cwd=REPO, env=env, capture_output=True, text=True
        )
    except subprocess.TimeoutExpired:
        pytest.fail("evaluation hung on an answer whose verification never returns")
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["elapsed"] < 30, got["elapsed"]  # pool start-up + one 2 s limit, with room for a busy machine
    first, second = got["predictions"]
    assert not first["correct"] and "timed out" in first["error"]
    assert second["correct"] and "error" not in second
    assert got["summary"]["scoring_errors"] == 1 and got["summary"]["accuracy"] == 0.5
