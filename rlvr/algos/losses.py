"""Per-token policy-gradient and KL terms, importance weights, and the reduction of [B, T] losses."""

from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.choices import KLEstimator, LossAgg, RatioLevel

# ---------------------------------------------------------------- policy loss

_MAX_LOG_SEQ_RATIO = 10.0  # veRL's GSPO clamp: exp(10) ≈ 2.2e4, far outside any clip range
_MAX_LOG_TOKEN_RATIO = 20.0  # veRL's PPO clamp: exp(±20) stays finite in float32/bf16 (exp(89) is inf)


def _token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    # an inf ratio would make an inf loss and, at a padded position, inf·0 = NaN in aggregate
    return (logp - old_logp).clamp(-_MAX_LOG_TOKEN_RATIO, _MAX_LOG_TOKEN_RATIO)


def _sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    # GSPO-token form: the value at every token is log s_i = mean_t(logp − old_logp) over the
    # sequence, the gradient at token t is that of logp_t, so seq-mean-token-mean aggregation
    # differentiates exactly s_i·A_i (GSPO eq. 10-11).
    diff = torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp))  # [B, T], NaN-safe padding
    log_s = diff.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # [B, 1]
    return logp - logp.detach() + log_s.detach().clamp(max=_MAX_LOG_SEQ_RATIO)


_LOG_RATIOS: dict[RatioLevel, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    RatioLevel.TOKEN: _token_log_ratio,
    RatioLevel.SEQUENCE: _sequence_log_ratio,
}


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    level: RatioLevel = RatioLevel.TOKEN,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate per token, with clip-higher, optional dual-clip, token or sequence ratio.

    Math: ratio ρ = exp(logp − old_logp) per token (``token``), or the length-normalised
    sequence ratio s_i = exp(mean_t(logp − old_logp)) (``sequence``, GSPO, Zheng et al. 2025
    eq. 7); loss = max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high)) (PPO, Schulman et al. 2017 eq. 7,
    negated for minimisation; asymmetric "clip-higher": DAPO, Yu et al. 2025 §3.1); with
    dual-clip c > 1, loss = min(loss, −A·c) where A < 0 (Ye et al. 2020, "Mastering Complex
    Control in MOBA Games", eq. 5; veRL ``clip_ratio_c``).

    Conventions: the token log-ratio is clamped to [−20, 20] before exp (veRL), so the ratio
    stays finite and a token outside that range gets no gradient; the sequence log-ratio is
    clamped to <= 10 (veRL). Gradients flow only through ``logp`` (pass ``old_logp`` and ``adv``
    detached). Where both branches are equal the unclipped one (and its gradient) is used.
    ``mask`` only matters for ``sequence`` (the per-sequence mean); the returned loss is NOT
    masked: reduce it with :func:`aggregate` (GSPO pairs with ``seq_mean_token_mean``).

    Args:
        logp: [B, T] log-probs of the sampled tokens under the current policy.
        old_logp: [B, T] log-probs under the policy that generated the samples.
        adv: [B] or [B, T] advantages; [B] is broadcast over tokens.
        mask: [B, T] 1 (or True) on response tokens, 0 on padding.
        clip_low: ε_low, the ratio is clamped below at 1 − clip_low.
        clip_high: ε_high, the ratio is clamped above at 1 + clip_high.
        dual_clip: c > 1 caps the loss of negative-advantage tokens at −A·c; None = off.
        level: ``token`` (PPO/GRPO/DAPO) or ``sequence`` (GSPO).

    Returns:
        (loss [B, T], stats) where stats holds unreduced, detached [B, T] tensors so the caller
        reduces them with the step's global denominators: ``ratio`` (float; s_i repeated for
        ``sequence``), ``clipped_low`` / ``clipped_high`` (bool: A < 0 and ρ < 1 − ε_low /
        A > 0 and ρ > 1 + ε_high; the token gets no gradient), ``dual_clipped`` (bool).
    """
    if adv.ndim == 1:
        adv = adv.unsqueeze(-1)  # [B, 1] to broadcast over T
    ratio = torch.exp(_LOG_RATIOS[RatioLevel(level)](logp, old_logp, mask))  # [B, T]
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = loss_clipped > loss_unclipped
    loss = torch.where(clipped, loss_clipped, loss_unclipped)
    dual_clipped = torch.zeros_like(clipped)
    if dual_clip is not None:
        cap = -adv * dual_clip  # [B, 1] or [B, T]; only binding where A < 0
        dual_clipped = (adv < 0) & (loss > cap)
        loss = torch.where(dual_clipped, cap.expand_as(loss), loss)
    stats = {
        "ratio": ratio.detach(),
        "clipped_low": clipped & (adv < 0),
        "clipped_high": clipped & (adv > 0),
        "dual_clipped": dual_clipped,
    }
    return loss, stats


def truncated_importance_weights(old_logp: Tensor, rollout_logp: Tensor, *, cap: float) -> Tensor:
    """Per-token weights that correct for sampling from the rollout engine instead of the trainer.

    Math: w_t = min(π_old(y_t) / π_rollout(y_t), C) = min(exp(old_logp − rollout_logp), C)
    (truncated importance sampling, Ionides 2008; Yao et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training", eq. 3). The policy loss of each
    token is multiplied by w_t.

    Conventions: returned detached (a weight, not a path for gradients); the log-ratio is
    clamped to <= 20 before exp so it never overflows; only capped above (no lower bound).

    Args:
        old_logp: [B, T] trainer log-probs of the sampled tokens under the sampling-time policy.
        rollout_logp: [B, T] the rollout engine's log-probs of the same tokens.
        cap: C > 0, the largest weight.

    Returns:
        [B, T] float weights (padding not masked).
    """
    return torch.exp((old_logp - rollout_logp).detach().clamp(max=20.0)).clamp(max=cap)


# ---------------------------------------------------------------- KL


def _kl_k1(d: Tensor) -> Tensor:
    return -d


def _kl_k2(d: Tensor) -> Tensor:
    return 0.5 * d.square()


def _kl_k3(d: Tensor) -> Tensor:
    d = d.clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(max=10.0)


_KL_ESTIMATORS: dict[KLEstimator, Callable[[Tensor], Tensor]] = {
    KLEstimator.K1: _kl_k1,
    KLEstimator.K2: _kl_k2,
    KLEstimator.K3: _kl_k3,
}


def kl_divergence(logp: Tensor, ref_logp: Tensor, *, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of KL(pi || ref) on tokens sampled from pi.

    Math: with d = ref_logp − logp: k1 = −d; k2 = d²/2; k3 = exp(d) − d − 1
    (Schulman 2020, "Approximating KL Divergence"; k3 is the GRPO penalty,
    DeepSeekMath §4.1 eq. 4, veRL/MindSpeed ``low_var_kl``).

    Conventions: k1 is unbiased but can be negative; k2 and k3 are >= 0. k3 follows
    the veRL/MindSpeed ``low_var_kl`` clamps: d is clamped to [−20, 20] before exp and
    the result to at most 10, so tokens in either clamped region get no gradient.
    k1 and k2 are not clamped.

    Args:
        logp: [B, T] log-probs of the sampled tokens under the current policy.
        ref_logp: [B, T] log-probs of the same tokens under the reference policy.
        estimator: which estimator.

    Returns:
        [B, T] per-token KL estimate (padding not masked).
    """
    return _KL_ESTIMATORS[KLEstimator(estimator)](ref_logp - logp)


# ---------------------------------------------------------------- aggregation


def _at_least_one(x: float | Tensor) -> float | Tensor:
    return x.clamp(min=1) if isinstance(x, Tensor) else max(float(x), 1.0)


def _token_mean(masked: Tensor, mask: Tensor, num_tokens, num_seqs, max_len) -> Tensor:
    return masked.sum() / _at_least_one(mask.sum() if num_tokens is None else num_tokens)


def _seq_mean_token_mean(masked: Tensor, mask: Tensor, num_tokens, num_seqs, max_len) -> Tensor:
    per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
    return per_seq.sum() / _at_least_one(mask.shape[0] if num_seqs is None else num_seqs)


def _seq_mean_token_sum_norm(masked: Tensor, mask: Tensor, num_tokens, num_seqs, max_len) -> Tensor:
    seqs = mask.shape[0] if num_seqs is None else num_seqs
    length = mask.shape[1] if max_len is None else max_len
    return masked.sum() / _at_least_one(seqs * length)


_AGGREGATORS: dict[LossAgg, Callable[..., Tensor]] = {
    LossAgg.TOKEN_MEAN: _token_mean,
    LossAgg.SEQ_MEAN_TOKEN_MEAN: _seq_mean_token_mean,
    LossAgg.SEQ_MEAN_TOKEN_SUM_NORM: _seq_mean_token_sum_norm,
}


def aggregate(
    loss: Tensor,
    mask: Tensor,
    *,
    mode: LossAgg,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
    max_len: float | None = None,
) -> Tensor:
    """Reduces a per-token loss to the scalar that is backpropagated.

    Math: with m = mask and L_i = Σ_t m_it:
    ``token_mean`` = Σ_it loss·m / num_tokens (DAPO, Yu et al. 2025 §3.3; veRL default);
    ``seq_mean_token_mean`` = Σ_i (Σ_t loss·m / max(L_i, 1)) / num_seqs (GRPO,
    DeepSeekMath §4.1 eq. 3); ``seq_mean_token_sum_norm`` = Σ_it loss·m / (num_seqs ·
    max_len) (Dr. GRPO, Liu et al. 2025 §3.1, eq. 3: a constant length, not L_i).

    Conventions: the denominators are global. ``num_tokens`` / ``num_seqs`` are the
    token / sequence counts of the WHOLE optimizer step (all micro-batches, all
    data-parallel ranks), ``max_len`` a run-wide constant (the generation budget); each
    micro-batch then contributes its share and summing the micro-batch gradients gives
    exactly the full-batch gradient, whatever the split. The defaults (``mask.sum()``,
    ``mask.shape[0]``, ``max_len = T``) are local and only correct when this call sees
    the whole step. If a data-parallel backend averages gradients over W ranks (DDP), the
    trainer multiplies by W. Every denominator (including each L_i) is clamped to >= 1,
    so an all-padding batch gives 0, not NaN.

    Args:
        loss: [B, T] per-token loss.
        mask: [B, T] 1 (or True) for tokens to train on, 0 for padding. Padded
            positions must hold finite losses (0·NaN is NaN).
        mode: which reduction.
        num_tokens: ``token_mean`` denominator; default ``mask.sum()``.
        num_seqs: sequence-mode denominator; default B = ``mask.shape[0]``.
        max_len: ``seq_mean_token_sum_norm`` length constant; default T = ``mask.shape[1]``.

    Returns:
        Scalar loss tensor.
    """
    mask = mask.to(loss.dtype)
    return _AGGREGATORS[LossAgg(mode)](loss * mask, mask, num_tokens, num_seqs, max_len)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set, for metrics.

    Math: Σ x·m / max(Σ m, 1) (the local ``token_mean`` of :func:`aggregate`).

    Conventions: the denominator is clamped to >= 1, so an empty mask gives 0.

    Args:
        x: [B, T] (or any shape) values.
        mask: same shape as ``x``, 1 (or True) where counted.

    Returns:
        Scalar tensor.
    """
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)


# ---------------------------------------------------------------- the per-token loss


def token_loss(
    pg_loss: Tensor,
    *,
    tis_weight: Tensor | None = None,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """The per-token loss that is aggregated and backpropagated: the policy-gradient term, weighted,
    plus the KL penalty, minus the entropy bonus.

    Math: ℓ_t = w_t·pg_t + β·KL_t − c_H·H_t, with pg_t from :func:`policy_loss`, w_t from
    :func:`truncated_importance_weights` (Yao et al. 2025 eq. 3), KL_t from :func:`kl_divergence`
    in the loss (GRPO, DeepSeekMath §4.1 eq. 3) and H_t the policy entropy (the entropy bonus of
    PPO, Schulman et al. 2017 eq. 9).

    Conventions: a term whose tensor is None is left out, not added as 0 (0·inf is NaN): no TIS
    weight means w_t = 1, no ``kl`` means the KL sits in the reward or is off, and the caller passes
    ``entropy`` only when ``entropy_coef`` is non-zero. Nothing is masked or reduced here: reduce
    with :func:`aggregate` and the step's global denominators. Gradients flow through every tensor
    given (pass ``tis_weight`` detached, as :func:`truncated_importance_weights` returns it).

    Args:
        pg_loss: [B, T] policy-gradient loss per token (:func:`policy_loss`).
        tis_weight: [B, T] truncated importance weights, or None.
        kl: [B, T] per-token KL to the reference, or None.
        kl_coef: β, the KL coefficient.
        entropy: [B, T] entropy of the policy per token, or None.
        entropy_coef: c_H, the entropy bonus coefficient.

    Returns:
        (loss [B, T], pg [B, T]): the per-token loss, and its policy-gradient part w_t·pg_t (what
        is reported as the policy-gradient loss).
    """
    pg = pg_loss if tis_weight is None else pg_loss * tis_weight
    loss = pg
    if kl is not None:
        loss = loss + kl_coef * kl
    if entropy is not None:
        loss = loss - entropy_coef * entropy
    return loss, pg
