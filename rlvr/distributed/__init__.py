"""Data-parallel training on Ray, imported only when ``distributed.backend=ray``.

``driver``: :class:`RayTrainer`, the Trainer's methods run on N Ray actors in a placement group;
``worker``: one actor, a :class:`rlvr.training.trainer.Trainer` with a rank; ``group``: the
torch.distributed collectives (gloo on CPU, nccl on GPU) the Trainer calls at its sync points.
"""

from rlvr.distributed.driver import RayTrainer, train

__all__ = ["RayTrainer", "train"]
