"""The exception a tool raises to answer with an error result."""


class ToolError(Exception):
    """A call the tool refuses or cannot complete; the model reads ``error: <message>`` as its result."""
