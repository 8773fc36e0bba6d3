"""Verifiable rewards: ``(completion, answer) -> float`` rules, answer extraction, scoring.

Imports only the stdlib (math_verify lazily, inside :func:`answers_match`); no torch.
"""

from rlvr.rewards.extract import (
    answer_tag,
    answers_match,
    extract_answer,
    last_boxed,
    last_number,
    normalize_number,
)
from rlvr.rewards.registry import REWARDS, RewardResult, get_reward, score
from rlvr.rewards.rules import accuracy, accuracy_lenient, boxed, format_partial, format_r1

__all__ = [
    "REWARDS",
    "RewardResult",
    "accuracy",
    "accuracy_lenient",
    "answer_tag",
    "answers_match",
    "boxed",
    "extract_answer",
    "format_partial",
    "format_r1",
    "get_reward",
    "last_boxed",
    "last_number",
    "normalize_number",
    "score",
]
