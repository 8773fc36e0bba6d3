"""Groups whose advantages are all 0 run forward only (train.zero_adv_forward_only): the same weights
and train/ statistics as a backward through them, and no backward where their loss is not 0."""

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
from rlvr.training import loop
from rlvr.training.loop import adamw, batch_logprobs, forward_only_groups, lr_scheduler, update_policy

PROMPTS = ["what is 3 + 4 ?", "what is the answer", "2 + 2 = ?"]


def _batch(model):
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=16, dtype="float32", stop=["7"])
    return engine.generate(PROMPTS, 4, seeds=[sample_seed(9, i) for i in range(12)])


def _cfg(*extra: str):
    base = ["rollout.samples_per_prompt=4", "train.prompts_per_step=3", "train.micro_batch_seqs=4", "train.lr=1e-3"]
    return load_config(None, [*base, "train.weight_decay=0.1", *extra])


@pytest.fixture
def grad_rows(monkeypatch):
    """The rows of every update pass that runs with gradients, in order."""
    rows, real = [], loop._pass_logprobs

    def counted(model, p, *args, **kw):
        if torch.is_grad_enabled():
            rows.append(p.rows.numel())
        return real(model, p, *args, **kw)

    monkeypatch.setattr(loop, "_pass_logprobs", counted)
    return rows


def _train(model, batch, advs, cfg, ref_logp=None):
    """Weights and metrics after one update_policy call per advantage vector."""
    model = copy.deepcopy(model)
    opt = adamw(list(model.parameters()), lr=cfg.train.lr, betas=(0.9, 0.99), weight_decay=cfg.train.weight_decay)
    sched = lr_scheduler(opt, schedule="constant", warmup_steps=0, total_steps=10, min_lr_ratio=0.1)
    metrics = []
    for adv in advs:
        old = None
        if cfg.algo.num_iterations > 1:
            old = batch_logprobs(
                model, batch, micro_batch_seqs=4, group_size=4, temperature=1.0, autocast=contextlib.nullcontext
            )
        metrics.append(update_policy(model, opt, sched, batch, adv, old, ref_logp, cfg, contextlib.nullcontext))
    return torch.cat([p.detach().flatten() for p in model.parameters()]), metrics


def test_forward_only_groups_are_those_of_all_zero_advantages():
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, -0.5, 0.0])
    assert forward_only_groups(adv, 4) == ([0, 2], [1])
    assert forward_only_groups(torch.zeros(8), 4) == ([], [0, 1])


PACKED = ("train.micro_batch_tokens=96", "train.shared_prompt_forward=false")


TIS = ("algo.tis_cap=2.0",)


@pytest.mark.parametrize(
    "iterations, extra", [(1, ()), (2, ()), (1, PACKED), (1, TIS)], ids=["one", "two", "packed", "tis"]
)
def test_forward_only_groups_give_the_same_weights_and_statistics(iterations, extra, grad_rows):
    """A middle group of all-zero advantages, then a step where every group is zero (AdamW still steps
    on its momentum and weight decay): the same weights and train/ statistics as a backward through
    every group, with the zero groups' rows out of every forward that keeps gradients."""
    model = tiny_model(seed=3)
    batch = _batch(model)
    if extra == TIS:  # the engine's log-probs: the trainer's, off by up to 0.2 nats
        lp = batch_logprobs(
            model, batch, micro_batch_seqs=4, group_size=4, temperature=1.0, autocast=contextlib.nullcontext
        )
        noise = torch.rand(lp.shape, generator=torch.Generator().manual_seed(2))
        batch.logprobs = (lp - 0.2 * noise) * batch.response_mask
    adv = torch.randn(12, generator=torch.Generator().manual_seed(1))
    adv[4:8] = 0
    advs = [adv, torch.zeros(12)]
    runs = {}
    for on in (True, False):
        cfg = _cfg(f"train.zero_adv_forward_only={str(on).lower()}", f"algo.num_iterations={iterations}", *extra)
        start = len(grad_rows)
        runs[on] = (*_train(model, batch, advs, cfg), grad_rows[start:])
    (w_on, m_on, rows_on), (w_off, m_off, rows_off) = runs[True], runs[False]
    # AdamW's steps are about lr (1e-3) whatever the gradient's size, so a near-zero gradient's rounding
    # can move a weight by a small part of lr: 1 % of it is the tolerance
    torch.testing.assert_close(w_on, w_off, rtol=1e-5, atol=1e-5)
    for a, b in zip(m_on, m_off):
        assert a.keys() == b.keys() and M.FORWARD_ONLY_FRAC in a
        for k in a.keys() - {M.FORWARD_ONLY_FRAC}:  # entropy, ratios, clip fractions, TIS weights, loss, norm
            torch.testing.assert_close(torch.as_tensor(a[k]), torch.as_tensor(b[k]), rtol=1e-5, atol=1e-7)
    assert (M.TIS_WEIGHT_MEAN in m_on[0]) == (extra == TIS)
    assert float(m_on[1][M.GRAD_NORM]) == 0.0 and float(m_on[1][M.ENTROPY]) > 0
    assert [float(m[M.FORWARD_ONLY_FRAC]) for m in m_on] == [4 / 12, 1.0]
    assert [float(m[M.FORWARD_ONLY_FRAC]) for m in m_off] == [0.0, 0.0]
    assert not torch.equal(w_on, torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert sum(rows_off) == 12 * iterations * 2  # every row, every iteration, both steps
    assert sum(rows_on) == 8 * iterations  # the first step's two trained groups only


@pytest.mark.parametrize("extra", ["algo.entropy_coef=0.01", "algo.kl_coef=0.1"])
def test_groups_whose_loss_is_not_zero_keep_their_backward(extra, grad_rows):
    """An entropy bonus or a KL term in the loss gives zero-advantage tokens a gradient: every row
    runs with gradients."""
    model = tiny_model(seed=4)
    batch = _batch(model)
    ref = None
    if "kl_coef" in extra:
        ref = batch_logprobs(
            model, batch, micro_batch_seqs=4, group_size=4, temperature=1.0, autocast=contextlib.nullcontext
        )
    adv = torch.zeros(12)
    adv[:4] = torch.tensor([1.0, -1.0, 0.5, -0.5])
    _, metrics = _train(model, batch, [adv], _cfg(extra), ref_logp=ref)
    assert sum(grad_rows) == 12 and float(metrics[0][M.GRAD_NORM]) > 0
    assert float(metrics[0][M.FORWARD_ONLY_FRAC]) == 0.0


def test_a_step_of_only_zero_groups_shares_its_zeros_and_skips_the_norm(monkeypatch):
    """Every group forward only, one process: the parameters of one shape step on one zero tensor,
    the norm is not computed (it is 0), and the weights equal those of fresh zeros and a computed norm."""
    model = tiny_model(seed=6)
    batch, cfg = _batch(model), _cfg()
    norms, grads = [], []
    real_norm, real_step = torch.nn.utils.get_total_norm, torch.optim.AdamW.step

    def norm(*args, **kw):
        norms.append(1)
        return real_norm(*args, **kw)

    def step(self, *args, **kw):
        grads.append([p.grad for g in self.param_groups for p in g["params"]])
        return real_step(self, *args, **kw)

    monkeypatch.setattr(torch.nn.utils, "get_total_norm", norm)
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    w_shared, m_shared = _train(model, batch, [torch.zeros(12)], cfg)
    assert not norms and float(m_shared[0][M.GRAD_NORM]) == 0.0
    (seen,) = grads
    shapes = {(tuple(g.shape), g.dtype) for g in seen}
    assert len({g.data_ptr() for g in seen}) == len(shapes) < len(seen)  # one zero tensor per shape
    assert all(not g.any() for g in seen)

    # the same step with a zero tensor per parameter and the norm computed, as several ranks run it
    real_zero, real_clip = loop._zero_missing_grads, loop._clip_gradients
    monkeypatch.setattr(loop, "_zero_missing_grads", lambda *a, shared: real_zero(*a, shared=False))
    monkeypatch.setattr(loop, "_clip_gradients", lambda *a, all_zero: real_clip(*a, all_zero=False))
    w_fresh, m_fresh = _train(model, batch, [torch.zeros(12)], cfg)
    assert norms  # computed this time
    assert torch.equal(w_shared, w_fresh)
    assert float(m_fresh[0][M.GRAD_NORM]) == 0.0
    assert not torch.equal(w_shared, torch.cat([p.detach().flatten() for p in model.parameters()]))


def test_zeros_are_not_shared_across_ranks():
    """With several ranks the gradients are summed in place, so each parameter keeps its own zeros."""
    model = tiny_model(seed=6)
    observed = object()
    loop._zero_missing_grads(model, observed, shared=False)
    grads = [p.grad for p in model.parameters()]
    assert len({g.data_ptr() for g in grads}) == len(grads) and all(not g.any() for g in grads)
    for p in model.parameters():
        p.grad = None
    loop._zero_missing_grads(model, observed, shared=True)
    assert len({p.grad.data_ptr() for p in model.parameters()}) < len(grads)
    loop._zero_missing_grads(model, None, shared=True)  # no forward-only groups: nothing to fill


def test_with_several_ranks_zeros_are_own_and_the_norm_is_computed(monkeypatch):
    """Another rank may have trained groups: its gradients are summed into this rank's zeros, so they
    are not shared, and the norm is computed."""
    from rlvr.training.replicas import OneProcess

    class TwoRanks(OneProcess):
        world_size = 2  # collectives as one process: what matters is what the update asks of them

    model = tiny_model(seed=6)
    batch, cfg = _batch(model), _cfg()
    calls, real_zero, real_clip = [], loop._zero_missing_grads, loop._clip_gradients
    monkeypatch.setattr(
        loop, "_zero_missing_grads", lambda *a, shared: calls.append(shared) or real_zero(*a, shared=shared)
    )
    monkeypatch.setattr(
        loop, "_clip_gradients", lambda *a, all_zero: calls.append(all_zero) or real_clip(*a, all_zero=all_zero)
    )
    opt = adamw(list(model.parameters()), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    sched = lr_scheduler(opt, schedule="constant", warmup_steps=0, total_steps=10, min_lr_ratio=0.1)
    for group in (TwoRanks(), OneProcess()):
        update_policy(model, opt, sched, batch, torch.zeros(12), None, None, cfg, contextlib.nullcontext, group=group)
    assert calls == [False, False, True, True]  # (shared, all_zero) with two ranks, then with one
