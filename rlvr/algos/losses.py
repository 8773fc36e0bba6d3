"""Per-token policy-gradient and KL terms, and the reduction of [B, T] losses to a scalar."""

from collections.abc import Callable
try:
    from enum import StrEnum
except ImportError:  # Python 3.10
    from enum import Enum

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)


import torch
from torch import Tensor


class KLEstimator(StrEnum):
    """Monte-Carlo estimator of KL(pi || ref) from samples of pi (Schulman, "Approximating KL")."""

    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


class LossAgg(StrEnum):
    """How a [B, T] per-token loss is reduced to the scalar that is backpropagated."""

    TOKEN_MEAN = "token_mean"
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    SEQ_MEAN_TOKEN_SUM = "seq_mean_token_sum"


def clipped_surrogate(
    logp: Tensor, old_logp: Tensor, adv: Tensor, *, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate loss per token, with separate lower and upper clip ranges.

    Math: ratio = exp(logp − old_logp); loss = max(−A·ratio, −A·clip(ratio, 1−ε_low,
    1+ε_high)) (PPO, Schulman et al. 2017 eq. 7, negated for minimisation; asymmetric
    "clip-higher" from DAPO, Yu et al. 2025 §3.1).

    Conventions: no clamp on the log-ratio before exp; the gradient flows only
    through ``logp`` (pass ``old_logp`` and ``adv`` detached). Where both branches
    are equal the loss is the unclipped one and its gradient is the unclipped one.

    Args:
        logp: [B, T] log-probs of the sampled tokens under the current policy.
        old_logp: [B, T] log-probs under the policy that generated the samples.
        adv: [B] or [B, T] advantages; [B] is broadcast over tokens.
        clip_low: ε_low, the ratio is clamped below at 1 − clip_low.
        clip_high: ε_high, the ratio is clamped above at 1 + clip_high.

    Returns:
        (loss_tok, clipped): loss_tok [B, T] unreduced loss (padding not masked);
        clipped [B, T] bool, True where the clamped branch was strictly larger,
        i.e. where the token gets no gradient (for ``train/clip_frac``).
    """
    if adv.ndim == 1:
        adv = adv.unsqueeze(-1)  # [B, 1] to broadcast over T
    ratio = torch.exp(logp - old_logp)  # [B, T]
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = loss_clipped > loss_unclipped
    return torch.where(clipped, loss_clipped, loss_unclipped), clipped


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


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of KL(pi || ref) on tokens sampled from pi.

    Math: with d = ref_logp − logp: k1 = −d; k2 = d²/2; k3 = exp(d) − d − 1
    (Schulman 2020, "Approximating KL Divergence"; k3 is the GRPO penalty,
    DeepSeekMath §4.1 eq. 4).

    Conventions: k1 is unbiased but can be negative; k2 and k3 are >= 0. k3 follows
    the verl/MindSpeed ``low_var_kl`` convention: d is clamped to [−20, 20] before
    exp and the result is clamped to at most 10, so tokens in either clamped
    region contribute no gradient. k1 and k2 are not clamped.

    Args:
        logp: [B, T] log-probs of the sampled tokens under the current policy.
        ref_logp: [B, T] log-probs of the same tokens under the reference policy.
        estimator: which estimator to use.

    Returns:
        [B, T] per-token KL estimate (padding not masked).
    """
    return _KL_ESTIMATORS[estimator](ref_logp - logp)


def _at_least_one(x: float | Tensor) -> float | Tensor:
    return x.clamp(min=1) if isinstance(x, Tensor) else max(float(x), 1.0)


def _token_mean(masked: Tensor, mask: Tensor, num_tokens, num_seqs, max_tokens) -> Tensor:
    return masked.sum() / _at_least_one(mask.sum() if num_tokens is None else num_tokens)


def _seq_mean_token_mean(masked: Tensor, mask: Tensor, num_tokens, num_seqs, max_tokens) -> Tensor:
    per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
    return per_seq.sum() / _at_least_one(mask.shape[0] if num_seqs is None else num_seqs)


def _seq_mean_token_sum(masked: Tensor, mask: Tensor, num_tokens, num_seqs, max_tokens) -> Tensor:
    seqs = mask.shape[0] if num_seqs is None else num_seqs
    tokens = mask.shape[1] if max_tokens is None else max_tokens
    return masked.sum() / _at_least_one(seqs * tokens)


_AGGREGATORS: dict[LossAgg, Callable[..., Tensor]] = {
    LossAgg.TOKEN_MEAN: _token_mean,
    LossAgg.SEQ_MEAN_TOKEN_MEAN: _seq_mean_token_mean,
    LossAgg.SEQ_MEAN_TOKEN_SUM: _seq_mean_token_sum,
}


def aggregate(
    loss_tok: Tensor,
    mask: Tensor,
    mode: LossAgg,
    *,
    num_tokens: float | Tensor | None = None,
    num_seqs: float | Tensor | None = None,
    max_tokens: int | None = None,
) -> Tensor:
    """Reduces a per-token loss to the scalar that is backpropagated.

    Math: with m = mask and L_i = Σ_t m_it:
    TOKEN_MEAN = Σ_it loss·m / num_tokens (DAPO, Yu et al. 2025 §3.3);
    SEQ_MEAN_TOKEN_MEAN = Σ_i (Σ_t loss·m / max(L_i, 1)) / num_seqs (GRPO,
    DeepSeekMath §4.1 eq. 3); SEQ_MEAN_TOKEN_SUM = Σ_it loss·m / (num_seqs ·
    max_tokens) (Dr. GRPO, Liu et al. 2025 §3.1).

    Conventions: the denominators are global. ``num_tokens`` / ``num_seqs`` are the
    token / sequence counts of the WHOLE optimizer step (all micro-batches, all
    data-parallel ranks); each micro-batch then contributes its share and summing
    the micro-batch gradients gives exactly the full-batch gradient, whatever the
    split. The defaults (``mask.sum()``, ``mask.shape[0]``, ``max_tokens = T``) are
    local and only correct when this call sees the whole step. If a data-parallel
    backend averages gradients over W ranks (DDP), the trainer multiplies by W.
    Every denominator (including each L_i) is clamped to >= 1 so an all-padding
    batch gives 0, not NaN.

    Args:
        loss_tok: [B, T] per-token loss.
        mask: [B, T] 1 (or True) for tokens to train on, 0 for padding. Padded
            positions must hold finite losses (0·NaN is NaN).
        mode: which reduction.
        num_tokens: TOKEN_MEAN denominator; default ``mask.sum()``.
        num_seqs: sequence-mode denominator; default B = ``mask.shape[0]``.
        max_tokens: SEQ_MEAN_TOKEN_SUM length constant; default T = ``mask.shape[1]``.

    Returns:
        Scalar loss tensor.
    """
    mask = mask.to(loss_tok.dtype)
    return _AGGREGATORS[mode](loss_tok * mask, mask, num_tokens, num_seqs, max_tokens)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set, for metrics.

    Math: Σ x·m / max(Σ m, 1) (the local TOKEN_MEAN of ``aggregate``).

    Conventions: the denominator is clamped to >= 1, so an empty mask gives 0.

    Args:
        x: [B, T] (or any shape) values.
        mask: same shape as ``x``, 1 (or True) where counted.

    Returns:
        Scalar tensor.
    """
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)
