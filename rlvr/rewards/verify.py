"""Answer equivalence: a cheap exact/numeric check first, math-verify (sympy) only when needed.

Batches go through :func:`match_many`: pairs whose gold answer is a number literal are decided
here in microseconds (the prediction must denote a number, see :func:`numeric_match` and
:func:`~rlvr.rewards.extract.denoted_number`, the one rule for numeric answers);
the rest (LaTeX, expressions, sets, intervals, equations) are deduplicated and sent
to a persistent :class:`~rlvr.rewards.pool.WorkerPool`, where each pair has a hard time limit.
``math_verify`` (which pulls in sympy) is never imported by the trainer process when workers > 0.
The time limit and the worker count come from the :class:`Verifier` in effect: a Scorer's own
while it scores (:func:`using`), else the default one (:func:`configure`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace

from rlvr.rewards.extract import Number, denoted_number, number_value
from rlvr.rewards.pool import WorkerPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verifier:
    """Where math-verify runs and under what time limit: the settings of one :class:`Scorer`.

    A :class:`~rlvr.rewards.registry.Scorer` owns one (from ``reward.timeout_s`` and
    ``reward.workers``) and runs its rules under it (:func:`using`), so two scorers with different
    settings never change each other's. Outside any scorer, :func:`match_many` uses the default
    verifier that :func:`configure` sets.
    """

    timeout_s: float = 2.0
    """Hard time limit per math-verify comparison (seconds)."""
    workers: int = 2
    """Worker processes; 0 = compare in this process with math-verify's own signal timeouts."""

    def pool(self) -> WorkerPool:
        """The shared worker pool with this many workers (see :func:`_shared_pool`)."""
        return _shared_pool(self.workers)


_default = Verifier()
_active: ContextVar[Verifier | None] = ContextVar("rlvr_verifier", default=None)
_pool: WorkerPool | None = None
_pool_lock = threading.Lock()


def configure(*, timeout_s: float | None = None, workers: int | None = None) -> None:
    """Change the default verifier, used by :func:`match_many` outside any :class:`Scorer`
    (a Scorer uses its own settings)."""
    global _default
    _default = replace(
        _default,
        timeout_s=_default.timeout_s if timeout_s is None else timeout_s,
        workers=_default.workers if workers is None else workers,
    )


@contextlib.contextmanager
def using(verifier: Verifier) -> Iterator[None]:
    """Within this block (in this thread or task), :func:`match_many` checks with ``verifier``."""
    token = _active.set(verifier)
    try:
        yield
    finally:
        _active.reset(token)


def active() -> Verifier:
    """The verifier :func:`match_many` uses now: the one of the enclosing :func:`using`, else the default."""
    return _active.get() or _default


def _shared_pool(workers: int) -> WorkerPool:
    """The one worker pool of this process, started (and every worker warmed up) on first use.
    Starting one costs seconds, so scorers with the same worker count share it; a request for
    another count stops it and starts one of that size."""
    global _pool
    size = max(1, workers)
    with _pool_lock:
        if _pool is not None and len(_pool.pids) != size:
            _pool.close()
            _pool = None
        if _pool is None:
            _pool = WorkerPool(size, preload=("rlvr.rewards._warm",), setup=(("rlvr.rewards._warm:warm_up", ()),))
        return _pool


def pool() -> WorkerPool:
    """The worker pool of the :func:`active` verifier."""
    return active().pool()


def shutdown() -> None:
    """Stop the shared pool's workers (also done at interpreter exit)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.close()
            _pool = None


FLOAT_ROUNDING = 6
"""Decimal places to which a number written with a decimal point is compared: math-verify's
``float_rounding`` default, so ``1/3`` equals ``0.3333333333`` and ``0.333333`` but not ``0.33``."""


def same_number(a: Number, b: Number) -> bool:
    """Whether two numbers are equal: exactly, or to :data:`FLOAT_ROUNDING` decimal places when either
    was written with a decimal point; a percentage also equals its value / 100 (as in math-verify)."""
    for x, y in (
        (a.value, b.value),
        (a.value / 100 if a.percent else None, b.value),
        (a.value, b.value / 100 if b.percent else None),
    ):
        if y is None or x is None:
            continue
        if x == y or ((a.decimal or b.decimal) and round(x, FLOAT_ROUNDING) == round(y, FLOAT_ROUNDING)):
            return True
    return False


def numeric_match(pred: str, gold: str) -> bool | None:
    """Whether ``pred`` denotes the gold number, when the gold answer is a number literal
    (:func:`~rlvr.rewards.extract.number_value`); None when it is not, for math-verify to decide.

    A number asks for a number: the prediction is right when :func:`denoted_number` gives a number
    :func:`same_number` as the gold, and wrong otherwise (a different number, one too coarse such as
    ``0.3`` for 1/3, an expression to evaluate, or no number). math-verify is never asked, since it
    would evaluate ``3 + 4`` and pay the copied question.
    """
    b = number_value(gold)
    if b is None:
        return None
    a = denoted_number(pred)
    return a is not None and same_number(a, b)


def _as_latex(s: str) -> str:
    # math_verify only extracts LaTeX from inside an anchor; "$..$" keeps plain prose
    # ("The answer is 5") parseable, where "\boxed{..}" would turn it into a product of letters.
    return s if "$" in s or "\\boxed" in s else f"${s}$"


def math_verify_match(pred: str, gold: str, timeout: int | None = None) -> bool:
    """math-verify's ``verify(parse(gold), parse(pred))``; ``timeout`` = its own signal-based limit
    (main thread only); None inside pool workers, where the parent enforces the limit by killing."""
    import math_verify  # here, not at the top: sympy takes seconds, and pool workers load it, not the trainer

    gold_p = math_verify.parse(_as_latex(gold), parsing_timeout=timeout)
    pred_p = math_verify.parse(_as_latex(pred), parsing_timeout=timeout)
    return bool(gold_p and pred_p and math_verify.verify(gold_p, pred_p, timeout_seconds=timeout))


def answers_match(pred: str, gold: str, *, timeout_s: float = 2.0) -> bool:
    """Whether ``pred`` equals ``gold``, in this process: :func:`numeric_match`, else math-verify.

    Time limit: on the main thread math-verify's own ``signal.alarm`` timeouts are used,
    rounded up to whole seconds and applied per parse/compare (so the worst case is a few
    times ``timeout_s``). ``signal`` only works on the main thread, so elsewhere the call runs
    in a daemon thread that is abandoned after ``timeout_s``. A timeout or any exception
    gives False. For batches, :func:`match_many` is faster and has a hard limit.
    """
    pred, gold = pred.strip(), gold.strip()
    if not pred or not gold:
        return False
    cheap = numeric_match(pred, gold)
    if cheap is not None:
        return cheap
    try:
        if threading.current_thread() is threading.main_thread():
            return math_verify_match(pred, gold, max(1, math.ceil(timeout_s)))
        out: list[bool] = []
        worker = threading.Thread(target=lambda: out.append(math_verify_match(pred, gold)), daemon=True)
        worker.start()
        worker.join(timeout_s)
        return bool(out and out[0])
    except Exception:  # noqa: BLE001 - a verifier crash must never stop training
        return False


def match_many(pairs: list[tuple[str, str]]) -> list[float]:
    """1.0 / 0.0 per (pred, gold) pair, or NaN where math-verify timed out or crashed.

    Empty strings never match. Numeric pairs are decided in this process; the distinct
    remaining pairs run in the :func:`active` verifier's pool under its ``timeout_s`` each (or in
    this process with :func:`answers_match` when its ``workers == 0``).
    """
    out: list[float] = [0.0] * len(pairs)
    todo: dict[tuple[str, str], list[int]] = {}
    for i, (pred, gold) in enumerate(pairs):
        pred, gold = pred.strip(), gold.strip()
        if not pred or not gold:
            continue
        cheap = numeric_match(pred, gold)
        if cheap is None:
            todo.setdefault((pred, gold), []).append(i)
        else:
            out[i] = float(cheap)
    if not todo:
        return out
    verifier = active()
    if verifier.workers == 0:
        values = [float(answers_match(p, g, timeout_s=verifier.timeout_s)) for p, g in todo]
    else:
        calls = [("rlvr.rewards._warm:verify_in_worker", pair) for pair in todo]
        values = []
        for (pred, gold), res in zip(todo, verifier.pool().run(calls, verifier.timeout_s)):
            if res.error is not None:
                log.debug("math-verify failed on pred=%r gold=%r: %s", pred[:200], gold[:200], res.error)
            values.append(float(res.value) if res.error is None else math.nan)
    for idx, value in zip(todo.values(), values):
        for i in idx:
            out[i] = value
    return out
