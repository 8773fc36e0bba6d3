"""Answer extraction and number normalisation: pure ``str -> str`` helpers, stdlib only.

Equivalence of two extracted answers lives in :mod:`rlvr.rewards.verify`.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER = re.compile(r"(?:(?<![\w)])[-\u2212])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?!\.?\d))?")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_TEXT = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{[^{}]*\}")
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_GSM8K = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(r"answer is[:\s]*\$?([^\n$]+?)\$?\s*(?:\.\s|\.?$|\n)", re.IGNORECASE)
_MINERVA = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_UNIT_WORDS = re.compile(r"(?<=[\d}])\s+(?!pi\b)[A-Za-z]{2,}(?:\s+[A-Za-z]{2,}){0,2}\.?$")
_OPS = r"(?:[-+*/^\u00d7\u00f7\u2212\u22c5]|\\times|\\cdot|\\div)"
_OPERATOR_BEFORE = re.compile(_OPS + r"\s*$")
_OPERATOR_AFTER = re.compile(r"\s*" + _OPS)
MINUS = "\u2212"  # unicode minus sign, common in model output copied from rendered math


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


def last_number(text: str, *, standalone: bool = False) -> str | None:
    """Last number in ``text``: ``-3``, ``1,234`` (as ``1234``), ``2.5``, ``3/4``; None if none.

    A ``-`` counts as a sign only when not glued to a preceding word or digit, so "pages 3-4"
    gives "4", not "-4". With ``standalone``, numbers that are operands of arithmetic (next to
    ``+ - * / × ÷ ^``, ``\\times``, ``\\cdot``, ``\\div``) are skipped: "14 - 7 = 7" gives the
    final 7, but the question "What is 14 - 7?" copied gives None, not 7.
    """
    found = list(_NUMBER.finditer(text))
    if standalone:
        found = [m for m in found if not (_OPERATOR_BEFORE.search(text, 0, m.start()) or _OPERATOR_AFTER.match(text, m.end()))]
    return found[-1].group().replace(",", "").replace(MINUS, "-") if found else None


def extract_answer(text: str, *, fallback_last_number: bool = False) -> str | None:
    """The model's final answer, or None.

    Order: the last ``\\boxed{}`` inside ``<answer>`` if there is one, else the last
    ``\\boxed{}`` anywhere, else the ``<answer>`` content, else (only with
    ``fallback_last_number``) the last number in the text that is not an operand of arithmetic
    (see :func:`last_number`). Empty answers count as none.
    """
    tag = answer_tag(text)
    candidates = [last_boxed(tag) if tag is not None else None, last_boxed(text), tag]
    if fallback_last_number:
        candidates.append(last_number(text, standalone=True))
    return next((c for c in candidates if c), None)


def normalize_number(s: str) -> str | None:
    """Canonical string of a plain number, or None if ``s`` is not one.

    Strips ``$``, ``\\text{..}`` units, up to three unit words after the number (``18 dollars``,
    ``5 km per hour``; not ``pi``, not single letters like ``3 x``), LaTeX spacing, a ``x =``
    prefix, a trailing ``.``, and thousands commas; reads ``\\frac{a}{b}``/``a/b``/decimals through
    :class:`fractions.Fraction`, so ``0.5``, ``1/2`` and ``\\frac{1}{2}`` all give ``"1/2"``,
    ``5.0`` gives ``"5"`` and ``-0`` gives ``"0"``.
    """
    s = _TEXT.sub("", s).replace("{,}", ",").replace(MINUS, "-")
    for junk in ("\\$", "$", "\\!", "\\,", "\\;", "\\ "):
        s = s.replace(junk, "")
    s = _UNIT_WORDS.sub("", s.strip())
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


def _last(pattern: re.Pattern, text: str) -> str | None:
    found = pattern.findall(text)
    return found[-1].strip() or None if found else None


def gsm8k_answer(text: str) -> str | None:
    """The text after the last GSM8K ``#### `` marker (thousands commas dropped); None if none."""
    ans = _last(_GSM8K, text)
    return re.sub(r"(?<=\d),(?=\d{3})", "", ans) if ans else None


def answer_is(text: str) -> str | None:
    """What follows the last "the answer is" (``$`` and a final period stripped); None if none."""
    return _last(_ANSWER_IS, text)


def minerva_answer(text: str) -> str | None:
    """The rest of the line after the last Minerva-style ``Answer:``; None if none."""
    return _last(_MINERVA, text)


def gold_answer(label: object) -> str:
    """The gold answer string of a dataset label, as the accuracy rules compare it.

    GSM8K solutions (``"... #### 1,234"``) give the part after ``####`` without commas; a
    full solution with a ``\\boxed{}`` (MATH) gives the boxed content; ``$..$`` around the
    whole label is dropped. Plain answers pass through unchanged (the function is idempotent).
    """
    text = str(label).strip()
    ans = gsm8k_answer(text) if "####" in text else last_boxed(text) or text
    if len(ans) > 1 and ans[0] == ans[-1] == "$":
        ans = ans[1:-1].strip()
    return ans
