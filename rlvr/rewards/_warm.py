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
