"""The training loop, checkpoints and resume."""

from rlvr.training.loop import train

__all__ = ["train"]
