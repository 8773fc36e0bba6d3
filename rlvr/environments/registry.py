"""Environment names -> classes, plugins, and the one the rollout settings ask for."""

from __future__ import annotations

from typing import Callable

from rlvr import plugins
from rlvr.environments.base import Environment
from rlvr.environments.code import CodeFeedback
from rlvr.environments.tools import ToolCalls
from rlvr.errors import UserError

ENVIRONMENTS: dict[str, type] = {"tools": ToolCalls, "code_feedback": CodeFeedback}
"""Built-in environments by name: ``tools`` (``rollout.tools``), ``code_feedback`` (``rollout.max_turns`` > 1)."""


def get(spec: str) -> type:
    """An environment class by name (:data:`ENVIRONMENTS`), ``package.module:Class`` or ``path/to/file.py:Class``.

    Raises:
        UserError: an unknown name (with close matches), a plugin that does not import, or that is not
            a subclass of :class:`~rlvr.environments.Environment`.
    """
    cls = plugins.load(
        spec, ENVIRONMENTS, kind="environment", expects="subclassing rlvr.environments.Environment",
        context=" in rollout.environment", close_matches=2,
    )  # fmt: skip
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise UserError(
            f"rollout.environment={spec}: {getattr(cls, '__name__', cls)!r} is not a subclass of "
            "rlvr.environments.Environment; define class MyEnv(Environment) with reset(row) and step(turn)"
        )
    return cls


def from_settings(environment: str, *, toolbox=None, max_turns: int = 1) -> Callable[[], Environment] | None:
    """What makes each episode's environment for these rollout settings, or None (single-turn):
    ``environment`` named (a built-in or a plugin, built with no arguments, ``max_turns`` set when
    above 1), else the tool loop with ``toolbox``, else code feedback where ``max_turns`` > 1."""
    if environment:
        if environment == "tools":
            if toolbox is None:
                raise UserError("rollout.environment=tools needs rollout.tools, e.g. rollout.tools=[calculator]")
            return lambda: ToolCalls(toolbox)
        if environment == "code_feedback":
            return lambda: CodeFeedback(max(max_turns, 2))
        cls = get(environment)

        def make() -> Environment:
            env = cls()
            if max_turns > 1:
                env.max_turns = max_turns
            return env

        return make
    if toolbox is not None:
        return lambda: ToolCalls(toolbox)
    if max_turns > 1:
        return lambda: CodeFeedback(max_turns)
    return None
