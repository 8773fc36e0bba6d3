"""Loading question/answer rows from JSONL files, with errors that name the file and row."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rlvr.errors import UserError


def load_jsonl(path: str | Path, *, question_key: str = "question", answer_key: str = "answer") -> list[dict]:
    """Rows ``{"question", "answer"}`` from a JSONL file (one JSON object per line; blank lines skipped).

    Answers are kept as strings; GSM8K-style answers ("... #### 42") keep only the part after ``####``.

    Raises:
        UserError: missing file, a line that is not a JSON object, or a row without a key.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"data file {path} not found; set data.path to an existing .jsonl file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8 JSONL") from None
    rows = []
    for lineno, line in enumerate(io.StringIO(text), start=1):  # splits on newlines only, like the file
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg}); each line must be one JSON object") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        for key, what in ((question_key, "question"), (answer_key, "answer")):
            if obj.get(key) in (None, ""):
                have = ", ".join(sorted(obj)) or "none"
                raise UserError(
                    f"{path}:{lineno}: row has no '{key}' ({what} key; keys present: {have}); "
                    f"set data.{what}_key to the right key"
                )
        answer = str(obj[answer_key])
        if "####" in answer:
            answer = answer.split("####")[-1].strip()
        rows.append({"question": str(obj[question_key]), "answer": answer})
    if not rows:
        raise UserError(f"{path} holds no rows")
    return rows
