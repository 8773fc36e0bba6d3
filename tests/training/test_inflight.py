"""Asynchronous rollouts' settings and the rollouts a checkpoint keeps (issue 63), without Ray."""

from __future__ import annotations

import pytest
import torch
from tiny_run import tiny_config

from rlvr.config import load_config
from rlvr.errors import UserError
from rlvr.rewards.registry import RewardResult
from rlvr.rollout import RolloutBatch
from rlvr.training.inflight import TAG, Rollout, from_plain, to_plain
from rlvr.training.preflight import ASYNC_TIS_CAP, async_settings
from rlvr.training.sampling import Scored


def _rollout() -> Rollout:
    batch = RolloutBatch(
        input_ids=torch.arange(12).view(2, 6), attention_mask=torch.ones(2, 6, dtype=torch.long),
        response_mask=torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1]]), prompt_len=3, texts=["a", "b"],
        truncated=torch.tensor([False, True]), group_size=2, logprobs=torch.randn(2, 3), turns=[1, 2],
    )  # fmt: skip
    result = RewardResult(total=[0.5, 1.0], per_rule={"sevens": [0.5, 1.0]}, errors={"sevens": 0})
    rows = [{"prompt": "p", "answer": "7", "fields": {"when": object()}}]
    got = Scored(rows, batch, ["a", "b"], ["7", "7"], result, [0.0, 1.0], [1.0, 1.0], torch.tensor([0.5, 1.0]))
    return Rollout(3, 2, got, got.summary(), {"rollout_s": 1.5, "reward_s": 0.25}, 10.0, 12.0, 0.1, 0.2)


def test_a_rollout_survives_a_weights_only_checkpoint(tmp_path):
    """What a checkpoint keeps of a rollout made ahead loads with weights_only=True (plain containers and
    tensors: no code on resume) and rebuilds into the same rollout; an odd leaf (a row's object) is kept as
    its string."""
    r = _rollout()
    torch.save({"inflight": [to_plain(r)]}, tmp_path / "state.pt")
    back = from_plain(torch.load(tmp_path / "state.pt", weights_only=True)["inflight"][0])
    assert isinstance(back, Rollout) and isinstance(back.got, Scored) and isinstance(back.got.batch, RolloutBatch)
    assert (back.step, back.version, back.info, back.push_s) == (3, 2, r.info, 0.2)
    assert torch.equal(back.got.batch.input_ids, r.got.batch.input_ids)
    assert torch.equal(back.got.batch.logprobs, r.got.batch.logprobs)
    assert back.got.result == r.got.result and back.got.said == r.got.said and back.got.batch.turns == [1, 2]
    assert torch.equal(back.sampled.response_lengths, r.sampled.response_lengths)
    assert isinstance(back.got.rows[0]["fields"]["when"], str)


def test_only_the_rollout_kinds_are_rebuilt():
    with pytest.raises(ValueError, match="names 'Popen'"):
        from_plain({TAG: "Popen", "args": ["sh"]})


def test_staleness_without_rollout_workers_is_a_note_and_with_them_takes_a_tis_cap(tiny_dir, tmp_path):
    one = tiny_config(tiny_dir, tmp_path, "rollout.max_staleness=1")
    cfg, notes = async_settings(one)
    assert cfg == one and len(notes) == 1 and "rollout.max_staleness=1 is ignored" in notes[0]
    apart = tiny_config(
        tiny_dir, tmp_path, "rollout.max_staleness=1", "distributed.backend=ray", "distributed.rollout_workers=1"
    )
    cfg, notes = async_settings(apart)
    assert cfg.algo.tis_cap == ASYNC_TIS_CAP and "algo.tis_cap=2" in notes[0]
    kept = tiny_config(
        tiny_dir, tmp_path, "rollout.max_staleness=2", "algo.tis_cap=5", "distributed.backend=ray",
        "distributed.rollout_workers=1",
    )  # fmt: skip
    assert async_settings(kept) == (kept, [])


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["distributed.rollout_workers=1"], "distributed.rollout_workers=1 runs rollouts in Ray actors"),
        (["rollout.max_staleness=-1"], "rollout.max_staleness=-1: must be >= 0"),
        (["distributed.backend=ray", "distributed.rollout_workers=-2"], "distributed.rollout_workers=-2: must be >= 0"),
    ],
)
def test_bad_async_settings_are_one_line(overrides, says):
    pytest.importorskip("ray")
    with pytest.raises(UserError, match=says):
        load_config(None, overrides)


def test_pushed_weights_travel_as_bytes_and_come_back_equal():
    """The push's NumPy form (one copy into Ray's object store, none out) gives every dtype back bit for
    bit, bfloat16 and a 0-dim tensor included."""
    from rlvr.distributed.worker import as_bytes, from_bytes

    named = {
        "w": torch.randn(3, 4),
        "b": torch.randn(5, 2).bfloat16(),
        "s": torch.tensor(2.5),
        "h": torch.randn(6).half(),
    }
    back = from_bytes(as_bytes(named))
    assert all(
        back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v) for k, v in named.items()
    )
