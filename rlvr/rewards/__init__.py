"""Verifiable rewards: rules ``(completions, labels, **fields) -> list[float]``, answer extraction,
math equivalence, and :class:`Scorer` (weighted total, per-rule scores, error counts).

Imports only the stdlib; math_verify (sympy) is imported by the verifier worker processes, or
lazily in this process when ``workers=0``. No torch.

    >>> from rlvr import rewards
    >>> rewards.get("format")(["<think>2+3</think> <answer>\\\\boxed{5}</answer>"], ["5"])
    [1.0]
"""

from rlvr.rewards.extract import (
    answer_is,
    answer_tag,
    denoted_number,
    extract_answer,
    gold_answer,
    gsm8k_answer,
    last_boxed,
    last_number,
    minerva_answer,
    normalize_number,
    number_key,
    number_value,
)
from rlvr.rewards.registry import REWARDS, RewardError, RewardResult, Scorer, get, score
from rlvr.rewards.rules import format_partial, format_r1, strict_format
from rlvr.rewards.verify import answers_match, match_many

__all__ = [
    "REWARDS",
    "RewardError",
    "RewardResult",
    "Scorer",
    "answer_is",
    "answer_tag",
    "answers_match",
    "denoted_number",
    "extract_answer",
    "format_partial",
    "format_r1",
    "get",
    "gold_answer",
    "gsm8k_answer",
    "last_boxed",
    "last_number",
    "match_many",
    "minerva_answer",
    "normalize_number",
    "number_key",
    "number_value",
    "score",
    "strict_format",
]
