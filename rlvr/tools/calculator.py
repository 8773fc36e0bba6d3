"""The ``calculator`` tool: exact arithmetic on a parsed expression tree, never ``eval``.

Numbers (integers and decimals, read exactly as fractions), ``+ - * /`` (also ``×`` and ``÷``),
parentheses, unary minus and plus, and powers (``**`` or ``^``) with an integer exponent; text from
an ``=`` on is ignored (small models write ``37 * 58 =``). The
value is exact (Python integers and :class:`fractions.Fraction`): an integer prints as one, any
other value as ``p/q``. Every hostile input ends fast with a :class:`ToolError`: the text is at
most :data:`MAX_CHARS` characters and :data:`MAX_DEPTH` levels deep, and no value (an operand, an
intermediate, the result) may have a numerator or denominator of more than :data:`MAX_BITS` bits;
a power is refused *before* it is computed when its result would exceed that, so ``9**9**9``
costs nothing, and so is a literal's decimal exponent (``1e999999999``).
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

from rlvr.tools.errors import ToolError

MAX_CHARS = 200
"""Longest expression accepted (characters)."""
MAX_DEPTH = 32
"""Deepest expression tree accepted (operators and parentheses nested)."""
MAX_BITS = 512
"""Largest numerator or denominator of any value, in bits (about 154 decimal digits)."""
_MAX_EXPONENT = 200
"""Largest decimal exponent of a literal (``1e200``), checked on the text before ``Fraction`` builds
10**exponent: ``1e999999999`` (11 characters) would otherwise compute for minutes."""

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_SPELLINGS = (("×", "*"), ("÷", "/"), ("−", "-"), ("^", "**"), ("\\times", "*"), ("\\div", "/"), (",", ""))


def calculator(args: str) -> str:
    """The exact value of an arithmetic expression, e.g. ``calculator("37*58") == "2146"``.

    Raises:
        ToolError: not an arithmetic expression, too long, too deep, too large, or a division by zero.
    """
    expr = args.split("=")[0].strip()  # "37 * 58 =" and "37*58 = 2146" ask for 37 * 58
    for spelled, op in _SPELLINGS:
        expr = expr.replace(spelled, op)
    if not expr:
        raise ToolError("empty expression")
    if len(expr) > MAX_CHARS:
        raise ToolError(f"expression longer than {MAX_CHARS} characters")
    if expr.count("(") > MAX_DEPTH:  # the parser itself recurses on nesting: refuse before it runs
        raise ToolError(f"more than {MAX_DEPTH} parentheses")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError(f"not an arithmetic expression: {args.strip()[:60]!r}") from None
    value = _eval(tree.body, expr, 0)
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _check(value: Fraction) -> Fraction:
    if max(abs(value.numerator).bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise ToolError(f"a value exceeds {MAX_BITS} bits")
    return value


def _eval(node: ast.AST, source: str, depth: int) -> Fraction:
    if depth > MAX_DEPTH:
        raise ToolError(f"expression nested deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        text = (ast.get_source_segment(source, node) or repr(node.value)).replace("_", "")
        mantissa, e, exponent = text.lower().partition("e")
        if e and (not exponent.lstrip("+-").isdigit() or abs(int(exponent)) > _MAX_EXPONENT):
            raise ToolError(f"a value exceeds {MAX_BITS} bits")  # before Fraction computes 10**exponent
        try:
            return _check(Fraction(text))  # exactly as written: 0.1 is 1/10
        except ValueError:
            raise ToolError(f"not a number: {text[:40]!r}") from None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand, source, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_eval(node.left, source, depth + 1), _eval(node.right, source, depth + 1))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, source, depth + 1), _eval(node.right, source, depth + 1)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ToolError("division by zero")
        return _check(_BINARY[type(node.op)](left, right))
    raise ToolError(f"not allowed in an arithmetic expression: {type(node).__name__}")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """base ** exponent for an integer exponent, refused before computing when too large."""
    if exponent.denominator != 1:
        raise ToolError("only integer exponents")
    e = abs(exponent.numerator)
    if base == 0 and exponent < 0:
        raise ToolError("division by zero")
    if base in (0, 1, -1):
        return base**exponent.numerator
    bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length())
    if (bits - 1) * e > MAX_BITS:  # |result| >= 2**((bits-1)*e): too large, whatever it is exactly
        raise ToolError(f"a value exceeds {MAX_BITS} bits")
    return _check(base**exponent.numerator)
