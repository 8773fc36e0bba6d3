"""What data-parallel workers send each other per step: without dynamic sampling, the scores and lengths
of what they sampled (:class:`~rlvr.training.sampling.Sampled`), not their batches; with it, the batches
(a worker may train on groups another sampled)."""

from __future__ import annotations

import pickle

import torch

from rlvr.config import load_config
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rewards import Scorer
from rlvr.rollout import HFRolloutEngine
from rlvr.training.sampling import Sampled, Scored, collect, rollout_metrics

ROWS = [{"prompt": f"what is {i} + 7 ?", "answer": "7"} for i in range(4)]
REWARD = ("reward.rules=[format_partial]", "reward.weights=[1.0]", "reward.accuracy_rule=format_partial")


class TwoRanks:
    """Rank 0 of 2, where rank 1 sampled what rank 0 did: records what goes through ``gather``."""

    rank, world_size, shards = 0, 2, False

    def __init__(self) -> None:
        self.sent: list = []

    def sum(self, x):
        return 2 * x

    def gather(self, obj):
        self.sent.append(obj)
        return [obj, obj]


def _collect(*extra: str):
    cfg = load_config(
        None,
        ["rollout.samples_per_prompt=4", "train.prompts_per_step=4", "rollout.max_new_tokens=6", *REWARD, *extra],
    )
    torch.manual_seed(0)
    engine = HFRolloutEngine(tiny_model(seed=1), tiny_tokenizer(), max_new_tokens=6, dtype="float32")
    scorer = Scorer.from_config(cfg.reward)
    group = TwoRanks()
    trained, sampled, info = collect(engine, scorer, ROWS, [0, 1], 0, cfg, prefix="", group=group)
    return trained, sampled, info, group


def test_without_dynamic_sampling_the_ranks_exchange_scores_and_lengths_only():
    trained, sampled, info, group = _collect()
    assert len(group.sent) == 1 and isinstance(group.sent[0], Sampled)  # no token ids, texts or prompts
    mine = trained.summary()
    assert len(pickle.dumps(group.sent[0])) < len(pickle.dumps(trained)) / 2
    # the step's metrics cover both ranks' groups: rank 1's (here the same as rank 0's) counted too
    assert sampled.rewards.tolist() == 2 * mine.rewards.tolist()
    assert sampled.response_lengths.tolist() == 2 * mine.response_lengths.tolist()
    assert (
        rollout_metrics(sampled, info, overlong=False)["rollout/response_len_mean"]
        == mine.response_lengths.float().mean()
    )


def test_with_dynamic_sampling_the_batches_travel():
    trained, sampled, info, group = _collect("algo.dynamic_sampling=true", "algo.dynamic_sampling_max_batches=0")
    assert isinstance(group.sent[0], list) and isinstance(group.sent[0][0], Scored)
    assert isinstance(sampled, Sampled) and len(sampled.rewards) == 16 and len(trained.batch.texts) == 8
