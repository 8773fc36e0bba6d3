"""Reward shaping applied before advantages: DAPO's overlong penalty and KL-in-reward."""

import torch
from torch import Tensor

from rlvr.algos.losses import kl_divergence
from rlvr.choices import KLEstimator


def overlong_penalty(lengths: Tensor, *, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """Soft penalty for responses that run into the last ``buffer`` tokens of the budget.

    Math: with L = max_len and b = buffer, R(len) = 0 if len <= L − b;
    ((L − b) − len) / b if L − b < len <= L; −1 if len > L; times ``factor``
    (DAPO "soft overlong punishment", Yu et al. 2025 §3.4 eq. 13; MindSpeed-RL
    ``overlong_buffer_penalty_factor``).

    Conventions: the excess is capped at b, so the penalty lies in [−factor, 0]; a response cut
    at exactly max_len tokens gets (−b/b)·factor = −factor. Returned as float32.

    Args:
        lengths: [B] response lengths in tokens.
        max_len: L, the generation budget (``rollout.max_new_tokens``).
        buffer: b, 1 <= b <= L.
        factor: scale of the penalty (>= 0).

    Returns:
        [B] float32 penalty (<= 0), added to the reward.
    """
    excess = (lengths.to(torch.float32) - (max_len - buffer)).clamp(0, buffer)  # [B] in [0, b]
    return -excess / buffer * factor


def kl_shaped_rewards(
    rewards: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, *, coef: float, estimator: KLEstimator
) -> Tensor:
    """Rewards minus the sequence's KL to the reference (KL placement ``reward``).

    Math: r'_i = r_i − β · Σ_t m_it · k(logp_it, ref_logp_it) (KL-penalised reward of PPO
    RLHF, Ouyang et al. 2022 eq. 2 / Stiennon et al. 2020; REINFORCE++ §3, summed over the
    response because the reward is per sequence here).

    Conventions: a sum over the response tokens, not a mean (the KL of the whole sequence);
    the estimator's own clamps apply (see :func:`kl_divergence`); no gradient (inputs are
    sampling-time log-probs). Computed and returned in float32.

    Args:
        rewards: [B] task rewards.
        logp: [B, T] log-probs of the sampled tokens under the sampling-time policy.
        ref_logp: [B, T] log-probs under the reference policy.
        mask: [B, T] 1 on response tokens.
        coef: β >= 0.
        estimator: KL estimator (k1 is the classic choice here).

    Returns:
        [B] float32 shaped rewards.
    """
    kl = kl_divergence(logp.detach().float(), ref_logp.detach().float(), estimator=estimator)  # [B, T]
    kl_seq = (kl * mask.to(kl.dtype)).sum(-1)  # [B]
    return rewards.to(torch.float32) - coef * kl_seq
