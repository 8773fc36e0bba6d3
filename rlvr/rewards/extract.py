"""Answer extraction and number normalisation: pure ``str -> str`` helpers, stdlib only.

Equivalence of two extracted answers lives in :mod:`rlvr.rewards.verify`.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import NamedTuple

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER = re.compile(r"(?:(?<![\w)])[-\u2212])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?!\.?\d))?")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_TEXT = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{[^{}]*\}")
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_GSM8K = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(r"answer is[:\s]*\$?([^\n$]+?)\$?\s*(?:\.\s|\.?$|\n)", re.IGNORECASE)
_MINERVA = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_UNIT_WORDS = re.compile(r"(?<=[\d}])\s+(?!pi\b)[A-Za-z]{2,}(?:\s+[A-Za-z]{2,}){0,2}(?:\^\{?[23]\}?)?\.?$")
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
        found = [
            m
            for m in found
            if not (_OPERATOR_BEFORE.search(text, 0, m.start()) or _OPERATOR_AFTER.match(text, m.end()))
        ]
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


class Number(NamedTuple):
    """A number as an answer writes it: its exact value and how it was written."""

    value: Fraction
    decimal: bool
    """Written with a decimal point or in e-notation: compared to 6 decimal places, as math-verify compares floats."""
    percent: bool
    """Written as a percentage (``25\\%``): it also equals its value / 100."""


_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree|\\textdegree|\u00b0")
_TEXT_UNIT = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{[^{}]*\}(?:\s*\^\s*\{?\s*[23]\s*\}?)?")
_CURRENCY = re.compile(r"^(?:\\\$|\$|\u20ac|\u00a3|\u00a5|\\euro|\\pounds)")
_PERCENT = re.compile(r"\s*(?:\\?%|percent)\s*\.?$")
_SCI_TIMES = re.compile(r"(.+?)(?:\\times|\\cdot|\u00d7|\*)10\^\{?([+-]?\d{1,3})\}?")
_SCI_E = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))[eE]([+-]?\d{1,3})")
MAX_DIGITS = 4000
"""Longer number strings are not read (Python refuses int() of > 4300 digits): no gold is that long."""


def number_value(s: str) -> Number | None:
    """The :class:`Number` that ``s`` writes, or None if ``s`` is not a number literal.

    A literal is one number, however it is written: ``7``, ``-7`` (also with a unicode minus),
    ``1,234`` / ``1{,}234``, ``7.50``, ``1/2`` (no spaces around the slash: ``1 / 2`` is a division),
    ``\\frac{1}{2}`` (``\\dfrac``, ``\\tfrac``), ``1.5 \\times 10^{3}``, ``2.5e-3``, a leading currency
    sign (``$``, ``\\$``, ``€``, ``£``, ``¥``), a trailing percentage (``25\\%``), a trailing degree
    sign (``90^\\circ``, ``45^{\\circ}``, ``90°``), trailing units (``\\text{ cm}^2``, up to three unit
    words: ``18 dollars``, ``5 km per hour``; not ``pi``, not one letter such as ``3 x``), LaTeX
    spacing, an ``x =`` prefix and a final period. Arithmetic (``3 + 4``, ``2 \\times 3``, ``2^3``,
    ``\\sqrt{9}``) is not a literal.
    """
    if len(s) > MAX_DIGITS:
        return None
    s, pct = _PERCENT.subn("", s)
    s = _TEXT_UNIT.sub("", s).replace("{,}", ",").replace(MINUS, "-")
    s = _DEGREE.sub("", s)
    for junk in ("\\!", "\\,", "\\;", "\\ ", "\\left", "\\right"):
        s = s.replace(junk, "")
    s = _UNIT_WORDS.sub("", s.strip())
    if re.search(r"\s/|/\s", s):  # "12 / 4": a division to evaluate, not the fraction 12/4
        return None
    s = re.sub(r"(?<!\d)\s+|\s+(?!\d)", "", s)  # "1 2" stays two numbers, not 12
    s = re.sub(r"^[A-Za-z]=", "", s)
    s = s.replace("$", "") if s.count("$") == 2 and s[0] == s[-1] == "$" else s  # "$7$": inline math
    sign = "-" if s.startswith("-") and _CURRENCY.match(s[1:]) else ""  # "-$5"
    s = sign + _CURRENCY.sub("", s[len(sign) :])
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s).rstrip(".")
    scale, decimal = Fraction(1), False
    sci = _SCI_TIMES.fullmatch(s) or _SCI_E.fullmatch(s)
    if sci:
        s, scale, decimal = sci.group(1), Fraction(10) ** int(sci.group(2)), sci.re is _SCI_E
    parts = _FRAC.sub(r"\1/\2", s).split("/")
    if len(parts) > 2 or not all(_DECIMAL.fullmatch(p) for p in parts):
        return None
    try:
        value = Fraction(parts[0]) / Fraction(parts[1] if len(parts) == 2 else 1) * scale
    except (ZeroDivisionError, ValueError):  # ValueError: more digits than int() reads
        return None
    return Number(value, decimal or "." in s, bool(pct))


def normalize_number(s: str) -> str | None:
    """Canonical string of a number literal that is not a percentage (:func:`number_value`), or None:
    ``0.5``, ``1/2`` and ``\\frac{1}{2}`` all give ``"1/2"``, ``5.0`` gives ``"5"``, ``-0`` gives ``"0"``."""
    n = number_value(s)
    return None if n is None or n.percent else str(n.value)


_RESULT = re.compile(r"(?<![<>!\\])=")
_RELATION_BEFORE = re.compile(r"(?:[<>\u2264\u2265\u2260\u2248]=?|\\(?:geq?|leq?|neq?|ne|lt|gt|approx|sim))\s*$")
_SENTENCE_PERCENT = re.compile(r"\s*(?:\\?%|percent\b)")


def denoted_number(answer: str) -> Number | None:
    """The number an extracted answer denotes, or None: **the rule for numeric gold answers**.

    1. Only what follows the last ``=`` is the answer: ``3 + 4 = 7`` states 7, and work shown before
       the final answer is never judged.
    2. A number literal (:func:`~rlvr.rewards.extract.number_value`) denotes its value, however it
       is written: ``1,234``, ``7.50``, ``\\frac{1}{2}``, ``1/2``, ``1.5 \\times 10^{3}``, ``2.5e-3``,
       ``\\$18``, ``25\\%``, ``90^\\circ``, ``5\\text{ cm}``, ``18 dollars``, ``x = 7``.
    3. Otherwise it is an answer sentence (``The answer is 18.``), which denotes its final number,
       unless that number is an operand of arithmetic (an operator beside it: ``+ - * / ^``,
       ``\\times``, ``\\cdot``, ``\\div``). So an expression left to evaluate (``3 + 4``, ``14 - 7``,
       ``2 \\times 3``, ``2^3``, ``12 / 4``, the question copied) denotes nothing, whatever its value;
       so do ``\\sqrt{9}`` and a bound (``x \\geq 7``, ``x < 7``, ``\\approx 7``).
    """
    tail = _RESULT.split(answer)[-1]
    n = number_value(tail)
    if n is not None or len(tail) > MAX_DIGITS:
        return n
    # an answer sentence: \frac{a}{b} read as a/b, braces dropped so "2^{3}" shows its operator
    text = _FRAC.sub(r"\1/\2", _DEGREE.sub("", tail)).replace("{,}", ",").replace("{", "").replace("}", "")
    found = [
        m
        for m in _NUMBER.finditer(text)
        if not (
            _OPERATOR_BEFORE.search(text, 0, m.start())
            or _OPERATOR_AFTER.match(text, m.end())
            or _RELATION_BEFORE.search(text, 0, m.start())
        )
    ]
    if not found:
        return None
    last = found[-1]
    pct = "%" if _SENTENCE_PERCENT.match(text, last.end()) else ""
    return number_value(last.group() + pct)


def number_key(answer: str) -> str | None:
    """A string equal for answers that denote the same exact number (:func:`denoted_number`), for
    majority votes and comparisons of answers with each other; None if it denotes none."""
    n = denoted_number(answer)
    return None if n is None else str(n.value) + ("%" if n.percent else "")


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
