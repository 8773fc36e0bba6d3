"""Evaluation metrics: the unbiased pass@k estimator and majority voting. Stdlib only."""

from __future__ import annotations

from collections import Counter


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct.

    Math: pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, "Evaluating Large Language Models
    Trained on Code", eq. 1), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), their numerically
    stable form; it is 1.0 when n - c < k (every k-subset holds a correct sample).

    Args:
        n: samples drawn for the problem (n >= k).
        c: how many of them are correct (0 <= c <= n).
        k: the k in pass@k.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def ks_up_to(samples: int) -> list[int]:
    """k = 1, 2, 4, ... up to ``samples``, plus ``samples`` itself: the k reported for pass@k."""
    ks, k = [], 1
    while k <= samples:
        ks.append(k)
        k *= 2
    if ks[-1] != samples:
        ks.append(samples)
    return ks


def majority_vote(answers: list[str | None], key=lambda a: a) -> str | None:
    """The most frequent non-None answer (ties: the one seen first), or None if there is none.

    Args:
        answers: extracted answers of the K samples of one problem (None = no answer).
        key: canonical form used for counting, e.g. a number normaliser, so "0.5" and "1/2" agree.
    """
    seen = [(key(a), a) for a in answers if a is not None]
    if not seen:
        return None
    counts = Counter(k for k, _ in seen)
    best = max(counts.values())
    return next(a for k, a in seen if counts[k] == best)
