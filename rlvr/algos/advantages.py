"""Outcome advantages for the GRPO family: each reward is compared with a baseline from its group."""

from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.choices import AdvMethod


def _sample_std(x: Tensor, dim: int, n: int) -> Tensor:
    """Bessel-corrected (ddof=1) std of already-centred ``x``; n = 1 gives 0, not NaN."""
    return (x.square().sum(dim=dim, keepdim=True) / max(n - 1, 1)).sqrt()


def _grpo(centered: Tensor, eps: float) -> Tensor:
    return centered / (_sample_std(centered, 1, centered.shape[1]) + eps)


def _dr_grpo(centered: Tensor, eps: float) -> Tensor:
    return centered


def _rloo(centered: Tensor, eps: float) -> Tensor:
    # r_i − mean_{j≠i} r_j = G/(G−1) · (r_i − mean_g r); a group of one has no baseline -> 0
    G = centered.shape[1]
    return centered * (G / (G - 1)) if G > 1 else torch.zeros_like(centered)


def _reinforce_pp(centered: Tensor, eps: float) -> Tensor:
    # every group's centred rewards sum to 0, so the batch mean is already 0: only rescale
    # (re-centring would turn all-equal groups' exact zeros into rounding residue)
    flat = centered.reshape(-1)
    return centered / (_sample_std(flat, 0, flat.numel()) + eps)


_ADVANTAGES: dict[AdvMethod, Callable[[Tensor, float], Tensor]] = {
    AdvMethod.GRPO: _grpo,
    AdvMethod.DR_GRPO: _dr_grpo,
    AdvMethod.RLOO: _rloo,
    AdvMethod.REINFORCE_PP: _reinforce_pp,
}


def group_advantages(
    rewards: Tensor, group_size: int, *, method: AdvMethod = AdvMethod.GRPO, eps: float = 1e-6
) -> Tensor:
    """Advantage of each sequence relative to the other samples of the same prompt.

    Math: with c_i = r_i − mean_g(r) over the G samples of the group,
    ``grpo``: A_i = c_i / (std_g(r) + eps) (DeepSeekMath §4.1.2, Shao et al. 2024);
    ``dr_grpo``: A_i = c_i (Liu et al. 2025, "Understanding R1-Zero-Like Training" §3.1);
    ``rloo``: A_i = r_i − mean_{j≠i} r_j = G/(G−1)·c_i (Ahmadian et al. 2024, "Back to
    Basics", eq. 6; Kool et al. 2019);
    ``reinforce_pp``: A_i = c_i / (std_batch(c) + eps), the group-mean baseline then the
    batch normalisation of REINFORCE++-baseline (Hu 2025, "REINFORCE++" §3; OpenRLHF
    ``reinforce_baseline``).

    Conventions: computed in float64 and returned as float32. Every std is the sample std
    (ddof=1, Bessel-corrected, as veRL, TRL and MindSpeed-RL) with ``eps`` added to the
    denominator, so A is only approximately unit-scaled. ``reinforce_pp`` takes the std over
    all B centred rewards of the call (the whole step: pass the global batch) and does not
    re-centre (its batch mean is 0 by construction). A group whose rewards are all equal
    gives exactly 0 under every method (no NaN), and so does a group of size 1.

    Args:
        rewards: [B] scalar reward per sequence, B = P·G, consecutive runs of
            ``group_size`` rows belonging to one prompt. Any real or bool dtype.
        group_size: G, samples per prompt (>= 1).
        method: which baseline / normalisation.
        eps: added to the std before dividing (``grpo``, ``reinforce_pp``).

    Returns:
        [B] float32 advantages, one per sequence (broadcast over tokens by the loss).

    Raises:
        ValueError: if ``rewards`` is not 1-D, ``group_size`` < 1, or B is not a
            multiple of ``group_size``.
    """
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.shape[0] % group_size != 0:
        raise ValueError(f"B={rewards.shape[0]} is not a multiple of group_size={group_size}")
    r = rewards.to(torch.float64).view(-1, group_size)  # [P, G]
    # Shifting by the group's first reward cancels exactly in r - mean, but makes an
    # all-equal group subtract to exact zeros instead of float rounding residue.
    r = r - r[:, :1]
    centered = r - r.mean(dim=1, keepdim=True)  # [P, G]
    return _ADVANTAGES[AdvMethod(method)](centered, eps).reshape(-1).to(torch.float32)  # [B]


def informative_groups(rewards: Tensor, group_size: int) -> Tensor:
    """Which groups carry a learning signal: their rewards are not all equal.

    Math: keep_p = max_g r_pg > min_g r_pg, i.e. std_g > 0 (DAPO dynamic sampling,
    Yu et al. 2025 §3.2, eq. 11: 0 < |{correct}| < G, generalised to real rewards).

    Conventions: exact comparison, no tolerance: a group kept here has a non-zero
    advantage under every :class:`AdvMethod`, a group dropped here has exactly 0.

    Args:
        rewards: [B] rewards, B = P·G, grouped as in :func:`group_advantages`.
        group_size: G.

    Returns:
        [P] bool, True for groups with non-zero reward variance.
    """
    r = rewards.reshape(-1, group_size)  # [P, G]
    return r.amax(dim=1) > r.amin(dim=1)
