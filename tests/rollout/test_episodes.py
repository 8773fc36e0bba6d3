"""Episodes of environments (rlvr.rollout.episodes, rlvr.environments). Code with execution feedback
(rollout.max_turns): a failing attempt gets the first failing test back as a (masked) user turn and the
model tries again; a passing one ends the episode; turns are seeded, so two runs sample the same
episodes. A plugin environment: its reset, its text observations, its rewards, its turn limit."""

from __future__ import annotations

import pytest
import torch

from rlvr import environments as envs
from rlvr.config import load_config
from rlvr.environments import Environment, Step
from rlvr.errors import UserError
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.episodes import chat_turns
from rlvr.sandbox import Outcome

TESTS = {"kind": "call", "fn_name": "f", "cases": [{"args": [1], "expected": 2}, {"args": [5], "expected": 6}]}


def _engine(max_turns: int, budget: int = 40):
    # stop strings the tiny model writes often end its turns before the budget, as an EOS would
    stop = ["the", "and", "+", "="]
    engine = HFRolloutEngine(tiny_model(seed=1), tiny_tokenizer(), max_new_tokens=budget, dtype="float32", stop=stop)
    engine.environment = envs.from_settings("", max_turns=max_turns)
    return engine


ROWS = [{"fields": {"tests": TESTS}}, {"question": "no tests"}]


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
    batch = engine.generate(["what is 1 + 1 ?", "what is 2 + 2 ?"], 2, seeds=seeds, rows=ROWS)
    turns = batch.turns
    assert turns[2:] == [1, 1]  # the second prompt has no tests: single-turn
    fed = [r for r in range(2) if turns[r] > 1]
    assert fed, turns  # the tiny model's turns end before the budget at least once
    for r in fed:
        text = batch.texts[r]
        assert text.count("User: Your code failed a test: f(1) should return 2, but it returned 7.") == turns[r] - 1
        n = int(batch.attention_mask[r, batch.prompt_len :].sum())
        assert int(batch.response_mask[r].sum()) < n  # the feedback's tokens are attended, not trained on
    assert batch.tool_calls is None and batch.env_rewards is None
    fed_back, cut = sum(t - 1 for t in turns), int(batch.truncated.sum())  # a feedback cut by the budget ends it
    assert fed_back <= sandbox_says["calls"] <= fed_back + cut  # a max_turns-th turn's code is the rules' to run
    again = _engine(max_turns=3).generate(["what is 1 + 1 ?", "what is 2 + 2 ?"], 2, seeds=seeds, rows=ROWS)
    assert again.texts == batch.texts and torch.equal(again.response_mask, batch.response_mask)


def test_a_passing_attempt_ends_the_episode_and_one_turn_is_single_turn(sandbox_says):
    sandbox_says["pass"] = True
    engine = _engine(max_turns=3)
    single = _engine(max_turns=1).generate(["what is 1 + 1 ?"], 2, seeds=[0, 1], rows=ROWS[:1])
    batch = engine.generate(["what is 1 + 1 ?"], 2, seeds=[0, 1], rows=ROWS[:1])
    assert batch.turns == [1, 1] and "User:" not in "".join(batch.texts) and single.turns is None
    assert batch.texts == single.texts  # the first turn is what a single-turn rollout samples


def test_feedback_text_quotes_the_first_failing_test():
    text = envs.feedback_text(TESTS, [True, False], ["", "returned 7"], "def f(x): ...")
    assert text.startswith("Your code failed a test: f(5) should return 6, but it returned 7.")
    stdin = {"kind": "stdin", "cases": [{"input": "3\n", "output": "6"}]}
    assert "for the input '3\\n' the output should be '6'" in envs.feedback_text(stdin, [False], ["printed '5'"], "x")
    assert envs.feedback_text(TESTS, [], [], None).startswith("I found no code")


def test_user_turn_in_a_chat_template():
    from transformers import AutoTokenizer  # noqa: F401 (the tiny tokenizer has no template: give it one)

    tok = tiny_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tok.eos_token = "<eos>"
    assert (
        chat_turns(tok, [{"role": "user", "content": "try again"}], ended_on_eos=True, prefix="<think>")
        == "<|user|>try again<eos><|assistant|><think>"
    )
    assert chat_turns(tok, [{"role": "user", "content": "x"}], ended_on_eos=False).startswith("<eos><|user|>x")
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert (
        chat_turns(tok, first, opening=True, prefix="<think>") == "<|system|>s<eos><|user|>q<eos><|assistant|><think>"
    )


def test_max_turns_config_checks():
    assert load_config("code_simple", ["rollout.max_turns=3"]).rollout.max_turns == 3
    with pytest.raises(UserError, match="rollout.max_turns=0: must be >= 1"):
        load_config(None, ["rollout.max_turns=0"])
    with pytest.raises(UserError, match="one rollout does one of them"):
        load_config(None, ["rollout.max_turns=2", "rollout.tools=[calculator]"])
    with pytest.raises(UserError, match=r"rollout.turn_discount=0.0: must be in \(0, 1\]"):
        load_config(None, ["rollout.turn_discount=0"])
    with pytest.raises(UserError, match="the tools run in the tools environment"):
        load_config(None, ["rollout.environment=code_feedback", "rollout.tools=[calculator]"])


class Countdown(Environment):
    """A plugin-style environment: answers each turn with a text observation until its third turn,
    then ends with a reward of 1; its first message replaces the prompt."""

    max_turns = 5
    resets: list = []

    def reset(self, row):
        Countdown.resets.append(row)
        return [{"role": "user", "content": f"what is {row['question']} ?"}]

    def step(self, turn):
        if turn.index == 2:
            return Step(reward=1.0, done=True)
        return Step(observation=f" [obs {turn.index}] ", reward=0.5, done=False)


def test_a_plugin_environment_drives_the_episode():
    Countdown.resets.clear()
    engine = _engine(max_turns=1, budget=200)
    engine.environment = Countdown
    batch = engine.generate(["what is 9 + 9 ?"], 2, seeds=[0, 1], rows=[{"question": "2 + 2"}])
    assert Countdown.resets == [{"question": "2 + 2"}] * 2
    prompt = engine.tokenizer.decode(batch.input_ids[0, : batch.prompt_len], skip_special_tokens=True)
    assert "what is 2 + 2 ?" in prompt and "9" not in prompt  # reset's messages are the prompt
    for r in range(2):
        if batch.truncated[r]:
            continue  # the budget ran out first
        assert batch.turns[r] == 3 and batch.env_rewards[r] == 1.0
        assert "[obs 0]" in batch.texts[r] and "[obs 1]" in batch.texts[r]
        n = int(batch.attention_mask[r, batch.prompt_len :].sum())
        assert int(batch.response_mask[r].sum()) < n  # observations are attended to, not trained on
    assert not all(batch.truncated.tolist()), batch.texts


def test_environment_plugins_by_name_and_their_errors(tmp_path):
    plugin = tmp_path / "myenv.py"
    plugin.write_text(
        "from rlvr.environments import Environment, Step\n"
        "class Echo(Environment):\n    def step(self, turn):\n        return Step(done=True)\n"
        "def not_a_class():\n    pass\n"
    )
    make = envs.from_settings(f"{plugin}:Echo", max_turns=4)
    assert type(make()).__name__ == "Echo" and make().max_turns == 4
    with pytest.raises(UserError, match="not a subclass of rlvr.environments.Environment"):
        envs.from_settings(f"{plugin}:not_a_class")
    with pytest.raises(UserError, match="has no class 'Nope'"):
        envs.from_settings(f"{plugin}:Nope")
    with pytest.raises(UserError, match="unknown environment 'code_feedbak'.*did you mean 'code_feedback'"):
        envs.from_settings("code_feedbak")
    with pytest.raises(UserError, match="rollout.environment=tools needs rollout.tools"):
        envs.from_settings("tools")
    with pytest.raises(ValueError, match="needs an observation"):
        Step(done=False)
