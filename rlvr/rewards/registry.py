"""Reward names -> functions, and weighted scoring of a batch of completions."""

from __future__ import annotations

import difflib
import importlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from rlvr.errors import UserError
from rlvr.rewards.rules import accuracy, accuracy_lenient, boxed, format_partial, format_r1

RewardFn = Callable[[str, str], float]
log = logging.getLogger(__name__)

REWARDS: dict[str, RewardFn] = {
    "accuracy": accuracy,
    "accuracy_lenient": accuracy_lenient,
    "format": format_r1,
    "format_partial": format_partial,
    "boxed": boxed,
}


def get_reward(name: str) -> RewardFn:
    """A registered reward by name, or a user function given as ``"package.module:function"``.

    Raises:
        UserError: unknown name (with close-match suggestions) or an unimportable path.
    """
    if ":" in name:
        mod_name, _, fn_name = name.partition(":")
        try:
            module = importlib.import_module(mod_name)
        except ImportError as e:
            raise UserError(
                f"cannot import reward module '{mod_name}' (from '{name}'): {e}; "
                "check the module is on PYTHONPATH"
            ) from None
        fn = getattr(module, fn_name, None)
        if not callable(fn):
            raise UserError(
                f"reward module '{mod_name}' has no function '{fn_name}'; "
                "expected 'package.module:function' taking (completion, answer) -> float"
            )
        return fn
    if name in REWARDS:
        return REWARDS[name]
    close = difflib.get_close_matches(name, REWARDS, n=3)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise UserError(
        f"unknown reward '{name}'; {hint}known: {', '.join(sorted(REWARDS))}, "
        "or 'package.module:function'"
    )


@dataclass(frozen=True)
class RewardResult:
    """Scores for a batch of B completions.

    Attributes:
        total: [B] weighted sum over rules.
        per_rule: rule name -> [B] raw (unweighted) scores.
        errors: rule name -> how many samples raised (those scored 0.0).
    """

    total: list[float]
    per_rule: dict[str, list[float]]
    errors: dict[str, int]


def score(completions: list[str], answers: list[str], rules: dict[str, float]) -> RewardResult:
    """Weighted reward per completion: ``total[i] = sum_r w_r * r(completions[i], answers[i])``.

    A rule that raises or returns a non-finite value scores 0.0 for that sample and is
    counted in ``errors``, so a verifier bug shows up in the metrics instead of killing a run.

    Args:
        completions: [B] decoded responses.
        answers: [B] gold answers, aligned with ``completions``.
        rules: reward name -> weight.
    """
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completions but {len(answers)} answers")
    if not rules:
        raise UserError("no reward rules given; pass at least one, e.g. {'accuracy': 1.0}")
    fns = {name: get_reward(name) for name in rules}
    per_rule: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    for name, fn in fns.items():
        scores, n_err = [], 0
        for c, a in zip(completions, answers):
            try:
                s = float(fn(c, a))
                if not math.isfinite(s):
                    raise ValueError(f"non-finite reward {s}")
            except Exception:  # noqa: BLE001 - never crash training on one bad sample
                if n_err == 0:
                    log.warning("reward %r raised; scoring 0.0", name, exc_info=True)
                s, n_err = 0.0, n_err + 1
            scores.append(s)
        per_rule[name], errors[name] = scores, n_err
    total = [sum(rules[n] * per_rule[n][i] for n in rules) for i in range(len(completions))]
    return RewardResult(total=total, per_rule=per_rule, errors=errors)
