"""Imported by the reward pool's forkserver: loads math-verify (sympy, the LaTeX parser) and runs
one comparison, so every forked worker starts warm. Not for use in the trainer process."""

from __future__ import annotations

import logging

from rlvr.rewards.verify import math_verify_match

# the parent enforces the time limit by killing the worker; math-verify would otherwise warn
# on every call that its own (signal) timeout is off
logging.getLogger("math_verify").setLevel(logging.CRITICAL)
math_verify_match("\\frac{1}{2}", "0.5")


def verify_in_worker(pred: str, gold: str) -> bool:
    return math_verify_match(pred, gold)


def warm_up() -> bool:
    """One trivial verification in a freshly forked worker, before it takes items: the pages and
    caches it touches are then this process's own, so the first real item costs only itself."""
    return math_verify_match("\\frac{1}{2}", "0.5") and math_verify_match("x^2+1", "1+x^2")
