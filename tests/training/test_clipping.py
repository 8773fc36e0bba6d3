"""The update's gradient clipping: torch's ``clip_grad_norm_`` bit for bit, without the pass that
multiplies every gradient by 1 when nothing is clipped."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from rlvr import metric_names as M
from rlvr.config import load_config
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.hf import sample_seed
from rlvr.training.loop import accumulate_gradients, adamw, lr_scheduler, update_policy


def _setup(max_norm: float):
    model = tiny_model(seed=5)
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=12, dtype="float32", stop=["7"])
    batch = engine.generate(["what is 3 + 4 ?", "2 + 2 = ?"], 4, seeds=[sample_seed(3, i) for i in range(8)])
    adv = torch.randn(8, generator=torch.Generator().manual_seed(1))
    base = ["rollout.samples_per_prompt=4", "train.prompts_per_step=2", "train.micro_batch_seqs=4", "train.lr=1e-3"]
    cfg = load_config(None, [*base, f"train.max_grad_norm={max_norm}"])
    return model, batch, adv, cfg


def _optimizer(model, cfg):
    opt = adamw(list(model.parameters()), lr=cfg.train.lr, betas=(0.9, 0.99), weight_decay=0.0)
    return opt, lr_scheduler(opt, schedule="constant", warmup_steps=0, total_steps=4, min_lr_ratio=0.1)


def _weights(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("max_norm, clipped", [(1e-3, True), (1e6, False), (0, False)], ids=["clips", "under", "off"])
def test_clipping_equals_torch_clip_grad_norm(max_norm, clipped, monkeypatch):
    """Two steps of ``update_policy`` against accumulate + ``clip_grad_norm_`` + AdamW: the same weights
    and norms bit for bit; the gradients are rescaled only where the norm is over ``max_norm``."""
    model, batch, adv, cfg = _setup(max_norm)
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    (opt, sched), (ref_opt, _) = _optimizer(ours, cfg), _optimizer(theirs, cfg)
    rescales, real = [], torch.nn.utils.clip_grads_with_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_", lambda *a, **k: rescales.append(1) or real(*a, **k))
    limit = max_norm if max_norm > 0 else float("inf")
    for _ in range(2):
        metrics = update_policy(ours, opt, sched, batch, adv, None, None, cfg, contextlib.nullcontext)
        theirs.train()
        accumulate_gradients(theirs, batch, adv, None, None, cfg, contextlib.nullcontext)
        with monkeypatch.context() as m:
            m.setattr(torch.nn.utils, "clip_grads_with_norm_", real)  # torch's own path, uncounted
            norm = torch.nn.utils.clip_grad_norm_(theirs.parameters(), limit)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        assert torch.equal(metrics[M.GRAD_NORM], norm)
        assert (float(norm) > limit) == clipped
        assert torch.equal(_weights(ours), _weights(theirs))
    assert len(rescales) == (2 if clipped else 0)
    assert not torch.equal(_weights(ours), _weights(model))


def test_a_non_finite_norm_skips_the_step_without_rescaling(monkeypatch):
    """A NaN gradient: no optimizer step, no rescale, weights unchanged, the step counted as skipped."""
    model, batch, adv, cfg = _setup(1e-3)
    opt, sched = _optimizer(model, cfg)
    before = _weights(model).clone()
    rescales, real = [], torch.nn.utils.clip_grads_with_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_", lambda *a, **k: rescales.append(1) or real(*a, **k))
    real_accumulate = accumulate_gradients

    def poisoned(policy, *args, **kw):
        out = real_accumulate(policy, *args, **kw)
        next(policy.parameters()).grad.view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr("rlvr.training.loop.accumulate_gradients", poisoned)
    metrics = update_policy(model, opt, sched, batch, adv, None, None, cfg, contextlib.nullcontext)
    assert metrics[M.SKIPPED_UPDATES] == 1 and not torch.isfinite(metrics[M.GRAD_NORM])
    assert rescales == [] and torch.equal(_weights(model), before)
    assert all(p.grad is None for p in model.parameters())
