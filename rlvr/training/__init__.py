"""The trainer (setup / step / save / finish), one update, checkpoints and resume."""

from rlvr.training.trainer import Trainer, run, train

__all__ = ["Trainer", "run", "train"]
