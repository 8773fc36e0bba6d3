"""The one exception type that reaches the user as a single line.

Anything a user can get wrong (config key, data file, model path, reward name, CLI flag)
raises :class:`UserError` with a message that says what is wrong and how to fix it.
The CLI prints ``error: <message>`` and exits with status 2; no traceback.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one line and a non-zero exit.

    Messages quote what the user typed; a newline or other control character in it is shown
    escaped (``\\n``), so the message stays one line whatever the input."""

    def __str__(self) -> str:
        text = super().__str__()
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def failure_line(e: BaseException) -> str:
    """``Type: first line of the message`` (at most 200 characters): how a fail-soft fallback names what failed."""
    text = str(e)
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"
