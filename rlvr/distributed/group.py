"""The data-parallel collectives of :class:`rlvr.training.replicas.OneProcess`, over torch.distributed.

Every rank calls each method at the same point of the same step (a collective): the Trainer
code is the same on every rank, so the calls line up by construction.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

_BUCKET_ELEMENTS = 2**24  # 64 MiB of float32 per all-reduce: bounds the extra memory of the flat copy


class TorchGroup:
    """Rank ``rank`` of ``world_size`` in the default torch.distributed process group (already initialised).

    Tensors go through the collectives on ``device`` (gloo: CPU tensors; nccl: CUDA tensors).
    """

    shards = False

    def __init__(self, rank: int, world_size: int, device: torch.device | str) -> None:
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)

    def sum(self, x: Tensor) -> Tensor:
        out = x.detach().to(self.device, copy=True)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(x.device)

    def reduce_grads(self, model) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # a parameter this rank's batch did not reach: it adds zeros
                p.grad = torch.zeros_like(p)
        bucket: list[Tensor] = []
        size = 0
        for p in params:
            bucket.append(p.grad)
            size += p.grad.numel()
            if size >= _BUCKET_ELEMENTS:
                self._all_reduce(bucket)
                bucket, size = [], 0
        if bucket:
            self._all_reduce(bucket)

    @staticmethod
    def _all_reduce(grads: list[Tensor], group=None) -> None:
        """Sums ``grads`` over ``group`` (default every rank) in one flat all-reduce."""
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        for g, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(reduced)

    def reduce_stats(self, stats: dict[str, Tensor]) -> dict[str, Tensor]:
        ops = {"_min": dist.ReduceOp.MIN, "_max": dist.ReduceOp.MAX}
        out = {}
        for suffix, op in (*ops.items(), ("", dist.ReduceOp.SUM)):
            keys = [k for k in sorted(stats) if k not in out and (k.endswith(suffix) if suffix else True)]
            if not keys:
                continue
            values = torch.stack([stats[k].detach().float().to(self.device) for k in keys])
            dist.all_reduce(values, op=op)
            out.update(zip(keys, values))
        return {k: out[k] for k in stats}

    def gather(self, obj) -> list:
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out
