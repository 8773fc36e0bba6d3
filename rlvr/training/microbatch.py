"""Which rows each forward pass of an update takes: ``train.micro_batch_seqs`` rows, split by length.

A micro-batch runs up to its longest response, so its shorter responses cost padding: with the
quickstart's 8-sample groups, responses of 30 to 128 tokens and one forward pass per group, a
third of the update's token positions were padding. :func:`plan` sorts each prompt's rows in a
micro-batch by length and cuts the sorted positions where that saves work, so the short ones run
in a pass of their own, cut at their own longest. The rows of a pass keep sharing their prompt
(the same number of rows per prompt: the k shortest of every prompt). Which rows run together
changes nothing but float rounding: each row's logits depend on its own tokens only, and every
pass's loss divides by the step's global counts (``tests/training/test_microbatch.py`` checks the
gradient against one pass over the whole batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PASS_COST_TOKENS = 48
"""The fixed cost of one more forward + backward pass, in token-rows of compute (Python and
kernel launch overhead, smaller matrices): a cut must save more than this."""


@dataclass(frozen=True)
class Pass:
    """One forward pass of an update: ``rows`` of the batch, cut after ``longest`` response tokens,
    ``group_size`` consecutive rows sharing a prompt (1: no sharing)."""

    rows: torch.Tensor
    longest: int
    group_size: int


def plan(
    lengths: list[int], *, micro_batch_seqs: int, group_size: int, prompt_len: int, bucket: bool = True
) -> list[Pass]:
    """The forward passes over a batch whose row ``i`` has a response of ``lengths[i]`` tokens.

    Args:
        lengths: response length of every row (rows grouped by prompt, ``group_size`` consecutive
            rows per prompt when ``group_size > 1``).
        micro_batch_seqs: rows per micro-batch (a micro-batch starts at a multiple of it).
        group_size: rows per shared prompt inside a micro-batch (1 = each row runs its own prompt).
        prompt_len: prompt positions per row, what a shared prompt costs per pass.
        bucket: split micro-batches by length; False gives one pass per micro-batch, in row order.

    Returns:
        Passes that cover every row once, micro-batch by micro-batch.
    """
    passes = []
    B = len(lengths)
    for start in range(0, B, micro_batch_seqs):
        rows = list(range(start, min(start + micro_batch_seqs, B)))
        g = group_size if group_size > 1 and len(rows) % group_size == 0 else 1
        if not bucket:
            passes.append(Pass(torch.tensor(rows), max(1, max(lengths[r] for r in rows)), g))  # cpu: row indices
            continue
        # columns of positions: prompt p's rows sorted by length; with no sharing, one "prompt" of every row
        width = g if g > 1 else len(rows)
        prompts = [sorted(rows[i : i + width], key=lambda r: lengths[r]) for i in range(0, len(rows), width)]
        for a, b in _cuts([max(lengths[p[j]] for p in prompts) for j in range(width)], len(prompts), prompt_len, g > 1):
            chosen = [r for p in prompts for r in p[a:b]]
            longest = max(1, max(lengths[r] for r in chosen))
            passes.append(Pass(torch.tensor(chosen), longest, (b - a) if g > 1 else 1))  # cpu: row indices
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
