"""Answer extraction and math equivalence: pure ``str -> str`` helpers, stdlib plus math_verify.

``math_verify`` (which pulls in sympy) is imported lazily, only when two answers are not
both plain numbers, so importing this module stays cheap.
"""

from __future__ import annotations

import math
import re
import threading
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?!\.?\d))?")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_TEXT = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{[^{}]*\}")
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), brace-balanced.

    Escaped braces ``\\{``/``\\}`` do not count. Returns None if there is no box or the
    last one is never closed (a truncated answer is not an answer).
    """
    starts = list(_BOXED.finditer(text))
    if not starts:
        return None
    i = starts[-1].end()
    depth, j = 1, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return text[i:j].strip()
        j += 1
    return None


def answer_tag(text: str) -> str | None:
    """Stripped content of the last ``<answer>...</answer>``; None if there is no closed pair."""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return None if start < 0 else text[start + len("<answer>") : end].strip()


def last_number(text: str) -> str | None:
    """Last number in ``text``: ``-3``, ``1,234`` (as ``1234``), ``2.5``, ``3/4``; None if none.

    A ``-`` counts as a sign only when not glued to a preceding word or digit, so "pages 3-4"
    gives "4", not "-4".
    """
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def extract_answer(text: str, *, fallback_last_number: bool = False) -> str | None:
    """The model's final answer, or None.

    Order: the last ``\\boxed{}`` inside ``<answer>`` if there is one, else the last
    ``\\boxed{}`` anywhere, else the ``<answer>`` content, else (only with
    ``fallback_last_number``) the last number in the text. Empty answers count as none.
    """
    tag = answer_tag(text)
    candidates = [last_boxed(tag) if tag is not None else None, last_boxed(text), tag]
    if fallback_last_number:
        candidates.append(last_number(text))
    return next((c for c in candidates if c), None)


def normalize_number(s: str) -> str | None:
    """Canonical string of a plain number, or None if ``s`` is not one.

    Strips ``$``, ``\\text{..}`` units, LaTeX spacing, a ``x =`` prefix, a trailing ``.``,
    and thousands commas; reads ``\\frac{a}{b}``/``a/b``/decimals through
    :class:`fractions.Fraction`, so ``0.5``, ``1/2`` and ``\\frac{1}{2}`` all give ``"1/2"``,
    ``5.0`` gives ``"5"`` and ``-0`` gives ``"0"``.
    """
    s = _TEXT.sub("", s).replace("{,}", ",")
    for junk in ("\\$", "$", "\\!", "\\,", "\\;", "\\ "):
        s = s.replace(junk, "")
    s = re.sub(r"(?<!\d)\s+|\s+(?!\d)", "", s)  # "1 2" stays two numbers, not 12
    s = re.sub(r"^[A-Za-z]=", "", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s).rstrip(".")
    parts = _FRAC.sub(r"\1/\2", s).split("/")
    if len(parts) > 2 or not all(_DECIMAL.fullmatch(p) for p in parts):
        return None
    try:
        return str(Fraction(parts[0]) / Fraction(parts[1] if len(parts) == 2 else 1))
    except ZeroDivisionError:
        return None


def _as_latex(s: str) -> str:
    # math_verify only extracts LaTeX from inside an anchor; "$..$" keeps plain prose
    # ("The answer is 5") parseable, where "\boxed{..}" would turn it into a product of letters.
    return s if "$" in s or "\\boxed" in s else f"${s}$"


def _math_verify(pred: str, gold: str, timeout: int | None) -> bool:
    import math_verify

    gold_p = math_verify.parse(_as_latex(gold), parsing_timeout=timeout)
    pred_p = math_verify.parse(_as_latex(pred), parsing_timeout=timeout)
    return bool(gold_p and pred_p and math_verify.verify(gold_p, pred_p, timeout_seconds=timeout))


def answers_match(pred: str, gold: str, *, timeout_s: float = 2.0) -> bool:
    """Whether ``pred`` equals ``gold``: exactly after :func:`normalize_number` when both are
    plain numbers, else by math_verify (symbolic equivalence).

    Time limit: on the main thread math_verify's own ``signal.alarm`` timeouts are used,
    rounded up to whole seconds and applied per parse/compare (so the worst case is a few
    times ``timeout_s``). ``signal`` only works on the main thread, so elsewhere the call runs
    in a daemon thread that is abandoned after ``timeout_s``. A timeout or any exception
    gives False.
    """
    pred, gold = pred.strip(), gold.strip()
    if not pred or not gold:
        return False
    np_, ng = normalize_number(pred), normalize_number(gold)
    if np_ is not None and ng is not None:
        return np_ == ng
    try:
        if threading.current_thread() is threading.main_thread():
            return _math_verify(pred, gold, max(1, math.ceil(timeout_s)))
        out: list[bool] = []
        run = lambda: out.append(_math_verify(pred, gold, None))  # noqa: E731
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout_s)
        return bool(out and out[0])
    except Exception:  # noqa: BLE001 - a verifier crash must never stop training
        return False
