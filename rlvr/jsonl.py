"""JSONL, one object per line: the one line parser, the one writer, and truncation on resume.

Two kinds of file go through here. A run's own files (``metrics.jsonl``, ``samples.jsonl``,
``eval/history.jsonl``; see :mod:`rlvr.run_dir`) are read tolerantly: a line cut short by a
crash is skipped. Data files (:func:`rlvr.data.files.read_jsonl_values`) pass ``on_error`` and
turn a bad line into a one-line error. Both parse lines with :func:`parse_lines`.

Imports no torch: a report reads runs without loading it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable


def parse_lines(
    lines: str | Iterable[str],
    *,
    on_error: Callable[[int, Exception], None] | None = None,
    parse_constant: Callable[[str], Any] | None = None,
) -> list[tuple[int, object]]:
    """(line number, parsed JSON value) for every non-blank line, numbered from 1.

    Args:
        lines: the file's text, or its lines in order (a data file is read one line at a time,
            :func:`rlvr.data.files.read_jsonl_values`).
        on_error: called with (line number, exception) for a line that is not JSON
            (``ValueError``, ``RecursionError`` for deep nesting); it raises, or returns and the
            line is left out. None: the line is left out, as a line cut by a crash must be.
        parse_constant: ``json.loads``'s hook for NaN/Infinity (None accepts them).
    """
    values = []
    for lineno, line in enumerate(lines.split("\n") if isinstance(lines, str) else lines, start=1):
        if not line.strip():
            continue
        try:
            values.append((lineno, json.loads(line, parse_constant=parse_constant)))
        except (ValueError, RecursionError) as e:
            if on_error is not None:
                on_error(lineno, e)
    return values


def read_jsonl(path: Path) -> list[dict]:
    """All complete rows of a run's JSONL file (a line cut by a crash, or any non-object line, is skipped).

    Undecodable bytes are replaced rather than fatal: a run file is never worth a crash.
    """
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    return [row for _, row in parse_lines(text) if isinstance(row, dict)]


def plain(value: Any) -> Any:
    """A tensor as a JSON value (``.item()`` when it holds one element, else ``.tolist()``); anything else as is.

    Duck-typed on ``numel``/``tolist`` so that this module needs no torch import."""
    if hasattr(value, "numel") and hasattr(value, "tolist"):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def _tensor_default(value: Any) -> Any:
    converted = plain(value)
    if converted is value:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return converted


def dumps(row: dict) -> str:
    """One JSONL line (with its newline); tensors become numbers or lists, non-ASCII stays as is."""
    return json.dumps(row, ensure_ascii=False, default=_tensor_default) + "\n"


class JsonlWriter:
    """Appends one JSON object per line and fsyncs it, so a crash loses at most the line being written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self._f.write(dumps(row))
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Drop rows with ``step > max_step`` (rows a resumed run will write again), atomically."""
    path = Path(path)
    if not path.is_file():
        return
    keep = [row for row in read_jsonl(path) if row.get("step", 0) <= max_step]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(dumps(row) for row in keep), encoding="utf-8")
    os.replace(tmp, path)
