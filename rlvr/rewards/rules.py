"""Reward rules: pure ``(completion, answer) -> float`` functions.

``completion`` is the decoded response only (no prompt, special tokens stripped);
``answer`` is the gold answer string from the dataset.
"""

from __future__ import annotations

import re

from rlvr.rewards.extract import answer_tag, answers_match, extract_answer, last_boxed

_R1 = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def accuracy(completion: str, answer: str) -> float:
    """1.0 if the extracted answer (boxed, else ``<answer>`` text) equals ``answer``, else 0.0."""
    pred = extract_answer(completion)
    return float(pred is not None and answers_match(pred, answer))


def accuracy_lenient(completion: str, answer: str) -> float:
    """Like :func:`accuracy`, but falls back to the last number in the completion.

    For weak base models that often state the right number without ever boxing it: with
    the strict rule every sample in a group scores 0, the group advantage is 0 and nothing
    is learned. The price is false positives from stray numbers, so prefer ``accuracy``
    once the model boxes its answers.
    """
    pred = extract_answer(completion, fallback_last_number=True)
    return float(pred is not None and answers_match(pred, answer))


def format_r1(completion: str, answer: str) -> float:
    """1.0 iff the completion is exactly ``<think>..</think>`` then ``<answer>..</answer>``
    (whitespace allowed around and between), each tag once; else 0.0."""
    once = all(completion.count(t) == 1 for t in _TAGS)
    return float(once and _R1.fullmatch(completion) is not None)


def format_partial(completion: str, answer: str) -> float:
    """Partial credit toward the R1 format: 0.25 per step reached, in order.

    Steps: ``<think>`` present; ``</think>`` after it; ``<answer>..</answer>`` after that;
    a non-empty ``\\boxed{}`` inside the answer. A 135M base model never emits the full
    format by itself, so a 0/1 format reward is 0 for every sample, has zero variance in
    every group and gives no gradient; the ladder rewards getting closer.
    """
    think = completion.find("<think>")
    if think < 0:
        return 0.0
    think_end = completion.find("</think>", think)
    if think_end < 0:
        return 0.25
    tag = answer_tag(completion[think_end:])
    if tag is None:
        return 0.5
    return 1.0 if last_boxed(tag) else 0.75


def boxed(completion: str, answer: str) -> float:
    """1.0 if the completion contains a closed, non-empty ``\\boxed{...}``, else 0.0."""
    return float(bool(last_boxed(completion)))
