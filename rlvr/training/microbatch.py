"""Which rows each forward pass of an update takes: ``train.micro_batch_seqs`` rows split by length, or
rows packed into ``train.micro_batch_tokens``.

A micro-batch runs up to its longest response, so its shorter responses cost padding: with the
quickstart's 8-sample groups, responses of 30 to 128 tokens and one forward pass per group, a
third of the update's token positions were padding. :func:`plan` sorts each prompt's rows in a
micro-batch by length and cuts the sorted positions where that saves work, so the short ones run
in a pass of their own, cut at their own longest. The rows of a pass keep sharing their prompt
(the same number of rows per prompt: the k shortest of every prompt).

:func:`pack` plans token-budget passes instead: each row's prompt and response tokens, without
padding, laid end to end in one sequence of at most the budget (:mod:`rlvr.training.packing`), the
rows spread over the fewest passes that fit, balanced by tokens.

Which rows run together changes nothing but float rounding: each row's logits depend on its own
tokens only, and every pass's loss divides by the step's global counts
(``tests/training/test_microbatch.py`` checks the gradient against one pass over the whole batch).
Planning reads the rows' lengths on the host: the one host sync of a planned update. :func:`slices`
then cuts every pass's tensors at once, its row indices on the batch's device, so that the loop
over passes (:mod:`rlvr.training.loop`) never makes the host wait for the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rlvr.training import packing

if TYPE_CHECKING:
    from rlvr.rollout import RolloutBatch

PASS_COST_TOKENS = 48
"""The fixed cost of one more forward + backward pass, in token-rows of compute (Python and
kernel launch overhead, smaller matrices): a cut must save more than this."""


@dataclass(frozen=True)
class Pass:
    """One forward pass of an update: ``rows`` of the batch (host indices), cut after ``longest``
    response tokens, ``group_size`` consecutive rows sharing a prompt (1: no sharing); ``packed``:
    the rows run end to end in one sequence, without padding."""

    rows: tuple[int, ...]
    longest: int
    group_size: int
    packed: bool = False
    unpadded: bool = False
    """A shared-prompt pass whose responses run end to end without their padding (one pass per
    micro-batch: :func:`rlvr.models.forward.pass_logprobs`'s ``unpadded``)."""


def plan(
    lengths: list[int],
    *,
    micro_batch_seqs: int,
    group_size: int,
    prompt_len: int,
    bucket: bool = True,
    unpadded: bool = False,
) -> list[Pass]:
    """The forward passes over a batch whose row ``i`` has a response of ``lengths[i]`` tokens.

    Args:
        lengths: response length of every row (rows grouped by prompt, ``group_size`` consecutive
            rows per prompt when ``group_size > 1``).
        micro_batch_seqs: rows per micro-batch (a micro-batch starts at a multiple of it).
        group_size: rows per shared prompt inside a micro-batch (1 = each row runs its own prompt).
        prompt_len: prompt positions per row, what a shared prompt costs per pass.
        bucket: split micro-batches by length; False gives one pass per micro-batch, in row order.
        unpadded: a micro-batch that shares prompts runs as one pass without padding (nothing for
            buckets to save), in row order.

    Returns:
        Passes that cover every row once, micro-batch by micro-batch.
    """
    passes = []
    B = len(lengths)
    for start in range(0, B, micro_batch_seqs):
        rows = list(range(start, min(start + micro_batch_seqs, B)))
        g = group_size if group_size > 1 and len(rows) % group_size == 0 else 1
        if not bucket or (unpadded and g > 1):
            passes.append(Pass(tuple(rows), max(1, max(lengths[r] for r in rows)), g, unpadded=unpadded and g > 1))
            continue
        # columns of positions: prompt p's rows sorted by length; with no sharing, one "prompt" of every row
        width = g if g > 1 else len(rows)
        prompts = [sorted(rows[i : i + width], key=lambda r: lengths[r]) for i in range(0, len(rows), width)]
        for a, b in _cuts([max(lengths[p[j]] for p in prompts) for j in range(width)], len(prompts), prompt_len, g > 1):
            chosen = [r for p in prompts for r in p[a:b]]
            longest = max(1, max(lengths[r] for r in chosen))
            passes.append(Pass(tuple(chosen), longest, (b - a) if g > 1 else 1))
    return passes


def _cuts(longest_at: list[int], num_prompts: int, prompt_len: int, shared: bool) -> list[tuple[int, int]]:
    """Position ranges [a, b) that minimise the passes' cost, by dynamic programming over the cut
    points (positions sorted by length, so a range's longest is ``longest_at[b - 1]``)."""

    def cost(a: int, b: int) -> float:
        rows = num_prompts * (b - a)
        prompt = num_prompts * prompt_len if shared else rows * prompt_len
        return prompt + rows * longest_at[b - 1] + PASS_COST_TOKENS

    n = len(longest_at)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for b in range(1, n + 1):
        for a in range(b):
            c = best[a] + cost(a, b)
            if c < best[b]:
                best[b], cut[b] = c, a
    ranges, b = [], n
    while b > 0:
        ranges.append((cut[b], b))
        b = cut[b]
    return ranges[::-1]


def pack(tokens: list[int], response_lengths: list[int], *, micro_batch_tokens: int) -> list[Pass]:
    """Token-budget passes: rows laid end to end, at most ``micro_batch_tokens`` tokens per pass.

    The fewest passes k whose bins fit every row, found by trying k = ⌈total / budget⌉, k + 1, ...
    with longest-first assignment to the pass holding the fewest tokens (LPT), which also balances
    the passes by tokens. A row longer than the budget runs in a pass of its own. Deterministic:
    ties go to the lower pass, and each pass lists its rows in batch order.

    Args:
        tokens: tokens each row puts into a pass (its prompt without padding + its response).
        response_lengths: response tokens of each row (a pass's ``longest`` is their max, at least 1).
        micro_batch_tokens: the budget per pass.

    Returns:
        Packed passes covering every row once, the passes in order of their first row.
    """
    alone = [r for r, n in enumerate(tokens) if n > micro_batch_tokens]
    rest = sorted((r for r, n in enumerate(tokens) if n <= micro_batch_tokens), key=lambda r: (-tokens[r], r))
    bins: list[list[int]] = []
    if rest:
        k = max(1, -(-sum(tokens[r] for r in rest) // micro_batch_tokens))
        while (bins := _lpt(rest, tokens, k, micro_batch_tokens)) is None:
            k += 1
    groups = sorted([sorted(b) for b in bins if b] + [[r] for r in alone])
    return [Pass(tuple(g), max(1, max(response_lengths[r] for r in g)), 1, packed=True) for g in groups]


def _lpt(rows: list[int], tokens: list[int], k: int, budget: int) -> list[list[int]] | None:
    """``rows`` (longest first) into k bins, each row to the bin with the fewest tokens; None when one
    does not fit (then it fits in no bin)."""
    bins: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for r in rows:
        i = min(range(k), key=lambda j: (load[j], j))
        if load[i] + tokens[r] > budget:
            return None
        bins[i].append(r)
        load[i] += tokens[r]
    return bins


@dataclass(frozen=True)
class Slice:
    """One forward pass's tensors, cut from the batch before the loop over passes. Its row indices
    live on the batch's device, so nothing in the loop makes the host wait for the device."""

    rows: Tensor
    """[b] rows of the batch."""
    cols: int
    """Tm: response columns kept (those after the longest response are padding in every row)."""
    inputs: dict[str, Tensor]
    """The forward's inputs: input_ids + attention_mask [b, prompt_len + Tm] for rows; for packed
    rows those of :func:`rlvr.training.packing.packed_logits`."""
    tokens: Tensor
    """The response tokens the logits predict: [b, Tm], packed [1, n]."""
    mask: Tensor
    """[b, Tm] response mask."""
    group_size: int = 1
    """Rows per shared prompt (row passes)."""
    unpad: Tensor | None = None
    """Packed: [b, Tm] index of each row's response token in the pass's [n] log-probs."""
    unpadded: tuple[Tensor, tuple[int, ...]] | None = None
    """Shared prompt without segment padding: the rows' response lengths, [b] on the device and on the
    host (:func:`rlvr.models.forward.pass_logprobs`)."""


def slices(
    batch: RolloutBatch,
    *,
    micro_batch_seqs: int,
    group_size: int,
    bucket: bool,
    micro_batch_tokens: int = 0,
    unpadded: bool = False,
) -> list[Slice]:
    """The passes of an update or a log-prob computation, with their tensors already sliced.

    Rows as :func:`plan` splits them, or packed by :func:`pack` into ``micro_batch_tokens`` per pass
    (0: rows; :mod:`rlvr.training.packing` lays them out). ``unpadded``: shared-prompt micro-batches
    run as one pass each whose responses drop their padding (:func:`plan`). Planning reads the rows' lengths on the
    host: one blocking read per call (so one per update, whatever its micro-batches and iterations,
    and one per log-prob pass). All row indices then travel to the device in one copy, and every
    pass's tensors are cut before the first forward, so the loop over passes never waits."""
    prompt_lengths = batch.attention_mask[:, : batch.prompt_len].sum(-1)
    # a row runs to its response's end: its trained tokens and any tool results among them (masked out)
    response_lengths, prompt_lengths = torch.stack([batch.response_extent, prompt_lengths]).tolist()  # host sync
    if micro_batch_tokens:
        tokens = [max(1, p) + max(1, r) for p, r in zip(prompt_lengths, response_lengths)]  # as packing.layout packs
        passes = pack(tokens, response_lengths, micro_batch_tokens=micro_batch_tokens)
    else:
        rows = dict(micro_batch_seqs=micro_batch_seqs, group_size=group_size, bucket=bucket, unpadded=unpadded)
        passes = plan(response_lengths, prompt_len=batch.prompt_len, **rows)
    width = batch.input_ids.shape[1]
    layouts = [
        packing.layout(p.rows, prompt_lengths, response_lengths, prompt_len=batch.prompt_len, width=width)
        if p.packed
        else None
        for p in passes
    ]
    host = [torch.tensor(p.rows) for p in passes] + [  # cpu: the plan's indices, sent to the device in one copy
        getattr(lay, name).flatten() for lay in layouts if lay is not None for name in packing.Layout.TENSORS
    ]
    on_device = _to_device(torch.cat(host), batch.input_ids.device).split([len(t) for t in host])
    rows, packed = on_device[: len(passes)], iter(on_device[len(passes) :])
    flat_ids = batch.input_ids.reshape(-1)
    out = []
    for p, r, lay in zip(passes, rows, layouts):
        Tm = p.longest
        mask = batch.response_mask[r, :Tm]
        if lay is None:
            segments = (batch.response_extent[r], tuple(response_lengths[i] for i in p.rows)) if p.unpadded else None
            tokens = batch.response_ids[r, :Tm]
            out.append(Slice(r, Tm, batch.select(r, Tm), tokens, mask, p.group_size, unpadded=segments))
            continue
        src, position_ids, seq_ids, keep, unpad = (next(packed) for _ in packing.Layout.TENSORS)
        ids = flat_ids[src][None]  # [1, N]
        inputs = dict(
            input_ids=ids, position_ids=position_ids[None], seq_ids=seq_ids[None], keep=keep, lengths=lay.lengths
        )
        out.append(Slice(r, Tm, inputs, ids[:, keep + 1], mask, unpad=unpad.view(len(p.rows), Tm)))
    return out


def _to_device(host: Tensor, device: torch.device) -> Tensor:
    """A host tensor on ``device``, copied without waiting for the device's queued work (pinned first)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
