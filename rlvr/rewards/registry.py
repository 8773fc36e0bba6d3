"""Reward names -> rules, plugins, and :class:`Scorer`: per-rule scores, weighted total, error counts."""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from numbers import Real

from rlvr import plugins
from rlvr.choices import OnError
from rlvr.errors import UserError
from rlvr.rewards import rules as R
from rlvr.rewards import verify
from rlvr.rewards.code import code_tests, code_tests_frac
from rlvr.rewards.countdown import countdown_reward
from rlvr.rewards.rules import Rule

log = logging.getLogger(__name__)


REWARDS: dict[str, Rule] = {
    # rlvr rules
    "accuracy": R.accuracy,
    "accuracy_lenient": R.accuracy_lenient,
    "format": R.each(R.format_r1),
    "strict_format": R.each(R.strict_format),
    "format_partial": R.each(R.format_partial),
    "tag_count": R.each(R.tag_count),
    "reasoning_steps": R.each(R.reasoning_steps),
    "boxed": R.each(R.has_boxed),
    "countdown": countdown_reward,
    "tool_format": R.each(R.tool_format),
    "tool_wellformed": R.each(R.tool_wellformed),
    "code_tests": code_tests,
    "code_tests_frac": code_tests_frac,
    # MindSpeed-RL names and score values (rule_verifier.py)
    "base_acc": R.base_acc,
    "acc": R.acc,
    "ms_strict_format": R.each(R.ms_strict_format),
    "math_17k_acc": R.math_17k_acc,
    "acc_for_dapo": R.acc_for_dapo,
    "step": R.each(R.ms_step),
    # MindRLHF names (reward_fn.py)
    "qwen_accuracy_reward": R.qwen_accuracy_reward,
    "format_reward": R.each(R.ms_format),
}
"""Built-in rules by name. Adding an entry here registers an in-process rule (tests do this)."""


class RewardError(RuntimeError):
    """A rule failed on an item while ``reward.on_error=raise``."""


def is_plugin(name: str) -> bool:
    """Whether ``name`` is ``package.module:function`` or ``path/to/file.py:function``."""
    return plugins.is_plugin(name, REWARDS)


def canonical(name: str) -> str:
    """``name`` with a relative plugin file path made absolute (workers may run in another directory)."""
    return plugins.canonical(name, REWARDS)


def get(name: str) -> Rule:
    """A rule by name: a built-in (``rlvr reward list``), ``package.module:function`` or
    ``path/to/file.py:function``. A plugin is any ``(completions, labels, **fields) -> list[float]``.

    A built-in rule returns one float per item; the accuracy-type ones return NaN for an item whose
    math-verify comparison timed out or crashed (never for a number gold, decided without it), and
    :class:`Scorer` turns that NaN into ``on_error_score`` and counts it. Score through a Scorer
    (or :func:`score`) to never see NaN.

    Raises:
        UserError: unknown name (with close matches and the known names), or a plugin that
            cannot be imported or has no such function.
    """
    return plugins.load(name, REWARDS, kind="reward", expects="(completions, labels, **fields) -> list[float]")


def load_rule(name: str, path: list[str]) -> None:
    """Import rule ``name`` (a plugin's module) in a pool worker, once, before it takes items."""
    if sys.path != path:
        sys.path[:] = path
    get(name)


def call_one(name: str, completion: str, label, fields: dict, path: list[str]):
    """Run rule ``name`` on a one-item batch and return its one score (what a pool worker runs).
    ``path`` is the parent's ``sys.path``, which may have grown since the worker started."""
    if sys.path != path:
        sys.path[:] = path
    out = get(name)([completion], [label], **{k: [v] for k, v in fields.items()})
    _check_length(name, out, 1)
    return out[0]


def _check_length(name: str, out, n: int) -> None:
    if not isinstance(out, (list, tuple)) or len(out) != n:
        got = f"{len(out)} scores" if isinstance(out, (list, tuple)) else type(out).__name__
        raise UserError(
            f"reward rule '{name}' returned {got} for {n} completions; "
            "a rule returns a list with one float per completion"
        )


@dataclass(frozen=True)
class RewardResult:
    """Scores for a batch of B completions.

    Attributes:
        total: [B] weighted sum over rules (``truncated_score`` for truncated items, if set).
        per_rule: rule name -> [B] raw (unweighted) scores; failed items hold ``on_error_score``.
        errors: rule name -> how many items failed (raised, timed out, NaN or not a number).
    """

    total: list[float]
    per_rule: dict[str, list[float]]
    errors: dict[str, int]


class _Failed:
    def __init__(self, why: str):
        self.why = why


def _as_score(value) -> float | _Failed:
    if isinstance(value, _Failed):
        return value
    if not isinstance(value, Real):
        return _Failed(f"returned {type(value).__name__} {value!r:.40}, not a number")
    value = float(value)
    return (
        value
        if math.isfinite(value)
        else _Failed(f"scored {value} (for built-in rules: the verifier timed out or crashed)")
    )


class Scorer:
    """Scores batches with fixed rules and weights: ``total[i] = sum_r weight_r * rule_r[i]``.

    Args:
        rules: rule names (see :func:`get`).
        weights: one weight per rule; None = all 1.0.
        on_error: ``score`` (failed item gets ``on_error_score``, counted, first one logged with the
            sample) or ``raise`` (:class:`RewardError`).
        on_error_score: score of an item whose rule failed.
        truncated_score: if not None, the total of a completion marked truncated.
        timeout_s: hard time limit per item for math-verify and for plugin rules.
        workers: pool processes for math-verify and plugins; 0 = all in this process (math-verify
            then uses its signal timeouts, and plugins have no time limit).

    ``timeout_s`` and ``workers`` are this scorer's own (:attr:`verifier`): its rules run under
    them, and creating a scorer changes no setting of any other. Scorers with the same ``workers``
    share one pool of processes (see :func:`rlvr.rewards.verify.Verifier.pool`).

    Raises:
        UserError: empty or duplicated rules, a weight count that does not match, an unknown rule.
    """

    def __init__(
        self,
        rules: list[str],
        weights: list[float] | None = None,
        *,
        on_error: OnError | str = OnError.SCORE,
        on_error_score: float = 0.0,
        truncated_score: float | None = None,
        timeout_s: float = 2.0,
        workers: int = 2,
    ):
        rules = list(rules)
        weights = [1.0] * len(rules) if weights is None else [float(w) for w in weights]
        if not rules:
            raise UserError("no reward rules given; pass at least one, e.g. rules=[accuracy]")
        if len(weights) != len(rules):
            raise UserError(
                f"{len(weights)} reward weights for {len(rules)} rules ({', '.join(rules)}); give one weight per rule"
            )
        dupes = sorted({r for r in rules if rules.count(r) > 1})
        if dupes:
            raise UserError(f"reward rule {', '.join(dupes)} listed twice; list each rule once and adjust its weight")
        self.rules, self.weights = rules, weights
        self.on_error, self.on_error_score, self.truncated_score = (
            OnError(str(on_error)),
            on_error_score,
            truncated_score,
        )
        self.verifier = verify.Verifier(timeout_s=timeout_s, workers=workers)
        self._fns = {name: get(name) for name in rules}
        self._warned: set[str] = set()

    @classmethod
    def from_config(cls, reward_cfg) -> Scorer:
        """From a ``RewardConfig`` (duck-typed, so this package never imports the config module)."""
        c = reward_cfg
        return cls(
            c.rules, c.weights, on_error=c.on_error, on_error_score=c.on_error_score,
            truncated_score=c.truncated_score, timeout_s=c.timeout_s, workers=c.workers,
        )  # fmt: skip

    def warm(self, extra_rules: tuple[str, ...] = ()) -> None:
        """Start and warm everything scoring needs, so that no item's time limit pays for it: with
        workers, the shared pool (each worker runs one trivial verification) and each plugin
        module imported once per worker (a replacement imports it before it takes that plugin's
        items); without, math-verify imported here.
        Call it before the first timed batch; calling it again costs nothing."""
        names = list(dict.fromkeys([*self.rules, *extra_rules]))
        if self.verifier.workers == 0:
            verify.answers_match("x+1", "1+x", timeout_s=self.verifier.timeout_s)  # imports math-verify (sympy)
            return
        path = list(sys.path)
        self.verifier.pool().ensure(
            [("rlvr.rewards.registry:load_rule", (canonical(n), path)) for n in names if is_plugin(n)]
        )

    def rule_scores(
        self, name: str, completions: list[str], labels: list, fields: dict | None = None
    ) -> tuple[list[float], int]:
        """(scores, error count) of one rule, which need not be among ``self.rules``."""
        scores, failures = self.rule_items(name, completions, labels, fields)
        return scores, sum(f is not None for f in failures)

    def rule_items(
        self, name: str, completions: list[str], labels: list, fields: dict | None = None
    ) -> tuple[list[float], list[str | None]]:
        """(scores, failures) of one rule: ``failures[i]`` says why item i failed (it then scores
        ``on_error_score``), None where it did not. ``on_error=raise`` raises instead."""
        fields = fields or {}
        fn = self._fns.get(name) or self._fns.setdefault(name, get(name))
        n = len(completions)
        if is_plugin(name) and self.verifier.workers > 0:  # one item per call, each under the time limit
            spec, path = canonical(name), list(sys.path)
            load = [("rlvr.rewards.registry:load_rule", (spec, path))]  # imported once per worker, untimed
            calls = [
                (
                    "rlvr.rewards.registry:call_one",
                    (spec, completions[i], labels[i], {k: v[i] for k, v in fields.items()}, path),
                )
                for i in range(n)
            ]
            outcomes = self.verifier.pool().run(calls, self.verifier.timeout_s, setup=load)
            raw = [o.value if o.error is None else _Failed(o.error) for o in outcomes]
        else:
            with verify.using(self.verifier):  # built-in rules check math through this scorer's settings
                raw = self._call_in_process(name, fn, completions, labels, fields)
        scores, failures = [], []
        for i, value in enumerate(raw):
            value = _as_score(value)
            why = None
            if isinstance(value, _Failed):
                why = value.why
                self._report(name, why, completions[i], labels[i])
                value = self.on_error_score
            scores.append(value)
            failures.append(why)
        return scores, failures

    def _call_in_process(self, name, fn, completions, labels, fields) -> list:
        try:
            out = fn(completions, labels, **fields)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - find the item(s) that broke it
            if len(completions) == 1:
                return [_Failed(f"raised {type(e).__name__}: {e}")]
            return [
                self._call_in_process(name, fn, [c], [a], {k: [v[i]] for k, v in fields.items()})[0]
                for i, (c, a) in enumerate(zip(completions, labels))
            ]
        _check_length(name, out, len(completions))
        return list(out)

    def _report(self, name: str, why: str, completion: str, label) -> None:
        msg = f"reward rule '{name}' failed: {why}; completion={completion[-300:]!r} label={label!r}"
        if self.on_error is OnError.RAISE:
            raise RewardError(msg + " (reward.on_error=raise)")
        if name not in self._warned:
            self._warned.add(name)
            log.warning(
                "%s; scoring %g (reward.on_error_score); further failures are counted in reward/%s_errors",
                msg,
                self.on_error_score,
                name,
            )

    def score(
        self, completions: list[str], labels: list, fields: dict | None = None, truncated: list[bool] | None = None
    ) -> RewardResult:
        """Per-rule scores, weighted total and error counts for a batch.

        Args:
            completions: [B] decoded responses.
            labels: [B] gold answers.
            fields: extra row columns, name -> [B] values, passed to every rule as keywords.
            truncated: [B] whether each completion hit the length limit (for ``truncated_score``).
        """
        if len(completions) != len(labels):
            raise ValueError(f"{len(completions)} completions but {len(labels)} labels")
        per_rule, errors = {}, {}
        for name in self.rules:
            per_rule[name], errors[name] = self.rule_scores(name, completions, labels, fields)
        total = [sum(w * per_rule[r][i] for r, w in zip(self.rules, self.weights)) for i in range(len(completions))]
        if self.truncated_score is not None and truncated is not None:
            total = [self.truncated_score if t else s for s, t in zip(total, truncated)]
        return RewardResult(total=total, per_rule=per_rule, errors=errors)


def score(
    rules: list[str], weights: list[float] | None, completions: list[str], labels: list, **kwargs
) -> RewardResult:
    """One-shot :meth:`Scorer.score`; ``kwargs`` go to :class:`Scorer` (``fields``/``truncated`` to score)."""
    batch = {k: kwargs.pop(k) for k in ("fields", "truncated") if k in kwargs}
    return Scorer(rules, weights, **kwargs).score(completions, labels, **batch)
