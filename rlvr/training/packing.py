"""Rows packed end to end into one sequence per forward pass (``train.micro_batch_tokens``).

A packed pass holds each row's real prompt tokens and its response, without padding, one row
after the other in a [1, N] sequence; the position ids restart at 0 with every row, as
``generate`` numbered them with left padding, and each row attends only to itself, causally. So
each row's logits are those of the row on its own (float rounding aside;
``tests/training/test_packing.py``).

How a row is kept to itself depends on the model's attention:

- **sdpa** (transformers' default): attention runs row by row, each row's queries against its own
  keys and values through transformers' own ``sdpa_attention_forward`` with ``is_causal`` (a
  variable-length attention by hand: the rows' lengths are host integers from the planning). The
  attention then costs Σ Lᵢ², as the rows would alone, with no mask, where one causal pass under a
  block mask computes and discards N² scores. The other layers run once over all N tokens.
- **eager**: the block-diagonal causal mask that transformers builds when it detects packed
  sequences from the position ids with ``attention_mask=None``
  (``masking_utils.find_packed_sequence_indices``), built by rlvr from the row boundaries it knows,
  through the same ``masking_utils`` functions: the detection reads the position ids on the host, a
  blocking sync in every forward pass.

Other attention implementations (flash, flex) and sliding-window layers are a one-line error:
flash attention would take packing natively, from the position ids, but no GPU has run it here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor

from rlvr.errors import UserError

PACKED_ATTENTION = ("sdpa", "eager")
"""The attention implementations packing is built for (see the module docstring)."""


@dataclass(frozen=True)
class Layout:
    """Where one packed pass's tokens come from and where its log-probs go (host tensors).

    N: tokens in the pass; n: response tokens (the positions the LM head runs on); b: rows;
    Tm: the longest response among them."""

    src: Tensor
    """[N] index of each packed token in the batch's flattened [B * L] input ids."""
    position_ids: Tensor
    """[N] position of each token inside its own row (0 at the row's first prompt token)."""
    seq_ids: Tensor
    """[N] which of the pass's rows each token belongs to (0 .. b-1)."""
    keep: Tensor
    """[n] the packed positions whose logits predict a response token, row by row."""
    unpad: Tensor
    """[b, Tm] index into the [n] response positions of row j's response token t (0 past the row's
    end, where the response mask is 0)."""
    lengths: tuple[int, ...]
    """Tokens of each row, in order (they sum to N)."""

    TENSORS = ("src", "position_ids", "seq_ids", "keep", "unpad")
    """The fields that go to the device."""


def layout(
    rows: tuple[int, ...], prompt_lengths: list[int], response_lengths: list[int], *, prompt_len: int, width: int
) -> Layout:
    """The packed layout of ``rows`` of a batch whose rows are ``width`` = prompt_len + T positions,
    left-padded prompts in the first ``prompt_len``.

    A row with an empty prompt or response still packs one token of each (the padding token next
    to it), as a row micro-batch would run it: its log-probs are masked out.

    Args:
        rows: the pass's rows of the batch.
        prompt_lengths: real (unpadded) prompt tokens of every row of the batch.
        response_lengths: trained response tokens of every row of the batch.
        prompt_len: the batch's prompt positions (left padding included).
        width: positions per batch row.
    """
    src, pos, seq, keep, unpad, lengths = [], [], [], [], [], []
    Tm = max(max(1, response_lengths[r]) for r in rows)
    offset = n = 0
    for j, r in enumerate(rows):
        p, q = max(1, prompt_lengths[r]), max(1, response_lengths[r])
        start = r * width + prompt_len - p
        src += range(start, start + p + q)
        pos += range(p + q)
        seq += [j] * (p + q)
        keep += range(offset + p - 1, offset + p - 1 + q)  # the position before each response token predicts it
        unpad.append([*range(n, n + q), *[0] * (Tm - q)])
        lengths.append(p + q)
        offset, n = offset + p + q, n + q
    # cpu: host indices; training.loop.forward_passes copies every pass's to the device at once
    return Layout(*(torch.tensor(x) for x in (src, pos, seq, keep, unpad)), tuple(lengths))


ROWS_ATTENTION = "rlvr_packed_rows"
"""The attention implementation a packed pass of an sdpa model runs under (:func:`_rows_attention`)."""


def packed_logits(
    model,
    input_ids: Tensor,
    position_ids: Tensor,
    seq_ids: Tensor,
    keep: Tensor,
    lengths: tuple[int, ...],
    *,
    head=contextlib.nullcontext,
) -> Tensor:
    """Logits at the ``keep`` positions of a packed sequence, each row attending only to itself.

    Args:
        input_ids: [1, N] the rows' tokens end to end.
        position_ids: [1, N] positions restarting at 0 with every row.
        seq_ids: [1, N] row of each token (equal ids = one row).
        keep: [n] positions to run the LM head on.
        lengths: tokens of each row, in order (host integers; they sum to N).
        head: a context manager around the model call (one that swaps the LM head's forward, say, as
            :mod:`rlvr.models.forward` does for its fused log-probs; the head then sees [1, n, H]).

    Returns:
        [1, n, V] logits (or what a swapped head returns); ``[:, i]`` predicts ``input_ids[:, keep[i] + 1]``.
    """
    common = dict(input_ids=input_ids, position_ids=position_ids, logits_to_keep=keep, use_cache=False)
    with row_attention(model) as by_rows, head():
        if by_rows:  # no mask: transformers builds none for this implementation
            return model(**common, attention_mask=None, packed_lengths=tuple(lengths)).logits
        return model(**common, attention_mask=block_causal_mask(model, seq_ids)).logits


def attention(model) -> str:
    """The model's attention implementation, where packing is built for it (sdpa or eager).

    Raises:
        UserError: another implementation (flash, flex), or sliding-window layers (their window would
            be dropped).
    """
    config = model.config
    impl = getattr(config, "_attn_implementation", None) or "eager"
    sliding = "sliding_attention" in (getattr(config, "layer_types", None) or [])
    if impl not in PACKED_ATTENTION or sliding:
        what = "sliding-window layers" if sliding else f"{impl} attention"
        raise UserError(
            f"train.micro_batch_tokens packs rows for sdpa or eager attention, but this model has {what}; "
            "set train.micro_batch_tokens=0 (row micro-batches)"
        )
    return impl


@contextlib.contextmanager
def row_attention(model):
    """Yields whether ``model``'s packed passes attend row by row (sdpa) and, if so, runs its attention
    layers under :data:`ROWS_ATTENTION` for the block (they read the implementation off the one config
    object at each call). The block must hold a packed pass's backward too: gradient checkpointing runs
    the layers again there, and they must attend as in the forward. Re-entrant; eager models (a block
    mask) are left as they are."""
    config = model.config
    if config._attn_implementation == ROWS_ATTENTION:
        yield True
        return
    if attention(model) != "sdpa":
        yield False
        return
    config._attn_implementation = ROWS_ATTENTION
    try:
        yield True
    finally:
        config._attn_implementation = "sdpa"


def _rows_attention(module, query, key, value, attention_mask, *, packed_lengths: tuple[int, ...], **kwargs):
    """Attention of a packed sequence row by row: transformers' sdpa attention, causal, on each row's
    queries, keys and values ([1, heads, Lᵢ, d] slices of the packed [1, heads, N, d]); the outputs
    joined back to [1, N, heads, d], as ``sdpa_attention_forward`` returns them."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    parts = zip(query.split(packed_lengths, 2), key.split(packed_lengths, 2), value.split(packed_lengths, 2))
    out = [sdpa_attention_forward(module, q, k, v, None, is_causal=True, **kwargs)[0] for q, k, v in parts]
    return torch.cat(out, 1), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ROWS_ATTENTION, _rows_attention)


_register()


def block_causal_mask(model, seq_ids: Tensor) -> Tensor:
    """[1, 1, N, N] attention mask of a packed sequence for eager attention (additive float; bool for
    sdpa), built by transformers' own mask functions; no host sync."""
    from transformers.masking_utils import (
        ALL_MASK_ATTENTION_FUNCTIONS,
        and_masks,
        causal_mask_function,
        packed_sequence_mask_function,
    )

    N = seq_ids.shape[-1]
    return ALL_MASK_ATTENTION_FUNCTIONS[attention(model)](
        batch_size=1,
        q_length=N,
        kv_length=N,
        mask_function=and_masks(causal_mask_function, packed_sequence_mask_function(seq_ids)),
        allow_is_causal_skip=False,
        dtype=model.dtype,
        device=seq_ids.device,
    )
