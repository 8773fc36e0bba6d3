"""What ``distributed.strategy=fsdp`` needs of torch, checked before anything is sharded.

Kept apart from :mod:`rlvr.distributed.fsdp`, whose imports already fail on a torch without FSDP2:
this module imports nothing of FSDP at load, so it can say so in one line."""

from __future__ import annotations

from rlvr.errors import UserError

FSDP_TORCH = "2.8"
"""The first torch with every FSDP2 call :mod:`rlvr.distributed.fsdp` makes: ``fully_shard`` is public in
``torch.distributed.fsdp`` from 2.6; ``FSDPModule.set_gradient_divide_factor`` (the old
``set_reduce_scatter_divide_factor`` renamed) and ``set_force_sum_reduction_for_comms`` came together
in 2.8 (pytorch/pytorch#155915). pyproject.toml's floor is the same."""

FSDP_CALLS = ("fully_shard", "FSDPModule.set_gradient_divide_factor", "FSDPModule.set_force_sum_reduction_for_comms")


def fsdp_missing() -> list[str]:
    """The calls of :data:`FSDP_CALLS` this torch lacks (none on torch >= :data:`FSDP_TORCH`)."""
    try:
        import torch.distributed.fsdp as fsdp
    except ImportError:
        return list(FSDP_CALLS)
    missing = []
    for call in FSDP_CALLS:
        owner, _, attr = call.rpartition(".")
        obj = getattr(fsdp, owner, None) if owner else fsdp
        if obj is None or not hasattr(obj, attr):
            missing.append(call)
    return missing


def require_fsdp() -> None:
    """UserError, one line naming the torch version, unless this torch has every FSDP2 call rlvr makes."""
    missing = fsdp_missing()
    if missing:
        import torch

        raise UserError(
            f"distributed.strategy=fsdp needs torch>={FSDP_TORCH} (FSDP2's {', '.join(missing)}), but this "
            f"environment has torch {torch.__version__}; pip install 'torch>={FSDP_TORCH}' on every node, or use "
            "distributed.strategy=ddp"
        )
