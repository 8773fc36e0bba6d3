"""Evaluation math: the unbiased pass@k estimator (hand-computed), majority voting, and the
accuracy / pass@k / maj@k bookkeeping of ``evaluate`` on a scripted engine (no model)."""

from __future__ import annotations

import itertools
from math import comb

import pytest
import torch

from rlvr.config import load_config
from rlvr.errors import UserError
from rlvr.evaluation import PromptStyle, evaluate, ks_up_to, majority_vote, pass_at_k
from rlvr.evaluation.during_training import TrainingEval
from rlvr.rewards import normalize_number


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 1, 0.25),  # pass@1 = c/n
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5) = 1 - 21/252 = 0.91666...
        (8, 0, 4, 0.0),  # no correct sample: never passes
        (4, 3, 2, 1.0),  # n - c = 1 < k = 2: every pair holds a correct one
        (4, 4, 4, 1.0),
        (8, 2, 8, 1.0),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_brute_force_over_subsets():
    # pass@k is the fraction of k-subsets of the n samples that contain a correct one
    for n in range(1, 7):
        for c in range(n + 1):
            samples = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert len(subsets) == comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_ks_up_to():
    assert ks_up_to(1) == [1]
    assert ks_up_to(8) == [1, 2, 4, 8]
    assert ks_up_to(6) == [1, 2, 4, 6]


def test_majority_vote():
    key = lambda a: normalize_number(a) or a  # noqa: E731
    assert majority_vote(["5", "5.0", "6", None], key=key) == "5"  # 5 and 5.0 are one answer
    assert majority_vote(["6", "5", "5", "6"]) == "6"  # tie: the first seen
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


class ScriptedEngine:
    """Stands in for HFRolloutEngine: greedy returns ``greedy[q]``, sampling cycles ``sampled[q]``."""

    def __init__(self, greedy: dict[str, str], sampled: dict[str, list[str]]) -> None:
        self.greedy, self.sampled, self.calls = greedy, sampled, []

    def generate(self, prompts, samples_per_prompt, *, greedy=False, temperature=None, max_new_tokens=None):
        self.calls.append((len(prompts), samples_per_prompt, greedy, temperature, max_new_tokens))
        texts = []
        for p in prompts:
            q = p.split("\n")[-1].strip()  # plain template on a chat-less tokenizer: the question is the last line
            texts += [self.greedy[q]] if greedy else self.sampled[q][:samples_per_prompt]
        B = len(texts)

        class Batch:
            pass

        b = Batch()
        b.texts = texts
        b.response_lengths = torch.tensor([len(t.split()) for t in texts])
        b.truncated = torch.tensor([t.endswith("...") for t in texts])
        assert B == len(prompts) * samples_per_prompt
        return b


class NoChatTokenizer:
    chat_template = None


ROWS = [{"question": "q1", "answer": "3"}, {"question": "q2", "answer": "1/2"}, {"question": "q3", "answer": "7"}]
GREEDY = {
    "q1": "<think> 1 + 2 </think><answer> \\boxed{3} </answer>",  # correct, R1 format
    "q2": "the answer is \\boxed{0.5}",  # correct (0.5 == 1/2), no format
    "q3": "I think it is 7 ...",  # no box, no tag: no answer; truncated
}
SAMPLED = {  # 4 samples each; correct counts 2, 4, 0
    "q1": ["\\boxed{3}", "\\boxed{4}", "\\boxed{3}", "nothing"],
    "q2": ["\\boxed{1/2}", "\\boxed{0.5}", "\\boxed{\\frac{1}{2}}", "\\boxed{2/4}"],
    "q3": ["\\boxed{8}", "\\boxed{8}", "\\boxed{6}", "\\boxed{7.5}"],
}


def test_evaluate_greedy_accuracy_pass_at_k_and_majority():
    engine = ScriptedEngine(GREEDY, SAMPLED)
    result = evaluate(
        engine,
        NoChatTokenizer(),
        ROWS,
        style=PromptStyle(template="plain", system_prompt=""),
        samples=4,
        temperature=0.6,
        max_new_tokens=16,
        batch_prompts=2,
    )
    s = result.summary
    assert s["n"] == 3
    assert s["accuracy"] == pytest.approx(2 / 3)
    assert s["accuracy_lenient"] == pytest.approx(1.0)  # q3's last number is 7
    assert s["format_rate"] == pytest.approx(1 / 3)
    assert s["truncated_frac"] == pytest.approx(1 / 3)
    # pass@1 = mean(c/n) = (2/4 + 4/4 + 0/4) / 3 = 0.5
    assert s["pass@1"] == pytest.approx(0.5)
    # pass@2 = mean(1 - C(n-c,2)/C(4,2)) = ((1 - 1/6) + 1 + 0) / 3
    assert s["pass@2"] == pytest.approx((1 - 1 / 6 + 1 + 0) / 3)
    # pass@4 = (1 + 1 + 0) / 3
    assert s["pass@4"] == pytest.approx(2 / 3)
    # majority: q1 -> 3 (2 votes, right), q2 -> 1/2 (all four agree after normalising), q3 -> 8 (wrong)
    assert s["maj@4"] == pytest.approx(2 / 3)
    assert s["sample_accuracy"] == pytest.approx(6 / 12)
    assert [p["num_correct"] for p in result.predictions] == [2, 4, 0]
    assert result.predictions[2]["majority"] == "8"
    assert result.predictions[1]["extracted"] == "0.5" and result.predictions[1]["correct"]
    # batching: 2 + 1 problems, a greedy call and a sampled call per batch, settings passed through
    assert engine.calls == [
        (2, 1, True, None, 16),
        (2, 4, False, 0.6, 16),
        (1, 1, True, None, 16),
        (1, 4, False, 0.6, 16),
    ]


def test_evaluate_greedy_only_has_no_pass_at_k():
    engine = ScriptedEngine(GREEDY, SAMPLED)
    result = evaluate(engine, NoChatTokenizer(), ROWS, style=PromptStyle(template="plain", system_prompt=""))
    assert not any(k.startswith(("pass@", "maj@")) for k in result.summary)
    assert all(not call[3] and call[1] == 1 for call in engine.calls)
    with pytest.raises(UserError):
        evaluate(engine, NoChatTokenizer(), ROWS, samples=0)


def test_eval_config_validation_and_schedule(tmp_path):
    with pytest.raises(UserError, match="eval.samples=0"):
        load_config(None, ["eval.samples=0"])
    cfg = load_config(None, ["eval.every_steps=4", "train.steps=10", "eval.limit=3"])
    ev = TrainingEval(cfg.eval, cfg.data, ROWS * 2, tmp_path, rollout_max_new_tokens=64, total_steps=10)
    assert len(ev.rows) == 3 and ev.max_new_tokens == 64
    assert [s for s in range(11) if ev.due(s)] == [0, 4, 8, 10]
    cfg = load_config(None, ["eval.at_start=false", "eval.at_end=false"])
    ev = TrainingEval(cfg.eval, cfg.data, ROWS, tmp_path, rollout_max_new_tokens=64, total_steps=10)
    assert not any(ev.due(s) for s in range(11))
    ev = TrainingEval(load_config().eval, cfg.data, [], tmp_path, rollout_max_new_tokens=64, total_steps=10)
    assert not ev.enabled  # no test rows: nothing to evaluate, training goes on
