"""The trainer (setup / step / save / finish), one update, checkpoints and resume."""

from rlvr.training.trainer import Trainer, train

__all__ = ["Trainer", "train"]
