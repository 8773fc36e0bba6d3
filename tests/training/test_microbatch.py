"""Length-bucketed forward passes (rlvr.training.microbatch): every row once, prompts still shared,
and the same gradient and log-probs as one pass per micro-batch (so no compute goes to padding)."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch

from rlvr.config import load_config
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.hf import sample_seed
from rlvr.training.loop import accumulate_gradients, batch_logprobs, update_passes
from rlvr.training.microbatch import plan


@pytest.mark.parametrize("mb, G, shared", [(8, 8, True), (16, 8, True), (4, 8, True), (8, 4, False), (6, 4, False)])
def test_plan_covers_every_row_once_and_keeps_prompts_together(mb, G, shared):
    rng = random.Random(mb * G)
    lengths = [rng.choice([3, 20, 60, 128]) for _ in range(32)]
    g = (G if mb % G == 0 else mb) if shared else 1
    passes = plan(lengths, micro_batch_seqs=mb, group_size=g, prompt_len=16)
    rows = [r for p in passes for r in p.rows]
    assert sorted(rows) == list(range(32))
    for p in passes:
        r = p.rows
        assert len({i // mb for i in r}) == 1  # inside one micro-batch
        assert p.longest == max(lengths[i] for i in r)
        if p.group_size > 1:  # consecutive runs of group_size rows share one prompt, one run per prompt
            runs = [r[i : i + p.group_size] for i in range(0, len(r), p.group_size)]
            assert all(len({i // G for i in run}) == 1 for run in runs)
            assert len({run[0] // G for run in runs}) == len(runs)
    unbucketed = plan(lengths, micro_batch_seqs=mb, group_size=g, prompt_len=16, bucket=False)
    cost = lambda ps: sum(len(p.rows) * p.longest for p in ps)  # noqa: E731 - response positions computed
    assert len(passes) > len(unbucketed) and cost(passes) < cost(unbucketed)


def test_equal_lengths_are_not_split():
    passes = plan([50] * 16, micro_batch_seqs=8, group_size=8, prompt_len=100)
    assert [p.rows for p in passes] == [tuple(range(8)), tuple(range(8, 16))]


@pytest.mark.parametrize("shared", [True, False])
def test_bucketed_and_unpadded_passes_give_one_pass_gradient_and_logprobs(shared):
    """Length buckets, and (shared prompts) responses without their padding, against one padded pass
    per micro-batch: the same gradient and log-probs."""
    model = tiny_model(seed=1)
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=24, dtype="float32", stop=["7"])
    batch = engine.generate(["what is 3 + 4 ?", "what is the answer"], 4, seeds=[sample_seed(3, i) for i in range(8)])
    lengths = batch.response_lengths.tolist()
    assert len(set(lengths)) > 2  # short and long responses: bucketing has something to split
    adv = torch.randn(8, generator=torch.Generator().manual_seed(0))
    grads, logps, heads = {}, {}, {}
    model.lm_head.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[:-1].numel()))
    sides = {"buckets": (True, False), "one padded pass": (False, False), "unpadded": (False, True)}
    for side, (bucket, unpadded) in sides.items():
        cfg = load_config(
            None,
            [
                "rollout.samples_per_prompt=4",
                "train.prompts_per_step=2",
                "train.micro_batch_seqs=8",
                f"train.shared_prompt_forward={str(shared).lower()}",
                f"train.length_buckets={str(bucket).lower()}",
                f"train.remove_padding={str(unpadded).lower()}",
            ],
        )
        model.zero_grad(set_to_none=True)
        seen = []
        accumulate_gradients(model, batch, adv, None, None, cfg, contextlib.nullcontext)
        grads[side], heads[side] = torch.cat([p.grad.flatten() for p in model.parameters()]), sum(seen)
        logps[side] = batch_logprobs(
            model,
            batch,
            micro_batch_seqs=8,
            group_size=4 if shared else 1,
            temperature=1.0,
            autocast=contextlib.nullcontext,
            length_buckets=bucket,
            remove_padding=unpadded,
        )
    for side in ("buckets", "unpadded"):
        torch.testing.assert_close(grads[side], grads["one padded pass"], rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(logps[side], logps["one padded pass"], rtol=1e-5, atol=1e-6)
    assert grads["unpadded"].abs().sum() > 0
    # the LM head's positions: 8 rows x the longest padded, fewer bucketed; unpadded (shared prompts)
    # exactly the real ones, each group's own (the groups' sums differ)
    assert heads["one padded pass"] == 8 * max(lengths) > heads["buckets"]
    if shared:
        assert sum(lengths[:4]) != sum(lengths[4:])
        assert heads["unpadded"] == sum(lengths) < heads["buckets"]
    else:  # rows without a shared prompt are not unpadded: the setting changes nothing
        assert heads["unpadded"] == heads["one padded pass"]


def test_unpadded_micro_batches_are_one_pass_each():
    lengths = [3, 40, 7, 12] * 4
    passes = plan(lengths, micro_batch_seqs=8, group_size=4, prompt_len=16, unpadded=True)
    assert [p.rows for p in passes] == [tuple(range(8)), tuple(range(8, 16))]
    assert all(p.unpadded and p.group_size == 4 for p in passes)
    unshared = plan(lengths, micro_batch_seqs=8, group_size=1, prompt_len=16, unpadded=True)
    assert not any(p.unpadded for p in unshared) and len(unshared) > 2  # rows without a shared prompt: buckets


def test_a_micro_batch_of_at_least_the_step_is_one_pass_with_its_prompts_shared():
    """train.micro_batch_seqs above the step's sequences (12 for 2 prompts x 4, not a multiple of the
    group) is accepted and runs as micro_batch_seqs = 8 would: one pass, prompts shared, the same
    gradient bit for bit."""
    model = tiny_model(seed=2)
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=12, dtype="float32", stop=["7"])
    batch = engine.generate(["what is 3 + 4 ?", "what is the answer"], 4, seeds=[sample_seed(5, i) for i in range(8)])
    adv = torch.randn(8, generator=torch.Generator().manual_seed(0))
    grads = {}
    for mb in (8, 12):
        cfg = load_config(
            None, ["rollout.samples_per_prompt=4", "train.prompts_per_step=2", f"train.micro_batch_seqs={mb}"]
        )
        passes = update_passes(batch, cfg, model)
        assert len(passes) == 1 and passes[0].rows.tolist() == list(range(8)) and passes[0].group_size == 4
        model.zero_grad(set_to_none=True)
        accumulate_gradients(model, batch, adv, None, None, cfg, contextlib.nullcontext)
        grads[mb] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.equal(grads[12], grads[8])
