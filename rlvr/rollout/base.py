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
    logprobs: Tensor | None = None
    """[B, T] float32 log-probs of the sampled tokens under the engine's own sampling model, at the
    sampling temperature (0 on padding and on tool results); None unless the engine was asked for them (TIS)."""
    entropy: Tensor | None = None
    """[B, T] float32 entropy of the engine's sampling distribution (full softmax at the sampling
    temperature) at each response position (0 on padding); None unless the engine was asked for it
    (``train.rollout_entropy``) and single-turn."""
    tool_calls: list[int] | None = None
    """[B] tool calls run in each response (errors included); None for single-turn rollouts. With tools,
    the response interleaves the model's tokens and the results' (``response_mask`` 0 and
    ``attention_mask`` 1 on a result's tokens): see :mod:`rlvr.rollout.episodes`."""
    tool_errors: list[int] | None = None
    """[B] of those calls, how many answered an error; None for single-turn rollouts."""
    turns: list[int] | None = None
    """[B] model turns of each episode (an environment's rollouts); None for single-turn rollouts."""
    env_rewards: list[float | None] | None = None
    """[B] each episode's last reward from its environment (None where it gave none); None when no
    environment gave one."""

    @property
    def response_ids(self) -> Tensor:
        """[B, T] the generated tokens."""
        return self.input_ids[:, self.prompt_len :]

    @property
    def response_lengths(self) -> Tensor:
        """[B] number of trained tokens per response."""
        return self.response_mask.sum(-1)

    @property
    def response_extent(self) -> Tensor:
        """[B] response positions up to each row's end: the trained tokens plus any tool results among
        them (equal to :attr:`response_lengths` without tools). A forward pass over a row's response
        must run this far."""
        return self.attention_mask[:, self.prompt_len :].sum(-1)

    def select(self, rows: slice | Tensor, num_response_tokens: int | None = None) -> dict[str, Tensor]:
        """Tensors of some rows (a forward pass: a slice or an index tensor), cut after
        ``num_response_tokens`` response positions (all T by default). Cutting at the rows' longest
        response drops only padding."""
        end = None if num_response_tokens is None else self.prompt_len + num_response_tokens
        return {"input_ids": self.input_ids[rows, :end], "attention_mask": self.attention_mask[rows, :end]}


def response_mask_from_eos(
    response_ids: Tensor, eos_ids: list[int], *, stop_at: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Mask of tokens up to and including the first EOS (or stop-string end); rows with neither
    are all ones (truncated).

    Args:
        response_ids: [B, T] generated tokens (rows padded after their end).
        eos_ids: token ids that end a response.
        stop_at: [B] response index of the token that completed a stop string, -1 for none.

    Returns:
        (mask [B, T] long, truncated [B] bool)
    """
    is_eos = torch.isin(response_ids, torch.tensor(eos_ids, device=response_ids.device))
    B, T = response_ids.shape
    no_end = torch.full((B,), T, dtype=torch.long, device=response_ids.device)
    end = torch.where(is_eos.any(-1), is_eos.long().argmax(-1), no_end)
    if stop_at is not None:
        end = torch.minimum(end, torch.where(stop_at >= 0, stop_at.to(end.device), no_end))
    ended = end < T
    last = torch.where(ended, end, no_end - 1)
    mask = (torch.arange(T, device=response_ids.device)[None, :] <= last[:, None]).long()
    return mask, ~ended


def cut_at_stop(text: str, stop: list[str]) -> str:
    """``text`` up to and including the first stop string it contains (unchanged if none).

    The token that completes a stop string may carry more text after it (BPE merges ``></`` after
    ``</answer``); vLLM cuts the output there, and so does rlvr."""
    ends = [text.find(s) + len(s) for s in stop if s in text]
    return text[: min(ends)] if ends else text


def group_rows(groups: list[int], group_size: int) -> Tensor:
    """[len(groups) * G] int64 row indices (on the CPU) of the given groups' rows, in the given order."""
    rows = [g * group_size + j for g in groups for j in range(group_size)]
    return torch.tensor(rows, dtype=torch.long)  # cpu: host indices, each caller moves them where it needs them


def select_groups(batch: RolloutBatch, groups: list[int]) -> RolloutBatch:
    """The rows of the given groups (prompt indices), in the given order."""
    G = batch.group_size
    rows = group_rows(groups, G)  # cpu: row indices
    pick = lambda t: None if t is None else t[rows.to(t.device)]  # noqa: E731
    return RolloutBatch(
        input_ids=pick(batch.input_ids),
        attention_mask=pick(batch.attention_mask),
        response_mask=pick(batch.response_mask),
        prompt_len=batch.prompt_len,
        texts=[batch.texts[i] for i in rows.tolist()],
        truncated=pick(batch.truncated),
        group_size=G,
        logprobs=pick(batch.logprobs),
        entropy=pick(batch.entropy),
        tool_calls=None if batch.tool_calls is None else [batch.tool_calls[i] for i in rows.tolist()],
        tool_errors=None if batch.tool_errors is None else [batch.tool_errors[i] for i in rows.tolist()],
        turns=None if batch.turns is None else [batch.turns[i] for i in rows.tolist()],
        env_rewards=None if batch.env_rewards is None else [batch.env_rewards[i] for i in rows.tolist()],
    )


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One batch from several (same G): prompts re-left-padded, responses re-right-padded."""
    if len(batches) == 1:
        return batches[0]
    Lp = max(b.prompt_len for b in batches)
    T = max(b.response_mask.shape[1] for b in batches)
    F = torch.nn.functional

    def pad(b: RolloutBatch, t: Tensor, value, *, prompt: bool) -> Tensor:
        if prompt:  # [B, prompt_len + T_b] -> [B, Lp + T]
            p, r = t[:, : b.prompt_len], t[:, b.prompt_len :]
            return torch.cat(
                [F.pad(p, (Lp - b.prompt_len, 0), value=value), F.pad(r, (0, T - r.shape[1]), value=value)], 1
            )
        return F.pad(t, (0, T - t.shape[1]), value=value)  # [B, T_b] -> [B, T]

    def responses(name: str) -> Tensor | None:  # a [B, T] record of every batch, or None
        if any(getattr(b, name) is None for b in batches):
            return None
        return torch.cat([pad(b, getattr(b, name), 0.0, prompt=False) for b in batches])

    return RolloutBatch(
        input_ids=torch.cat([pad(b, b.input_ids, pad_id, prompt=True) for b in batches]),
        attention_mask=torch.cat([pad(b, b.attention_mask, 0, prompt=True) for b in batches]),
        response_mask=torch.cat([pad(b, b.response_mask, 0, prompt=False) for b in batches]),
        prompt_len=Lp,
        texts=[t for b in batches for t in b.texts],
        truncated=torch.cat([b.truncated for b in batches]),
        group_size=batches[0].group_size,
        logprobs=responses("logprobs"),
        entropy=responses("entropy"),
        tool_calls=_cat_lists([b.tool_calls for b in batches]),
        tool_errors=_cat_lists([b.tool_errors for b in batches]),
        turns=_cat_lists([b.turns for b in batches]),
        env_rewards=_cat_lists([b.env_rewards for b in batches]),
    )


def _cat_lists(parts: list[list[int] | None]) -> list[int] | None:
    return None if any(p is None for p in parts) else [x for p in parts for x in p]
