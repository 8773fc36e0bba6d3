"""The data a rollout engine hands to the trainer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class RolloutBatch:
    """B = P * G sampled sequences; row ``i`` belongs to prompt ``i // group_size``.

    Layout of each row: the prompt, left-padded to ``prompt_len``, then the response,
    right-padded to T tokens.
    """

    input_ids: Tensor
    """[B, prompt_len + T] prompt and response token ids."""
    attention_mask: Tensor
    """[B, prompt_len + T] 1 on real prompt tokens and on response tokens up to and including EOS."""
    response_mask: Tensor
    """[B, T] 1 on the generated tokens we train on (up to and including the first EOS)."""
    prompt_len: int
    """Number of (left-padded) prompt positions."""
    texts: list[str]
    """Decoded responses, special tokens skipped."""
    truncated: Tensor
    """[B] bool: the response hit max_new_tokens without an EOS."""
    group_size: int
    """G, completions per prompt."""

    @property
    def response_ids(self) -> Tensor:
        """[B, T] the generated tokens."""
        return self.input_ids[:, self.prompt_len :]

    @property
    def response_lengths(self) -> Tensor:
        """[B] number of trained tokens per response."""
        return self.response_mask.sum(-1)

    def select(self, rows: slice) -> dict[str, Tensor]:
        """Tensors of a contiguous row range (a micro-batch)."""
        return {"input_ids": self.input_ids[rows], "attention_mask": self.attention_mask[rows]}


def response_mask_from_eos(response_ids: Tensor, eos_ids: list[int]) -> tuple[Tensor, Tensor]:
    """Mask of tokens up to and including the first EOS; rows with no EOS are all ones (truncated).

    Args:
        response_ids: [B, T] generated tokens (rows padded after their EOS).
        eos_ids: token ids that end a response.

    Returns:
        (mask [B, T] long, truncated [B] bool)
    """
    is_eos = torch.isin(response_ids, torch.tensor(eos_ids, device=response_ids.device))
    has_eos = is_eos.any(-1)
    T = response_ids.shape[1]
    first = torch.where(has_eos, is_eos.long().argmax(-1), torch.full_like(has_eos, T - 1, dtype=torch.long))
    mask = (torch.arange(T, device=response_ids.device)[None, :] <= first[:, None]).long()
    return mask, ~has_eos
