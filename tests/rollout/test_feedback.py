"""Code episodes with execution feedback (rlvr.rollout.feedback, rollout.max_turns): a failing attempt
gets the first failing test back as a (masked) user turn and the model tries again; a passing one
ends the episode; turns are seeded, so two runs sample the same episodes."""

from __future__ import annotations

import pytest
import torch

from rlvr.config import load_config
from rlvr.errors import UserError
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout import feedback as fb
from rlvr.sandbox import Outcome

TESTS = {"kind": "call", "fn_name": "f", "cases": [{"args": [1], "expected": 2}, {"args": [5], "expected": 6}]}


def _engine(max_turns: int, budget: int = 40):
    # stop strings the tiny model writes often end its turns before the budget, as an EOS would
    stop = ["the", "and", "+", "="]
    engine = HFRolloutEngine(tiny_model(seed=1), tiny_tokenizer(), max_new_tokens=budget, dtype="float32", stop=stop)
    engine.max_turns = max_turns
    return engine


@pytest.fixture
def sandbox_says(monkeypatch):
    """The tiny model writes no code: every turn's 'code' is its text, and the sandbox's verdict is
    set per call (the real sandbox's verdicts are tests/sandbox's)."""
    import rlvr.rewards.code as code
    import rlvr.sandbox as sandbox

    verdicts = {"pass": False, "calls": 0}
    monkeypatch.setattr(code, "extract_code", lambda text: text)

    def run_tests(code_text, kind, cases, **kw):
        verdicts["calls"] += 1
        ok = verdicts["pass"]
        return Outcome([ok] * len(cases), ["" if ok else "returned 7"] * len(cases), 0.01, 0)

    monkeypatch.setattr(sandbox, "run_tests", run_tests)
    return verdicts


def test_failing_attempts_get_feedback_turns_masked_out_of_training(sandbox_says):
    engine = _engine(max_turns=3)
    seeds = list(range(4))
    batch = engine.generate(["what is 1 + 1 ?", "what is 2 + 2 ?"], 2, seeds=seeds, episodes=[TESTS, None])
    turns = engine.last_turns
    assert turns[2:] == [1, 1]  # the second prompt has no tests: single-turn
    fed = [r for r in range(2) if turns[r] > 1]
    assert fed, turns  # the tiny model's turns end before the budget at least once
    for r in fed:
        text = batch.texts[r]
        assert text.count("Feedback: Your code failed a test: f(1) should return 2, but it returned 7.") == turns[r] - 1
        n = int(batch.attention_mask[r, batch.prompt_len :].sum())
        assert int(batch.response_mask[r].sum()) < n  # the feedback's tokens are attended, not trained on
    assert batch.tool_calls is None
    again = _engine(max_turns=3).generate(
        ["what is 1 + 1 ?", "what is 2 + 2 ?"], 2, seeds=seeds, episodes=[TESTS, None]
    )
    assert again.texts == batch.texts and torch.equal(again.response_mask, batch.response_mask)


def test_a_passing_attempt_ends_the_episode_and_one_turn_is_single_turn(sandbox_says):
    sandbox_says["pass"] = True
    engine = _engine(max_turns=3)
    single = _engine(max_turns=1).generate(["what is 1 + 1 ?"], 2, seeds=[0, 1], episodes=[TESTS])
    batch = engine.generate(["what is 1 + 1 ?"], 2, seeds=[0, 1], episodes=[TESTS])
    assert engine.last_turns == [1, 1] and "Feedback" not in "".join(batch.texts)
    assert batch.texts == single.texts  # the first turn is what a single-turn rollout samples


def test_feedback_text_quotes_the_first_failing_test():
    text = fb.feedback_text(TESTS, [True, False], ["", "returned 7"], "def f(x): ...")
    assert text.startswith("Your code failed a test: f(5) should return 6, but it returned 7.")
    stdin = {"kind": "stdin", "cases": [{"input": "3\n", "output": "6"}]}
    assert "for the input '3\\n' the output should be '6'" in fb.feedback_text(stdin, [False], ["printed '5'"], "x")
    assert fb.feedback_text(TESTS, [], [], None).startswith("I found no code")


def test_user_turn_in_a_chat_template():
    from transformers import AutoTokenizer  # noqa: F401 (the tiny tokenizer has no template: give it one)

    tok = tiny_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tok.eos_token = "<eos>"
    assert (
        fb.user_turn(tok, "try again", ended_on_eos=True, prefix="<think>")
        == "<|user|>try again<eos><|assistant|><think>"
    )
    assert fb.user_turn(tok, "x", ended_on_eos=False).startswith("<eos><|user|>x")


def test_max_turns_config_checks():
    assert load_config("code_simple", ["rollout.max_turns=3"]).rollout.max_turns == 3
    with pytest.raises(UserError, match="rollout.max_turns=0: must be >= 1"):
        load_config(None, ["rollout.max_turns=0"])
    with pytest.raises(UserError, match="one rollout does one of them"):
        load_config(None, ["rollout.max_turns=2", "rollout.tools=[calculator]"])
