"""A reward that varies by completion, for benchmarks on random-initialised models (``vs_trl.py --model
random:...``): such a model never earns accuracy or format, so every group would have zero spread, no
advantage and no gradient, and the update would not do the work a real run does. This pays the share of
distinct characters in the completion, a number that differs between samples of any model."""

from __future__ import annotations


def spread(completions: list[str], labels: list, **fields) -> list[float]:
    """Distinct characters / characters of each completion (0 for an empty one)."""
    return [len(set(c)) / len(c) if c else 0.0 for c in completions]
