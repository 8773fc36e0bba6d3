"""The collectives a training step needs from its data-parallel group, for one process.

:class:`rlvr.training.trainer.Trainer` calls them at the few points where a step's numbers must
cover the whole global batch: the loss denominators, the gradients, the update statistics and
the metrics of everything sampled. In one process each is the identity; under Ray,
:class:`rlvr.distributed.group.TorchGroup` implements the same methods with torch.distributed.
"""

from __future__ import annotations

from torch import Tensor


class OneProcess:
    """The group of a single process: rank 0 of 1; every collective returns its input."""

    rank = 0
    world_size = 1
    shards = False
    """Each rank holds a shard of the models rather than a replica (FSDP: :mod:`rlvr.distributed.fsdp`)."""

    def sum(self, x: Tensor) -> Tensor:
        """The sum of ``x`` over all ranks (a tensor of any shape, the same on every rank)."""
        return x

    def reduce_grads(self, model) -> None:
        """Sums the gradients of ``model``'s trainable parameters over all ranks, in place."""

    def reduce_stats(self, stats: dict[str, Tensor]) -> dict[str, Tensor]:
        """Update statistics over all ranks: ``*_min`` keys by min, ``*_max`` by max, the rest summed."""
        return stats

    def gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        return [obj]
