"""The order in which training prompts are visited: a pure function of (seed, step)."""

from __future__ import annotations

import random


class PromptStream:
    """Yields ``prompts_per_step`` row indices per step, reshuffling each epoch.

    The batch of step ``s`` depends only on ``(seed, s)``, so resuming at step ``s`` needs no
    saved iterator: the data position is the step number.
    """

    def __init__(self, num_rows: int, prompts_per_step: int, seed: int) -> None:
        self.num_rows = num_rows
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self._perm_epoch = -1
        self._perm: list[int] = []

    def _permutation(self, epoch: int) -> list[int]:
        if epoch != self._perm_epoch:
            self._perm = list(range(self.num_rows))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._perm)
            self._perm_epoch = epoch
        return self._perm

    def batch(self, step: int) -> list[int]:
        """Row indices for (0-based) ``step``."""
        start = step * self.prompts_per_step
        out = []
        for pos in range(start, start + self.prompts_per_step):
            epoch, offset = divmod(pos, self.num_rows)
            out.append(self._permutation(epoch)[offset])
        return out
