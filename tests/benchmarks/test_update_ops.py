"""benchmarks/dev/update_ops.py's parts on a tiny model: the in-place operator timing counts what ran, the
split by pass covers the update, and the zeros comparison runs both sides and puts the code back."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

from rlvr.config import load_config
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.hf import sample_seed
from rlvr.training import loop
from rlvr.training.loop import adamw, lr_scheduler, update_policy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "dev"))
import update_ops  # noqa: E402


def _update(frozen_groups: int):
    model = tiny_model(seed=2)
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=8, dtype="float32", stop=["7"])
    batch = engine.generate(["what is 3 + 4 ?", "2 + 2 = ?"], 4, seeds=[sample_seed(1, i) for i in range(8)])
    base = ["rollout.samples_per_prompt=4", "train.prompts_per_step=2", "train.micro_batch_seqs=4"]
    cfg = load_config(None, base)
    opt = adamw(list(model.parameters()), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    sched = lr_scheduler(opt, schedule="constant", warmup_steps=0, total_steps=10, min_lr_ratio=0.1)
    adv = torch.randn(8, generator=torch.Generator().manual_seed(0))
    adv[: 4 * frozen_groups] = 0
    return lambda: update_policy(model, opt, sched, batch, adv, None, None, cfg, contextlib.nullcontext)


def test_operator_times_count_every_call():
    with update_ops.OpTimes() as ops:
        torch.ones(3) + torch.ones(3)
    assert ops.by_op["aten.add.Tensor"][0] == 1 and ops.by_op["aten.ones.default"][0] == 2


def test_a_mixed_update_splits_into_its_passes():
    row = update_ops._case(_update(1), rounds=2, warmup=1)
    s = row["split_s"]
    assert s["with gradients"] > 0 and s["forward only"] > 0 and s["the rest"] > 0
    assert row["products_s"] > 0 and row["other_ops_s"] > 0 and row["operators"] > 100
    assert loop._micro_batch_backward.__name__ == "_micro_batch_backward"  # put back


def test_the_zeros_comparison_runs_both_sides_and_restores_the_loop():
    zero, clip = loop._zero_missing_grads, loop._clip_gradients
    got = update_ops._zeros_ab(_update(2), rounds=2, warmup=0)
    assert set(got) == {"one zero per shape, no norm", "a zero per parameter, the norm computed"}
    assert all(t > 0 for t in got.values())
    assert (loop._zero_missing_grads, loop._clip_gradients) == (zero, clip)


def test_the_attention_forwards_are_timed_and_the_function_put_back():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from rlvr.models.shared_prefix import SHARED_ATTENTION

    real = ALL_ATTENTION_FUNCTIONS[SHARED_ATTENTION]
    row = update_ops._case(_update(1), rounds=2, warmup=0)
    assert row["attention_calls"] > 0 and row["attention_forward_gflop"] > 0
    assert 0 < row["attention_forward_s"] < row["update_s"]
    assert ALL_ATTENTION_FUNCTIONS[SHARED_ATTENTION] is real
