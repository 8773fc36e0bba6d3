"""From a DataConfig to train and test rows ``{"question", "answer"}``."""

from __future__ import annotations

from rlvr.data.files import load_jsonl
from rlvr.data.tasks import arithmetic


def load_rows(data) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows) for ``data`` (a :class:`rlvr.config.DataConfig`)."""
    if data.task == "arithmetic":
        test = arithmetic(data.test_size, seed=data.test_seed, difficulty=data.difficulty)
        train = arithmetic(data.train_size, seed=data.train_seed, difficulty=data.difficulty)
        return train, test
    keys = dict(question_key=data.question_key, answer_key=data.answer_key)
    train = load_jsonl(data.path, **keys)
    test = load_jsonl(data.test_path, **keys) if data.test_path else []
    return train, test
