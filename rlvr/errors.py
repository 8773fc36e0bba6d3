"""The one exception type that reaches the user as a single line.

Anything a user can get wrong (config key, data file, model path, reward name, CLI flag)
raises :class:`UserError` with a message that says what is wrong and how to fix it.
The CLI prints ``error: <message>`` and exits with status 2; no traceback.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one line and a non-zero exit."""
