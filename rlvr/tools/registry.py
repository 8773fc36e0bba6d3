"""Tool names -> functions, plugins, and :class:`Toolbox`: runs a batch of calls in the scoring pool.

A tool is a function ``(args: str) -> str``: the text of a call's arguments in, the result text
out. It raises :class:`~rlvr.tools.errors.ToolError` (or anything else) to answer with an error.
Built-ins are named in :data:`TOOLS`; a plugin is ``package.module:function`` or
``path/to/file.py:function``, as reward plugins are (:mod:`rlvr.rewards.registry`).

Every call runs in a process of the scoring pool (:mod:`rlvr.rewards.pool`, ``reward.workers``
processes) under a hard time limit (``rollout.tool_timeout_s``): a call that hangs gets its worker
killed and replaced, and answers ``error: timed out``. A failing, slow or oversized call becomes an
error result, is counted, and never stops the run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from rlvr import plugins
from rlvr.errors import UserError
from rlvr.rewards import verify
from rlvr.tools.calculator import calculator
from rlvr.tools.errors import ToolError
from rlvr.tools.sandbox import python
from rlvr.tools.syntax import CallSyntax

Tool = Callable[[str], str]

TOOLS: dict[str, Tool] = {"calculator": calculator, "python": python}
"""Built-in tools by name. ``python`` runs code in a subprocess: opt-in (:mod:`rlvr.tools.sandbox`)."""


def is_plugin(name: str) -> bool:
    """Whether ``name`` is ``package.module:function`` or ``path/to/file.py:function``."""
    return plugins.is_plugin(name, TOOLS)


def short_name(spec: str) -> str:
    """The name a call uses for a tool: a built-in's name, a plugin's function name."""
    return spec.rpartition(":")[2] if is_plugin(spec) else spec


def canonical(spec: str) -> str:
    """``spec`` with a relative plugin file path made absolute (pool workers may run elsewhere)."""
    return plugins.canonical(spec, TOOLS)


def get(spec: str) -> Tool:
    """A tool by name: a built-in (:data:`TOOLS`), ``package.module:function`` or ``path/to/file.py:function``.

    Raises:
        UserError: an unknown name (with close matches), a plugin that does not import or has no such function.
    """
    return plugins.load(
        spec, TOOLS, kind="tool", expects="(args: str) -> str", context=" in rollout.tools", close_matches=2
    )


def load_tool(spec: str, path: list[str]) -> None:
    """Import tool ``spec`` (a plugin's module) in a pool worker, once, before it takes calls."""
    if sys.path != path:
        sys.path[:] = path
    get(spec)


def call_tool(spec: str, args: str, max_chars: int, path: list[str]) -> tuple[str, bool]:
    """(result text, failed) of one call: what a pool worker runs (also in process with no workers).
    Any exception and any output that is not a string of at most ``max_chars`` characters is an error."""
    if sys.path != path:
        sys.path[:] = path
    try:
        out = get(spec)(args)
    except ToolError as e:
        return f"error: {e}", True
    except Exception as e:  # noqa: BLE001 - a plugin's failure is the model's result, never the run's end
        return f"error: {type(e).__name__}: {e}"[:max_chars], True
    if not isinstance(out, str):
        return f"error: the tool returned {type(out).__name__}, not text", True
    if len(out) > max_chars:
        return f"error: output of {len(out)} characters, more than {max_chars}", True
    return out, False


@dataclass(frozen=True)
class ToolResult:
    """One call's outcome: the text placed inside the result syntax, and whether it is an error."""

    output: str
    error: bool


class Toolbox:
    """The tools a rollout may call, their call syntax and limits.

    Args:
        specs: tool names or plugins (``rollout.tools``).
        syntax: the call and result syntax.
        timeout_s: hard time limit per call (``rollout.tool_timeout_s``).
        max_chars: longest result text; a longer one is an error (``rollout.tool_max_chars``).
        max_calls: most calls per response (``rollout.max_tool_calls``); the rollout loop keeps to it.
        workers: pool processes to run calls in (``reward.workers``; shared with scoring); 0 = in
            this process, without a time limit (the built-ins bound themselves).

    Raises:
        UserError: no tools, an unknown tool or a plugin that does not load, two tools with one name,
            several tools with a syntax that does not name them.
    """

    def __init__(
        self, specs: list[str], syntax: CallSyntax | None = None, *, timeout_s: float = 5.0, max_chars: int = 400,
        workers: int = 2, max_calls: int = 4,
    ) -> None:  # fmt: skip
        if not specs:
            raise UserError("no tools given; name at least one, e.g. rollout.tools=[calculator]")
        self.syntax = CallSyntax() if syntax is None else syntax
        self.specs = [canonical(s) for s in specs]
        for spec in self.specs:
            get(spec)  # a bad name or plugin: one line now, not at the first call
        names = [short_name(s) for s in self.specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise UserError(f"rollout.tools names '{dupes[0]}' twice; list each tool once")
        if not self.syntax.named and len(names) > 1:
            raise UserError(
                f"rollout.tool_call={self.syntax.call!r} does not name the tool, but rollout.tools has {len(names)}; "
                "put {name} in the call syntax or configure one tool"
            )
        self.by_name = dict(zip(names, self.specs))
        self.timeout_s, self.max_chars, self.workers, self.max_calls = timeout_s, max_chars, workers, max_calls

    @classmethod
    def from_config(cls, rollout_cfg, workers: int) -> Toolbox | None:
        """From a ``RolloutConfig`` (duck-typed: this package never imports the config module) and
        ``reward.workers``; None when ``rollout.tools`` is empty."""
        c = rollout_cfg
        if not c.tools:
            return None
        syntax = CallSyntax(c.tool_call, c.tool_result)
        return cls(
            c.tools, syntax, timeout_s=c.tool_timeout_s, max_chars=c.tool_max_chars, workers=workers,
            max_calls=c.max_tool_calls,
        )  # fmt: skip

    @property
    def names(self) -> list[str]:
        """The names calls use."""
        return list(self.by_name)

    def describe(self) -> str:
        """One line for prompts and logs: the tools and an example call."""
        example = self.syntax.format_call(self.names[0], "12*34" if self.names[0] == "calculator" else "...")
        return f"tools: {', '.join(self.names)}; call one as {example}"

    def warm(self) -> None:
        """Start the pool and import the plugins in its workers (untimed), before any call's limit runs."""
        if self.workers > 0:
            path = list(sys.path)
            self._pool().ensure([("rlvr.tools.registry:load_tool", (s, path)) for s in self.specs if is_plugin(s)])

    def _pool(self):
        return verify.Verifier(timeout_s=self.timeout_s, workers=self.workers).pool()

    def run(self, calls: list[tuple[str | None, str] | None]) -> list[ToolResult]:
        """Runs a batch of calls ``(tool name or None, args)``; None stands for text that ended like a
        call but did not parse (an error result). Results in input order."""
        out: list[ToolResult | None] = [None] * len(calls)
        todo = []
        for i, call in enumerate(calls):
            if call is None:
                out[i] = ToolResult(f"error: not a call; write {self.syntax.format_call('NAME', 'ARGS')}", True)
                continue
            name, args = call
            spec = self.by_name.get(self.names[0] if name is None else name)
            if spec is None:
                out[i] = ToolResult(f"error: no tool '{name}'; tools: {', '.join(self.names)}", True)
                continue
            todo.append((i, spec, args))
        path = list(sys.path)
        if self.workers > 0 and todo:
            setup = [("rlvr.tools.registry:load_tool", (s, path)) for s in dict.fromkeys(s for _, s, _ in todo)]
            setup = [c for c in setup if is_plugin(c[1][0])]
            jobs = [("rlvr.tools.registry:call_tool", (spec, args, self.max_chars, path)) for _, spec, args in todo]
            for (i, _, _), o in zip(todo, self._pool().run(jobs, self.timeout_s, setup=setup)):
                out[i] = ToolResult(*o.value) if o.error is None else ToolResult(f"error: {o.error}", True)
        else:
            for i, spec, args in todo:
                out[i] = ToolResult(*call_tool(spec, args, self.max_chars, path))
        return out  # type: ignore[return-value]
