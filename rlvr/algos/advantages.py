"""Group-relative advantages (GRPO): each reward is compared with its own group."""

import torch
from torch import Tensor


def group_advantages(
    rewards: Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Normalizes each reward against the other samples of the same prompt.

    Math: A_i = (r_i − mean_g(r)) / (std_g(r) + eps), or r_i − mean_g(r) when
    ``scale_by_std`` is False (GRPO, DeepSeekMath §4.1.2; Dr. GRPO drops the std,
    Liu et al. 2025 "Understanding R1-Zero-Like Training" §3.1).

    Conventions: computed in float64 and returned as float32. std is the sample
    std (ddof=1, Bessel-corrected) with eps=1e-6 added to the denominator, so
    adv is only approximately unit-scaled. A group of size 1 has std 0 (not NaN)
    and therefore adv 0; a group whose rewards are all equal gives exact zeros.

    Args:
        rewards: [B] scalar reward per sequence, B = P·G, consecutive runs of
            ``group_size`` rows belonging to one prompt. Any real or bool dtype.
        group_size: G, samples per prompt (>= 1).
        scale_by_std: divide by the group std (GRPO) or not (Dr. GRPO).
        eps: added to the std before dividing.

    Returns:
        [B] float32 advantages, one per sequence (broadcast over tokens later).

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
    if scale_by_std:
        # ddof=1; max(G-1, 1) keeps a size-1 group at std 0 instead of 0/0 = NaN.
        var = centered.square().sum(dim=1, keepdim=True) / max(group_size - 1, 1)
        centered = centered / (var.sqrt() + eps)
    return centered.reshape(-1).to(torch.float32)  # [B]
