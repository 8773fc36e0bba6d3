"""How a tool call and its result look in a response: ``<tool>calculator: 37*58</tool>`` then
``<result>2146</result>`` by default (``rollout.tool_call`` / ``rollout.tool_result``).

A rollout generates with the call's closing text (:attr:`CallSyntax.close`) as an extra stop
string; a row that stopped there holds a complete call at its end, which :meth:`CallSyntax.parse`
reads back. The syntax rule itself (:func:`rlvr.choices.parse_tool_syntax`) is shared with the
config, which checks it when a config loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlvr.choices import TOOL_CALL_SYNTAX, TOOL_RESULT_SYNTAX, parse_tool_syntax
from rlvr.errors import UserError

NAME = r"[A-Za-z_][\w.-]*"
"""What a tool name in a call may look like."""


@dataclass(frozen=True)
class CallSyntax:
    """A call syntax with ``{name}`` and ``{args}`` and a result syntax with ``{output}``.

    Raises:
        UserError: a syntax that cannot be parsed (one line naming the key).
    """

    call: str = TOOL_CALL_SYNTAX
    result: str = TOOL_RESULT_SYNTAX
    open: str = field(init=False)
    """Text that starts a call (``<tool>``)."""
    sep: str = field(init=False)
    """Text between the tool's name and its arguments (``": "``); empty when the syntax has no ``{name}``."""
    close: str = field(init=False)
    """Text that ends a call (``</tool>``): the stop string a rollout pauses at."""
    result_open: str = field(init=False)
    result_close: str = field(init=False)

    def __post_init__(self) -> None:
        try:
            parts = parse_tool_syntax(self.call, self.result)
        except ValueError as e:
            raise UserError(f"rollout.{e}") from None
        for name, value in zip(("open", "sep", "close", "result_open", "result_close"), parts):
            object.__setattr__(self, name, value)

    @property
    def named(self) -> bool:
        """The call names its tool (``{name}`` in the syntax)."""
        return bool(self.sep)

    def parse(self, text: str) -> tuple[str | None, str] | None:
        """(tool name or None when the syntax names none, arguments) of the call that ``text`` ends
        with (the response so far, which stopped at :attr:`close`); None when it holds no complete
        call there (a closing text without an opening one, or no name before the separator)."""
        end = text.rfind(self.close)
        if end < 0 or text[end + len(self.close) :].strip():
            return None
        start = text.rfind(self.open, 0, end)
        if start < 0:
            return None
        inner = text[start + len(self.open) : end]
        if self.close in inner:  # that opening belongs to an earlier, finished call
            return None
        if not self.named:
            return None, inner.strip()
        m = re.match(rf"\s*({NAME})\s*{re.escape(self.sep.strip())}(.*)\Z", inner, re.DOTALL)
        if m is None:
            return None
        return m.group(1), m.group(2).strip()

    def format_call(self, name: str, args: str) -> str:
        """The text of a call (for prompts and docs): ``<tool>calculator: 37*58</tool>``."""
        return self.call.replace("{name}", name).replace("{args}", args)

    def format_result(self, output: str) -> str:
        """The text the environment appends after a call: ``<result>2146</result>``."""
        return self.result.replace("{output}", output)
