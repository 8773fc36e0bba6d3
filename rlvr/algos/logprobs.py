"""Per-token log-probabilities and entropies from logits, without a second [B, T, V] copy."""

import torch
from torch import Tensor


def token_logprobs(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Log-probability of each given token under softmax(logits / temperature).

    Math: log p(y_t) = z_t[y_t] − logsumexp_v z_t[v] with z = logits / temperature
    (the log-softmax identity; same trick as TRL ``selective_log_softmax``).

    Must equal the naive
    ``torch.log_softmax(logits.float() / temperature, -1).gather(-1, tokens[..., None])[..., 0]``
    (tests check values and gradients against it). Computed by :func:`token_logprobs_entropy`,
    one sequence at a time in float32, with a hand-written backward: only the logits and a [B, T]
    logsumexp are kept for backward, and the gradient (onehot(y) − softmax(z)) / temperature is
    written straight into the logits' gradient, where autograd over the naive form keeps a scaled
    float32 copy of the logits and runs six passes over [T, V] per row (the vocabulary passes were
    a third of an update on the 49k-vocabulary built-in model). Temperature must match the one
    used for sampling, or the ratios and KL are computed against the wrong policy.

    Conventions: computed and returned in float32 whatever the logits dtype;
    temperature must be > 0 (no clamp).

    Args:
        logits: [B, T, V] already aligned so that ``logits[:, t]`` predicts
            ``tokens[:, t]`` (the caller does the causal shift).
        tokens: [B, T] int64 token ids.
        temperature: sampling temperature the logits are divided by.

    Returns:
        [B, T] float32 log p(token); differentiable w.r.t. ``logits``.
    """
    return token_logprobs_entropy(logits, tokens, temperature=temperature, entropy=False)[0]


def token_logprobs_entropy(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0, entropy: bool = True):
    """(log p(token) [B, T], entropy [B, T] or None) from one pass over the logits.

    The log-probs are :func:`token_logprobs`'s (differentiable w.r.t. ``logits``); the entropy,
    H_t = logsumexp(z_t) − Σ_v p_v z_t[v], reuses the pass's exp(z − max) and is returned
    detached: a metric. For an entropy bonus in the loss use :func:`entropy_from_logits`.
    """
    return _SampledLogProbs.apply(logits, tokens, float(temperature), bool(entropy))


class _SampledLogProbs(torch.autograd.Function):
    """Forward: per row, w = exp(z − max), lse = max + log Σw, logp = z[y] − lse, H = lse − Σ w·z / Σw.
    Backward: d logp_t / d logits_t = (onehot(y_t) − exp(z_t − lse_t)) / temperature."""

    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, temperature: float, entropy: bool):
        B, T, _ = logits.shape
        logp = logits.new_empty(B, T, dtype=torch.float32)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if entropy else None
        for b in range(B):
            z = _scaled(logits[b], temperature)  # [T, V] float32
            top = z.amax(-1, keepdim=True)
            w = torch.exp(z - top)  # [T, V]
            total = w.sum(-1)
            lse[b] = top[:, 0] + total.log()
            logp[b] = z.gather(-1, tokens[b, :, None])[:, 0] - lse[b]
            if entropy:
                ent[b] = lse[b] - w.mul_(z).sum(-1) / total
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(*(() if ent is None else (ent,)))
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_ent):
        logits, tokens, lse = ctx.saved_tensors
        tau = ctx.temperature
        grad = torch.empty_like(logits)
        in_place = logits.dtype == torch.float32
        for b in range(logits.shape[0]):
            g = grad_logp[b, :, None] / tau  # [T, 1]
            p = grad[b] if in_place else None
            p = torch.sub(_scaled(logits[b], tau), lse[b, :, None], out=p)
            p.exp_().mul_(-g).scatter_add_(-1, tokens[b, :, None], g)  # g·(onehot − softmax)
            if not in_place:
                grad[b] = p
        return grad, None, None, None


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature in float32 (no copy for float32 logits at temperature 1)."""
    z = logits.float()
    return z if temperature == 1.0 else z / temperature


def entropy_from_logits(logits: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Entropy of the next-token distribution softmax(logits / temperature).

    Math: H_t = −Σ_v p_v log p_v with log p = log_softmax(z), z = logits / temperature
    (Shannon entropy; logged as ``train/entropy``, e.g. DAPO §3.1).

    Must equal the naive ``-(p * logp).sum(-1)`` on the full [B, T, V] tensor;
    computed one sequence at a time in float32 like ``token_logprobs`` (only one [T, V]
    float32 copy alive besides the caller's logits). Logits
    must be finite (a −inf logit gives 0·−inf = NaN).

    Args:
        logits: [B, T, V] logits.
        temperature: sampling temperature the logits are divided by (> 0).

    Returns:
        [B, T] float32 entropy in nats.
    """
    rows = []
    for row_logits in logits:
        logp = torch.log_softmax(row_logits.float() / temperature, dim=-1)  # [T, V]
        rows.append(-(logp.exp() * logp).sum(-1))
    return torch.stack(rows)  # [B, T]
