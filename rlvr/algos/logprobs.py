"""Per-token log-probabilities and entropies from logits, without a second [B, T, V] copy."""

import torch
from torch import Tensor


def token_logprobs(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Log-probability of each given token under softmax(logits / temperature).

    Math: log p(y_t) = z_t[y_t] − logsumexp_v z_t[v] with z = logits / temperature
    (the log-softmax identity; same trick as TRL ``selective_log_softmax``).

    Must equal the naive
    ``torch.log_softmax(logits.float() / temperature, -1).gather(-1, tokens[..., None])[..., 0]``,
    but works one sequence at a time, so only one [T, V] float32 copy is alive
    besides the caller's logits (the naive form materialises [B, T, V] float32
    twice: the upcast and the log_softmax). Temperature must match the one used
    for sampling, or the ratios and KL are computed against the wrong policy.

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
    rows = []
    for row_logits, row_tokens in zip(logits, tokens):
        z = row_logits.float() / temperature  # [T, V]
        picked = z.gather(-1, row_tokens.unsqueeze(-1)).squeeze(-1)  # [T]
        rows.append(picked - torch.logsumexp(z, dim=-1))
    return torch.stack(rows)  # [B, T]


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
