"""Answer equivalence: a cheap exact/numeric check first, math-verify (sympy) only when needed.

Batches go through :func:`match_many`: pairs whose gold answer is a number literal are decided
here in microseconds (the prediction must be a number literal too, see :func:`numeric_match`);
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
import re
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace
from fractions import Fraction

from rlvr.rewards.extract import normalize_number
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


_PERCENT = re.compile(r"\s*(?:\\?%|percent)\s*\.?$")
_SCI = re.compile(r"(.+?)\s*(?:\\times|\\cdot|\u00d7|\*)\s*10\s*\^\s*\{?\s*([+-]?\d{1,3})\s*\}?")
_RESULT = re.compile(r"(?<![<>!\\])=")


def number_literal(s: str) -> tuple[Fraction, bool] | None:
    """(value, written as a percentage) of a number literal; None if ``s`` is anything else.

    A literal is what :func:`normalize_number` reads (``7``, ``-7``, ``7.0``, ``1,000``, ``$7``,
    ``7 apples``, ``x = 7``, ``1/2``, ``\\frac{1}{2}``), a percentage (``50\\%``) or scientific
    notation (``1.5 \\times 10^{3}``). Arithmetic (``3 + 4``, ``3 \\times 4``, ``\\sqrt{9}``) is not.
    """
    s, pct = _PERCENT.subn("", s)
    n = normalize_number(s)
    if n is not None:
        return Fraction(n), bool(pct)
    sci = _SCI.fullmatch(s.replace("$", "").strip())
    mantissa = normalize_number(sci.group(1)) if sci else None
    if mantissa is None:
        return None
    return Fraction(mantissa) * Fraction(10) ** int(sci.group(2)), bool(pct)


def numeric_match(pred: str, gold: str) -> bool | None:
    """Exact comparison when the gold answer is a number literal (see :func:`number_literal`);
    None when it is not, for math-verify to decide.

    A number asks for a number: the prediction must be a literal too (after the last ``=``, so
    ``3 + 4 = 7`` states 7), else it is wrong. Arithmetic in the prediction is never evaluated, so
    ``3 + 4`` (the question copied) does not match ``7`` (math-verify would accept it). A
    percentage matches its number or its fraction (``25\\%`` == ``25`` == ``0.25``), as in math-verify.
    """
    b = number_literal(gold)
    if b is None:
        return None
    a = number_literal(_RESULT.split(pred)[-1])
    if a is None:
        return False
    (x, x_pct), (y, y_pct) = a, b
    return x == y or (x_pct and x / 100 == y) or (y_pct and y / 100 == x)


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
