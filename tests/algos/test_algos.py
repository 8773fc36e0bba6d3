"""Golden and invariance tests for rlvr.algos (CPU, hand arithmetic in comments)."""

import math
import subprocess
import sys

import pytest
import torch

from rlvr.algos import (
    AdvMethod,
    KLEstimator,
    LossAgg,
    RatioLevel,
    aggregate,
    entropy_from_logits,
    group_advantages,
    informative_groups,
    kl_divergence,
    kl_shaped_rewards,
    masked_mean,
    overlong_penalty,
    policy_loss,
    token_logprobs,
    token_logprobs_entropy,
    truncated_importance_weights,
)
from rlvr.algos.losses import token_loss

# ---------------------------------------------------------------- advantages


def test_grpo_golden_single_group():
    # mean = 1/4 = 0.25; deviations [.75, -.25, -.25, -.25]
    # ddof=1: var = (.5625 + 3*.0625) / 3 = .75/3 = .25 -> std = .5
    # adv = dev / (.5 + 1e-6) ≈ [1.5, -.5, -.5, -.5]; eps shifts each by ~|adv|*2e-6 <= 3e-6
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=5e-6, rtol=0)
    torch.testing.assert_close(adv[0], torch.tensor(0.75 / (0.5 + 1e-6)))


def test_grpo_two_groups():
    # group 1 [1,0,0,0] -> [1.5,-.5,-.5,-.5] (see above)
    # group 2 [2,4,6,8]: mean 5, dev [-3,-1,1,3], var (9+1+1+9)/3 = 20/3, std = 2.5820
    #   -> [-1.1619, -0.3873, 0.3873, 1.1619]
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0, 2, 4, 6, 8]), 4, method=AdvMethod.GRPO)
    s = math.sqrt(20 / 3)
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, -3 / s, -1 / s, 1 / s, 3 / s])
    torch.testing.assert_close(adv, expected, atol=5e-6, rtol=0)


def test_grpo_eps_convention():
    # eps=1: [1,0,0,0] -> .75 / (.5 + 1) = .5, -.25 / 1.5 = -1/6
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0]), 4, eps=1.0)
    torch.testing.assert_close(adv, torch.tensor([0.5, -1 / 6, -1 / 6, -1 / 6]))


def test_dr_grpo_golden():
    # r - mean: mean(1,0,0,0) = .25 -> [.75,-.25,-.25,-.25]; mean(3,5,4,4) = 4 -> [-1, 1, 0, 0]
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0, 3, 5, 4, 4]), 4, method=AdvMethod.DR_GRPO)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, -1.0, 1.0, 0.0, 0.0]))


def test_rloo_golden():
    # leave-one-out: r_0 - mean(0,0,0) = 1; r_1 - mean(1,0,0) = -1/3 (= 4/3 * [.75, -.25])
    # group [3,5]: 3 - 5 = -2, 5 - 3 = 2
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0]), 4, method=AdvMethod.RLOO)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    adv = group_advantages(torch.tensor([3.0, 5.0]), 2, method="rloo")
    torch.testing.assert_close(adv, torch.tensor([-2.0, 2.0]))


def test_reinforce_pp_golden():
    # groups [1,0,0,0] and [1,1,1,1]: centred [.75,-.25,-.25,-.25, 0,0,0,0]
    # batch std ddof=1 over 8: sqrt((.5625 + 3*.0625) / 7) = sqrt(.75/7) = 0.327327
    # -> [.75/.327327, -.25/.327327] = [2.291288, -0.763763]; the all-equal group stays exactly 0
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1]), 4, method=AdvMethod.REINFORCE_PP)
    std = math.sqrt(0.75 / 7)
    expected = torch.tensor([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std, 0, 0, 0, 0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert torch.equal(adv[4:], torch.zeros(4))


@pytest.mark.parametrize("method", list(AdvMethod))
def test_all_equal_group_is_exactly_zero(method):
    # 0.1 is not exactly representable; mean(0.1 x 3) != 0.1 in floats, yet adv must be exactly 0
    for rewards in ([0.1, 0.1, 0.1], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [-0.5, -0.5, -0.5]):
        adv = group_advantages(torch.tensor(rewards), 3, method=method)
        assert torch.equal(adv, torch.zeros(3))


@pytest.mark.parametrize("method", list(AdvMethod))
def test_group_of_one_is_zero_not_nan(method):
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.7]), 1, method=method)
    assert torch.equal(adv, torch.zeros(3))


def test_group_advantages_accepts_bool_rewards():
    adv = group_advantages(torch.tensor([True, False, False, False]), 4)
    torch.testing.assert_close(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=5e-6, rtol=0)


@pytest.mark.parametrize("n, g", [(5, 4), (6, 4), (3, 0)])
def test_group_advantages_rejects_bad_group_size(n, g):
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(n), g)


def _advantages_loop(rewards: torch.Tensor, G: int, method: AdvMethod, eps: float = 1e-6) -> torch.Tensor:
    """Reference: one sample at a time, in float64, straight from the formulas."""
    r = rewards.double().tolist()
    out = []
    for start in range(0, len(r), G):
        group = r[start : start + G]
        mean = sum(group) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (G - 1)) if G > 1 else 0.0
        for i, x in enumerate(group):
            if method == AdvMethod.GRPO:
                out.append((x - mean) / (std + eps))
            elif method in (AdvMethod.DR_GRPO, AdvMethod.REINFORCE_PP):
                out.append(x - mean)
            else:
                others = group[:i] + group[i + 1 :]
                out.append(x - sum(others) / len(others) if others else 0.0)
    if method == AdvMethod.REINFORCE_PP:
        n = len(out)
        std = math.sqrt(sum(a * a for a in out) / max(n - 1, 1))
        out = [a / (std + eps) for a in out]
    return torch.tensor(out, dtype=torch.float64).float()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("group_size", [1, 2, 5])
@pytest.mark.parametrize("method", list(AdvMethod))
def test_group_advantages_match_reference_loop(seed, group_size, method):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (4 * group_size,), generator=gen).float() * 0.5 + torch.rand(1, generator=gen)
    expected = _advantages_loop(rewards, group_size, method)
    torch.testing.assert_close(group_advantages(rewards, group_size, method=method), expected, atol=1e-5, rtol=1e-5)


def test_informative_groups():
    # [1,0,0,0] varies; [1,1,1,1] is flat; [.5,.5,.5,.6] varies
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.6])
    assert informative_groups(r, 4).tolist() == [True, False, True]


# ---------------------------------------------------------------- KL


@pytest.mark.parametrize("estimator", list(KLEstimator))
def test_kl_zero_when_policies_equal(estimator):
    logp = -torch.rand(3, 5) * 5
    assert torch.equal(kl_divergence(logp, logp.clone(), estimator=estimator), torch.zeros(3, 5))


def test_kl_hand_values():
    # logp = 0, ref_logp = ln 2 -> d = ln 2 = 0.693147
    # k1 = -d = -0.693147; k2 = d^2/2 = 0.240227; k3 = e^d - d - 1 = 2 - 0.693147 - 1 = 0.306853
    logp, ref = torch.zeros(1, 1), torch.full((1, 1), math.log(2))
    ln2 = math.log(2)
    torch.testing.assert_close(kl_divergence(logp, ref, estimator=KLEstimator.K1), torch.tensor([[-ln2]]))
    torch.testing.assert_close(kl_divergence(logp, ref, estimator=KLEstimator.K2), torch.tensor([[0.5 * ln2**2]]))
    torch.testing.assert_close(kl_divergence(logp, ref, estimator="k3"), torch.tensor([[1 - ln2]]))


def test_k2_k3_nonnegative_on_random_inputs():
    gen = torch.Generator().manual_seed(0)
    logp, ref = (torch.randn(64, 32, generator=gen) * 4 for _ in range(2))
    assert (kl_divergence(logp, ref, estimator=KLEstimator.K3) >= 0).all()
    assert (kl_divergence(logp, ref, estimator=KLEstimator.K2) >= 0).all()


def test_k3_clamps():
    # d = ref - logp:
    #  -5 -> e^-5 + 5 - 1 = 4.006738 (below the cap, untouched)
    #   3 -> e^3 - 3 - 1 = 16.0855 -> capped at 10
    # -30 -> d clamped to -20: e^-20 + 20 - 1 = 19 -> capped at 10
    # 100 -> d clamped to 20: e^20 - 21 (finite, no inf) -> capped at 10
    d = torch.tensor([[-5.0, 3.0, -30.0, 100.0]])
    logp = torch.zeros_like(d, requires_grad=True)
    k3 = kl_divergence(logp, d, estimator=KLEstimator.K3)
    torch.testing.assert_close(k3, torch.tensor([[math.exp(-5) + 4, 10.0, 10.0, 10.0]]))
    k3.sum().backward()
    # d(k3)/d(logp) = -(e^d - 1) = 1 - e^-5 where unclamped; clamped tokens get no gradient
    torch.testing.assert_close(logp.grad, torch.tensor([[1 - math.exp(-5), 0.0, 0.0, 0.0]]))


def test_k1_k2_are_not_clamped():
    # d = 30: k1 = -30, k2 = 450
    logp, ref = torch.zeros(1, 1), torch.full((1, 1), 30.0)
    assert kl_divergence(logp, ref, estimator=KLEstimator.K1).item() == -30.0
    assert kl_divergence(logp, ref, estimator=KLEstimator.K2).item() == 450.0


# ---------------------------------------------------------------- policy loss (token level)


def _loss_at(ratio: float, adv: float, clip_low=0.2, clip_high=0.2, dual_clip=None):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, stats = policy_loss(
        logp,
        torch.zeros(1, 1),
        torch.tensor([adv]),
        torch.ones(1, 1),
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
    )
    loss.sum().backward()
    return loss.item(), logp.grad.item(), stats


def test_clipped_above_positive_adv():
    # ratio 1.5, A=+1: max(-1.5, -clip(1.5, .8, 1.2)) = max(-1.5, -1.2) = -1.2, constant in logp
    loss, grad, stats = _loss_at(1.5, 1.0)
    assert loss == pytest.approx(-1.2) and grad == 0.0
    assert stats["clipped_high"].item() and not stats["clipped_low"].item()
    assert stats["ratio"].item() == pytest.approx(1.5)


def test_clipped_below_negative_adv():
    # ratio 0.5, A=-1: max(0.5, clip(.5, .8, 1.2)) = max(0.5, 0.8) = 0.8, constant in logp
    loss, grad, stats = _loss_at(0.5, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0
    assert stats["clipped_low"].item() and not stats["clipped_high"].item()


def test_inside_trust_region():
    # ratio 1.1, A=+1: both branches -1.1; d(-ratio)/d(logp) = -ratio = -1.1
    loss, grad, stats = _loss_at(1.1, 1.0)
    assert loss == pytest.approx(-1.1) and grad == pytest.approx(-1.1)
    assert not stats["clipped_low"].item() and not stats["clipped_high"].item()


def test_pessimistic_side_is_not_clipped():
    # ratio 0.5, A=+1: max(-0.5, -0.8) = -0.5, the unclipped branch keeps its gradient -0.5
    loss, grad, stats = _loss_at(0.5, 1.0)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5)
    assert not stats["clipped_low"].item() and not stats["clipped_high"].item()


def test_asymmetric_clip_higher():
    # clip_high .28: ratio 1.5, A=+1 -> max(-1.5, -1.28) = -1.28, grad 0
    loss, grad, _ = _loss_at(1.5, 1.0, clip_high=0.28)
    assert loss == pytest.approx(-1.28) and grad == 0.0
    # ratio 1.25 would be clipped at 1.2 with symmetric .2, but not at 1.28: loss -1.25, grad -1.25
    loss, grad, _ = _loss_at(1.25, 1.0, clip_high=0.28)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25)
    # the low side still uses clip_low .2: ratio .5, A=-1 -> 0.8
    loss, grad, _ = _loss_at(0.5, -1.0, clip_high=0.28)
    assert loss == pytest.approx(0.8) and grad == 0.0


def test_dual_clip():
    # c = 3, A = -1, ratio 4: PPO loss max(4, 1.2) = 4 > -A*c = 3 -> 3, constant (grad 0)
    loss, grad, stats = _loss_at(4.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0) and grad == 0.0 and stats["dual_clipped"].item()
    # ratio 2: max(2, 1.2) = 2 < 3 -> unchanged, grad = d(ratio)/d(logp) = 2
    loss, grad, stats = _loss_at(2.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(2.0) and grad == pytest.approx(2.0) and not stats["dual_clipped"].item()
    # A = +1, ratio 4: dual-clip never applies to positive advantages -> -1.2 as plain PPO
    loss, grad, stats = _loss_at(4.0, 1.0, dual_clip=3.0)
    assert loss == pytest.approx(-1.2) and not stats["dual_clipped"].item()
    # without dual-clip the ratio-4 negative token costs 4
    assert _loss_at(4.0, -1.0)[0] == pytest.approx(4.0)


def test_token_level_adv_broadcast_and_flags():
    # ratios [1.5, 1.1, 0.5]; adv [B] broadcasts like the equivalent [B,T]
    logp = torch.log(torch.tensor([[1.5, 1.1, 0.5]]))
    old, mask = torch.zeros(1, 3), torch.ones(1, 3)
    kw = dict(clip_low=0.2, clip_high=0.2)
    loss_b, stats_b = policy_loss(logp, old, torch.tensor([1.0]), mask, **kw)
    loss_bt, stats_bt = policy_loss(logp, old, torch.ones(1, 3), mask, **kw)
    torch.testing.assert_close(loss_b, torch.tensor([[-1.2, -1.1, -0.5]]))
    assert torch.equal(loss_b, loss_bt) and torch.equal(stats_b["clipped_high"], stats_bt["clipped_high"])
    assert stats_b["clipped_high"].dtype == torch.bool
    assert stats_b["clipped_high"].tolist() == [[True, False, False]]
    # per-token adv signs [+1, +1, -1] -> third token (ratio .5, A=-1) is clipped low: 0.8
    loss, stats = policy_loss(logp, old, torch.tensor([[1.0, 1.0, -1.0]]), mask, **kw)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -1.1, 0.8]]))
    assert stats["clipped_low"].tolist() == [[False, False, True]]


def test_token_log_ratio_is_clamped_to_20_before_exp():
    # old_logp −100 (a token the sampler almost never draws), logp 0: log-ratio 100 -> 20,
    # ratio exp(20) = 485165195.4 instead of exp(100) = inf in float32. A=−1: loss
    # max(−A·ρ, −A·clip(ρ)) = max(4.85e8, 1.2) = 4.85e8, constant in logp (grad 0).
    # The second token is padding with the same numbers: 0·4.85e8 = 0, where 0·inf was NaN.
    logp = torch.zeros(1, 2, requires_grad=True)
    old, mask = torch.full((1, 2), -100.0), torch.tensor([[1.0, 0.0]])
    loss, stats = policy_loss(logp, old, torch.tensor([-1.0]), mask, clip_low=0.2, clip_high=0.2)
    assert stats["ratio"][0, 0].item() == pytest.approx(math.exp(20), rel=1e-6)
    assert loss[0, 0].item() == pytest.approx(math.exp(20), rel=1e-6)
    out = aggregate(loss, mask, mode=LossAgg.TOKEN_MEAN)
    out.backward()
    assert out.item() == pytest.approx(math.exp(20), rel=1e-6)
    assert logp.grad.tolist() == [[0.0, 0.0]]
    # log-ratio −100 -> −20: ratio exp(−20) = 2.06e−9, A=+1: max(−2.06e−9, −0.8) = −2.06e−9
    loss, stats = policy_loss(old, logp.detach(), torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.2)
    assert stats["ratio"][0, 0].item() == pytest.approx(math.exp(-20), rel=1e-6)


# ---------------------------------------------------------------- policy loss (sequence level, GSPO)


def test_gspo_golden():
    # token log-ratios [ln 2, 0] on 2 real tokens (+1 padded): log s = ln2 / 2 -> s = sqrt 2 = 1.414214
    # A=+1, clip .2/.2: -min(1.414, 1.2) = -1.2 on every token, all clipped high
    logp = torch.tensor([[math.log(2), 0.0, 5.0]], requires_grad=True)
    old, mask = torch.zeros(1, 3), torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.2, level="sequence")
    torch.testing.assert_close(loss[:, :2], torch.tensor([[-1.2, -1.2]]))
    assert stats["clipped_high"][0, :2].all()
    torch.testing.assert_close(stats["ratio"][:, :2], torch.full((1, 2), math.sqrt(2)))
    # wide clip: loss -s = -1.414214 per token; seq_mean_token_mean = -s, grad per token = -s/L = -0.707107
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=1.0, level=RatioLevel.SEQUENCE)
    out = aggregate(loss, mask, mode=LossAgg.SEQ_MEAN_TOKEN_MEAN)
    out.backward()
    assert out.item() == pytest.approx(-math.sqrt(2))
    torch.testing.assert_close(logp.grad, torch.tensor([[-math.sqrt(2) / 2, -math.sqrt(2) / 2, 0.0]]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_gradient_equals_sequence_objective(seed):
    # loop reference: J = (1/B) Σ_i -min(s_i A_i, clip(s_i) A_i), s_i = exp(Σ_t m(logp - old) / L_i)
    gen = torch.Generator().manual_seed(seed)
    B, T = 4, 5
    logp = (torch.randn(B, T, generator=gen) * 0.1).requires_grad_()
    old = torch.randn(B, T, generator=gen) * 0.1
    adv = torch.randn(B, generator=gen)
    mask = (torch.arange(T) < torch.tensor([5, 2, 3, 1])[:, None]).float()
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.05, clip_high=0.05, level="sequence")
    (g_vec,) = torch.autograd.grad(aggregate(loss, mask, mode=LossAgg.SEQ_MEAN_TOKEN_MEAN), logp)
    total = 0
    for i in range(B):
        L = int(mask[i].sum())
        s = torch.exp((logp[i, :L] - old[i, :L]).sum() / L)
        total = total + torch.max(-adv[i] * s, -adv[i] * s.clamp(0.95, 1.05))
    (g_loop,) = torch.autograd.grad(total / B, logp)
    torch.testing.assert_close(g_vec, g_loop)


def _policy_loss_loop(logp, old, adv, clip_low, clip_high, dual_clip):
    """Reference: one token at a time with Python floats."""
    out = torch.zeros_like(logp)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            r = math.exp(min(max(float(logp[i, t] - old[i, t]), -20.0), 20.0))
            a = float(adv[i])
            v = max(-a * r, -a * min(max(r, 1 - clip_low), 1 + clip_high))
            if dual_clip is not None and a < 0:
                v = min(v, -a * dual_clip)
            out[i, t] = v
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dual_clip", [None, 1.5])
def test_policy_loss_matches_reference_loop(seed, dual_clip):
    gen = torch.Generator().manual_seed(seed)
    logp, old = torch.randn(4, 6, generator=gen) * 0.5, torch.randn(4, 6, generator=gen) * 0.5
    adv = torch.randn(4, generator=gen)
    loss, _ = policy_loss(logp, old, adv, torch.ones(4, 6), clip_low=0.2, clip_high=0.28, dual_clip=dual_clip)
    torch.testing.assert_close(loss, _policy_loss_loop(logp, old, adv, 0.2, 0.28, dual_clip))


@pytest.mark.parametrize("level", list(RatioLevel))
def test_policy_loss_ignores_masked_positions(level):
    gen = torch.Generator().manual_seed(4)
    logp = (torch.randn(3, 5, generator=gen) * 0.3).requires_grad_()
    old = torch.randn(3, 5, generator=gen) * 0.3
    adv, mask = torch.randn(3, generator=gen), torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    kw = dict(clip_low=0.2, clip_high=0.2, level=level)
    base = aggregate(policy_loss(logp, old, adv, mask, **kw)[0], mask, mode=LossAgg.TOKEN_MEAN)
    (g_base,) = torch.autograd.grad(base, logp)
    logp2 = torch.where(mask.bool(), logp.detach(), torch.tensor(7.0)).requires_grad_()
    old2 = torch.where(mask.bool(), old, torch.tensor(-9.0))
    changed = aggregate(policy_loss(logp2, old2, adv, mask, **kw)[0], mask, mode=LossAgg.TOKEN_MEAN)
    (g_changed,) = torch.autograd.grad(changed, logp2)
    torch.testing.assert_close(changed, base)
    torch.testing.assert_close(g_changed * mask, g_base * mask)


# ---------------------------------------------------------------- TIS and reward shaping


def test_truncated_importance_weights_golden():
    # old - rollout = ln 3 -> 3, capped at 2; ln .5 -> .5 (no lower bound); 0 -> 1; 100 -> capped, no inf
    old = torch.tensor([[math.log(3), math.log(0.5), 0.0, 100.0]], requires_grad=True)
    w = truncated_importance_weights(old, torch.zeros(1, 4), cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0, 2.0]]))
    assert not w.requires_grad


def test_overlong_penalty_golden():
    # L = 10, b = 4: penalty starts after 6 tokens. len 6 -> 0; 8 -> (6-8)/4 = -.5; 10 -> -1; 12 -> capped -1
    lengths = torch.tensor([3, 6, 8, 10, 12])
    torch.testing.assert_close(overlong_penalty(lengths, max_len=10, buffer=4), torch.tensor([0, 0, -0.5, -1, -1.0]))
    # factor 2 doubles it: 8 -> -1
    assert overlong_penalty(torch.tensor([8]), max_len=10, buffer=4, factor=2.0).item() == -1.0


def test_kl_shaped_rewards_golden():
    # seq 0: token d = ref - logp = [ln 2, 0], k3 = [1 - ln 2, 0] = [.306853, 0] -> r' = 1 - .1*.306853 = .969315
    # seq 1: the padded token's d = ln 2 is masked -> KL 0 -> r' = 0
    logp = torch.zeros(2, 2)
    ref = torch.tensor([[math.log(2), 0.0], [0.0, math.log(2)]])
    mask = torch.tensor([[1, 1], [1, 0]])
    out = kl_shaped_rewards(torch.tensor([1.0, 0.0]), logp, ref, mask, coef=0.1, estimator=KLEstimator.K3)
    torch.testing.assert_close(out, torch.tensor([1 - 0.1 * (1 - math.log(2)), 0.0]))


# ---------------------------------------------------------------- aggregate

LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_aggregate_token_mean_hand():
    # masked sum = 1+2+3 + 5 = 11; local tokens = 3 + 1 = 4 -> 11/4 = 2.75
    assert aggregate(LOSS, MASK, mode=LossAgg.TOKEN_MEAN).item() == pytest.approx(2.75)
    # global count 22 tokens (e.g. other micro-batches) -> 11/22 = 0.5
    assert aggregate(LOSS, MASK, mode=LossAgg.TOKEN_MEAN, num_tokens=22).item() == pytest.approx(0.5)
    assert aggregate(LOSS, MASK, mode="token_mean", num_tokens=torch.tensor(22.0)).item() == pytest.approx(0.5)


def test_aggregate_seq_mean_token_mean_hand():
    # row 0: (1+2+3)/3 = 2; row 1: 5/1 = 5 -> (2+5)/2 = 3.5; with num_seqs=7: 7/7 = 1
    assert aggregate(LOSS, MASK, mode=LossAgg.SEQ_MEAN_TOKEN_MEAN).item() == pytest.approx(3.5)
    assert aggregate(LOSS, MASK, mode=LossAgg.SEQ_MEAN_TOKEN_MEAN, num_seqs=7).item() == pytest.approx(1.0)


def test_aggregate_seq_mean_token_sum_norm_hand():
    # (6 + 5) / (num_seqs 2 * T 4) = 11/8 = 1.375; max_len=11 -> 11/22 = 0.5
    mode = LossAgg.SEQ_MEAN_TOKEN_SUM_NORM
    assert aggregate(LOSS, MASK, mode=mode).item() == pytest.approx(1.375)
    assert aggregate(LOSS, MASK, mode=mode, max_len=11).item() == pytest.approx(0.5)
    # num_seqs=11, max_len=1 -> 11/11 = 1
    assert aggregate(LOSS, MASK, mode=mode, num_seqs=11, max_len=1).item() == pytest.approx(1.0)


def _aggregate_loop(loss, mask, mode, num_tokens, num_seqs, max_len):
    total, per_seq = 0.0, []
    for i in range(loss.shape[0]):
        s = sum(float(loss[i, t]) for t in range(loss.shape[1]) if mask[i, t])
        n = sum(int(mask[i, t]) for t in range(loss.shape[1]))
        total += s
        per_seq.append(s / max(n, 1))
    if mode == LossAgg.TOKEN_MEAN:
        return total / num_tokens
    if mode == LossAgg.SEQ_MEAN_TOKEN_MEAN:
        return sum(per_seq) / num_seqs
    return total / (num_seqs * max_len)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", list(LossAgg))
def test_aggregate_matches_reference_loop(seed, mode):
    gen = torch.Generator().manual_seed(seed)
    loss = torch.randn(6, 7, generator=gen)
    mask = (torch.rand(6, 7, generator=gen) > 0.3).long()
    denoms = dict(num_tokens=40, num_seqs=9, max_len=16)
    expected = _aggregate_loop(loss, mask, mode, **denoms)
    assert aggregate(loss, mask, mode=mode, **denoms).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("mode", list(LossAgg))
def test_aggregate_ignores_masked_positions(mode):
    changed = LOSS.clone()
    changed[MASK == 0] = torch.tensor([100.0, -7.0, 1e6, 0.5])
    assert torch.equal(aggregate(LOSS, MASK, mode=mode), aggregate(changed, MASK, mode=mode))
    assert torch.equal(aggregate(LOSS, MASK.bool(), mode=mode), aggregate(LOSS, MASK, mode=mode))


@pytest.mark.parametrize("mode", list(LossAgg))
def test_aggregate_empty_mask_is_zero_not_nan(mode):
    out = aggregate(LOSS, torch.zeros_like(MASK), mode=mode)
    assert out.item() == 0.0
    # an all-padding row in a seq mode contributes 0 (its length is clamped to 1)
    assert aggregate(LOSS, torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]]), mode=mode).isfinite()


def test_masked_mean():
    # (1+2+3+5)/4 = 2.75; empty mask -> 0, not NaN
    assert masked_mean(LOSS, MASK).item() == pytest.approx(2.75)
    assert masked_mean(LOSS, torch.zeros_like(MASK)).item() == 0.0


# ---------------------------------------------------------------- invariance


def _policy_batch(seed: int = 0):
    """8 sequences, T=6, V=11; logp from a tiny Linear so gradients are real."""
    torch.manual_seed(seed)
    batch, seq, dim, vocab = 8, 6, 4, 11
    model = torch.nn.Linear(dim, vocab)
    feats = torch.randn(batch, seq, dim)
    tokens = torch.randint(0, vocab, (batch, seq))
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4, 3])  # unequal, so per-micro-batch counts differ
    mask = (torch.arange(seq) < lengths[:, None]).float()
    with torch.no_grad():
        # old policy a bit off so that some tokens are clipped
        old_logp = token_logprobs(model(feats), tokens) + 0.3 * torch.randn(batch, seq)
    adv = group_advantages(torch.randint(0, 2, (batch,)).float(), 4)
    return model, feats, tokens, mask, old_logp, adv


def _step_loss(model, feats, tokens, mask, old_logp, adv, mode, level=RatioLevel.TOKEN, **denoms):
    logp = token_logprobs(model(feats), tokens)
    loss, _ = policy_loss(logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=1.5, level=level)
    return aggregate(loss, mask, mode=mode, **denoms)


@pytest.mark.parametrize("level", list(RatioLevel))
@pytest.mark.parametrize("mode", list(LossAgg))
@pytest.mark.parametrize("micro_batch_seqs", [1, 2, 4, 8])
def test_micro_batch_split_gives_same_gradient(mode, micro_batch_seqs, level):
    model, feats, tokens, mask, old_logp, adv = _policy_batch()
    batch = feats.shape[0]

    full = _step_loss(model, feats, tokens, mask, old_logp, adv, mode, level, max_len=6)
    full.backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    # global denominators: counted once over the whole step, passed to every micro-batch
    denoms = {"num_tokens": mask.sum(), "num_seqs": batch, "max_len": 6}
    total = torch.zeros(())
    for start in range(0, batch, micro_batch_seqs):
        rows = slice(start, start + micro_batch_seqs)
        loss = _step_loss(
            model, feats[rows], tokens[rows], mask[rows], old_logp[rows], adv[rows], mode, level, **denoms
        )
        loss.backward()
        total += loss.detach()

    torch.testing.assert_close(total, full.detach())
    for p, g in zip(model.parameters(), full_grads):
        torch.testing.assert_close(p.grad, g)


def test_local_token_mean_over_grad_accum_is_not_invariant():
    # the bug class the global denominator prevents (TRL #2995): local mean / accum steps
    model, feats, tokens, mask, old_logp, adv = _policy_batch()
    full = _step_loss(model, feats, tokens, mask, old_logp, adv, LossAgg.TOKEN_MEAN)
    naive = sum(
        _step_loss(
            model,
            feats[i : i + 1],
            tokens[i : i + 1],
            mask[i : i + 1],
            old_logp[i : i + 1],
            adv[i : i + 1],
            LossAgg.TOKEN_MEAN,
        )
        / 8
        for i in range(8)
    )
    assert not torch.allclose(naive, full)


@pytest.mark.parametrize("mode", list(LossAgg))
def test_shard_sum_equals_whole(mode):
    # two data-parallel "ranks" with halves of the batch and global denominators
    gen = torch.Generator().manual_seed(3)
    loss = torch.randn(8, 5, generator=gen)
    mask = (torch.rand(8, 5, generator=gen) > 0.4).float()
    whole = aggregate(loss, mask, mode=mode)
    denoms = {"num_tokens": mask.sum(), "num_seqs": 8, "max_len": 5}
    halves = sum(aggregate(loss[s], mask[s], mode=mode, **denoms) for s in (slice(0, 4), slice(4, 8)))
    torch.testing.assert_close(halves, whole)


# ---------------------------------------------------------------- logprobs / entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_matches_naive(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 17, generator=gen) * 3).requires_grad_()
    tokens = torch.randint(0, 17, (3, 5), generator=gen)
    naive = torch.log_softmax(logits / temperature, -1).gather(-1, tokens[..., None])[..., 0]
    fast = token_logprobs(logits, tokens, temperature=temperature)
    assert fast.dtype == torch.float32 and fast.shape == (3, 5)
    torch.testing.assert_close(fast, naive)
    (grad_fast,) = torch.autograd.grad(fast.sum(), logits)
    (grad_naive,) = torch.autograd.grad(naive.sum(), logits)
    torch.testing.assert_close(grad_fast, grad_naive)


def test_token_logprobs_bf16_logits_return_float32():
    logits = torch.randn(2, 4, 9).to(torch.bfloat16)
    tokens = torch.randint(0, 9, (2, 4))
    naive = torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None])[..., 0]
    out = token_logprobs(logits, tokens)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, naive)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_from_logits_matches_naive(temperature):
    logits = (torch.randn(3, 5, 17, generator=torch.Generator().manual_seed(1)) * 3).requires_grad_()
    logp = torch.log_softmax(logits / temperature, -1)
    naive = -(logp.exp() * logp).sum(-1)
    out = entropy_from_logits(logits, temperature=temperature)
    assert out.dtype == torch.float32 and out.shape == (3, 5)
    torch.testing.assert_close(out, naive)
    (g_out,) = torch.autograd.grad(out.sum(), logits)
    (g_naive,) = torch.autograd.grad(naive.sum(), logits)
    torch.testing.assert_close(g_out, g_naive)


@pytest.mark.parametrize(
    "dtype, temperature", [(torch.float32, 1.0), (torch.float32, 0.6), (torch.bfloat16, 1.0), (torch.bfloat16, 0.8)]
)
def test_one_pass_logprobs_and_entropy_match_naive(dtype, temperature):
    """token_logprobs_entropy (one pass, hand-written backward) against log_softmax + gather, with a
    non-uniform upstream gradient, and its entropy against the naive -sum p log p."""
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(4, 6, 33, generator=gen) * 4).to(dtype).requires_grad_()
    tokens = torch.randint(0, 33, (4, 6), generator=gen)
    upstream = torch.randn(4, 6, generator=gen)
    logp, ent = token_logprobs_entropy(logits, tokens, temperature=temperature)
    z = torch.log_softmax(logits.float() / temperature, -1)
    naive = z.gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(logp, naive, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, -(z.exp() * z).sum(-1).detach(), rtol=1e-5, atol=1e-5)
    assert not ent.requires_grad  # a metric
    (g_fast,) = torch.autograd.grad((logp * upstream).sum(), logits)
    (g_naive,) = torch.autograd.grad((naive * upstream).sum(), logits)
    assert g_fast.dtype == dtype
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_fast.float(), g_naive.float(), **tol)


def test_entropy_uniform_is_log_vocab():
    # uniform over V=17 -> H = ln 17 = 2.8332
    torch.testing.assert_close(entropy_from_logits(torch.zeros(2, 3, 17)), torch.full((2, 3), math.log(17)))


# ---------------------------------------------------------------- the per-token loss


def test_token_loss_golden():
    # pg = [1, -2], w = [.5, 2], KL = [.1, .2], beta = .5, H = [1, 3], c_H = .1
    # weighted pg = [1*.5, -2*2] = [.5, -4]
    # loss = pg_w + .5*KL - .1*H = [.5 + .05 - .1, -4 + .1 - .3] = [.45, -4.2]
    pg, w, kl, ent = (
        torch.tensor([[1.0, -2.0]]),
        torch.tensor([[0.5, 2.0]]),
        torch.tensor([[0.1, 0.2]]),
        torch.tensor([[1.0, 3.0]]),
    )
    loss, pg_w = token_loss(pg, tis_weight=w, kl=kl, kl_coef=0.5, entropy=ent, entropy_coef=0.1)
    torch.testing.assert_close(pg_w, torch.tensor([[0.5, -4.0]]))
    torch.testing.assert_close(loss, torch.tensor([[0.45, -4.2]]))
    # only the policy gradient: loss = pg, no term added (not even 0 * inf)
    loss, pg_w = token_loss(pg, entropy=None, entropy_coef=0.1)
    assert torch.equal(loss, pg) and torch.equal(pg_w, pg)
    # KL only: [1 + .5*.1, -2 + .5*.2] = [1.05, -1.9]
    torch.testing.assert_close(token_loss(pg, kl=kl, kl_coef=0.5)[0], torch.tensor([[1.05, -1.9]]))


def test_token_loss_gradients():
    # d loss / d pg = w; d loss / d KL = beta; d loss / d H = -c_H
    pg, kl, ent = (torch.randn(2, 3).requires_grad_() for _ in range(3))
    w = torch.rand(2, 3) + 0.5
    loss, _ = token_loss(pg, tis_weight=w, kl=kl, kl_coef=0.04, entropy=ent, entropy_coef=0.01)
    loss.sum().backward()
    torch.testing.assert_close(pg.grad, w)
    torch.testing.assert_close(kl.grad, torch.full((2, 3), 0.04))
    torch.testing.assert_close(ent.grad, torch.full((2, 3), -0.01))


def _token_loss_inline(pg_tok, weight, kl_tok, kl_coef, entropy, entropy_coef):
    """The per-token loss as the training loop built it inline before it moved to rlvr.algos
    (naive reference): TIS weight, + beta * KL, - c_H * entropy, each only when on."""
    if weight is not None:
        pg_tok = pg_tok * weight
    loss_tok = pg_tok
    if kl_tok is not None:
        loss_tok = loss_tok + kl_coef * kl_tok
    if entropy_coef:
        loss_tok = loss_tok - entropy_coef * entropy
    return loss_tok, pg_tok


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "tis, kl, entropy_coef",
    [(False, False, 0.0), (True, False, 0.0), (False, True, 0.0), (False, False, 0.01), (True, True, 0.02)],
)
def test_token_loss_equals_the_old_inline_loss(seed, tis, kl, entropy_coef):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(4, 6, generator=g) * 3
    old, ref, rollout = (logp + 0.3 * torch.randn(4, 6, generator=g) for _ in range(3))
    adv, mask = torch.randn(4, generator=g), (torch.rand(4, 6, generator=g) > 0.2).float()
    pg, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    weight = truncated_importance_weights(old, rollout, cap=2.0) if tis else None
    kl_tok = kl_divergence(logp, ref, estimator=KLEstimator.K3) if kl else None
    ent = torch.rand(4, 6, generator=g) * 2
    want = _token_loss_inline(pg, weight, kl_tok, 0.05, ent, entropy_coef)
    got = token_loss(
        pg, tis_weight=weight, kl=kl_tok, kl_coef=0.05, entropy=ent if entropy_coef else None, entropy_coef=entropy_coef
    )
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # bit for bit: the same operations


# ---------------------------------------------------------------- import hygiene


def test_algos_imports_without_heavy_packages():
    blocked = ["transformers", "vllm", "ray", "deepspeed", "wandb", "numpy"]
    code = f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\nimport rlvr.algos\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
