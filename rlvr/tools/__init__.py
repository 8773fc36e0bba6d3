"""Tools a model may call during a rollout: functions ``(args: str) -> str`` by name or plugin,
run in the scoring pool under a time limit (:class:`Toolbox`), in a configurable call syntax
(:class:`CallSyntax`). The loop that pauses generation at a call, runs it and feeds the result
back is an environment (:class:`rlvr.environments.ToolCalls`), run by :mod:`rlvr.rollout.episodes`.

Imports the standard library and :mod:`rlvr.rewards` (its worker pool) only: no torch.
"""

from rlvr.tools.calculator import calculator
from rlvr.tools.errors import ToolError
from rlvr.tools.registry import TOOLS, Toolbox, ToolResult, call_tool, get, short_name
from rlvr.tools.sandbox import python
from rlvr.tools.stats import tool_stats
from rlvr.tools.syntax import CallSyntax

__all__ = [
    "TOOLS",
    "CallSyntax",
    "ToolError",
    "ToolResult",
    "Toolbox",
    "calculator",
    "call_tool",
    "get",
    "python",
    "short_name",
    "tool_stats",
]
