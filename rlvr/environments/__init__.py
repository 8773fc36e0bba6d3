"""Environments: what answers a model's turn during a rollout (:class:`Environment`: ``reset(row)``,
``step(turn)``). The tool loop (:class:`ToolCalls`) and code with execution feedback
(:class:`CodeFeedback`) are the built-ins; plugins subclass :class:`Environment`. The rollout drives
them (:mod:`rlvr.rollout.episodes`); tool calls run in the scoring pool, code in the sandbox.

Imports the standard library, :mod:`rlvr.tools`, :mod:`rlvr.rewards` and :mod:`rlvr.sandbox` only: no torch.
"""

from rlvr.environments.base import Environment, Step, Turn, step_all
from rlvr.environments.code import CodeFeedback, feedback_text
from rlvr.environments.registry import ENVIRONMENTS, from_settings, get
from rlvr.environments.tools import ToolCalls

__all__ = [
    "ENVIRONMENTS",
    "CodeFeedback",
    "Environment",
    "Step",
    "ToolCalls",
    "Turn",
    "feedback_text",
    "from_settings",
    "get",
    "step_all",
]
