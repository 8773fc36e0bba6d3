"""Rollout engines: turn prompts into G sampled completions each. They know nothing of losses."""

from rlvr.rollout.base import RolloutBatch
from rlvr.rollout.hf import HFRolloutEngine

__all__ = ["HFRolloutEngine", "RolloutBatch"]
