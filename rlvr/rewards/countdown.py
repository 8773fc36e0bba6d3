"""The countdown task's checker: reach a target with the given numbers and ``+ - * /``, each
number used exactly once (TinyZero's task). Model text is checked by walking its Python AST:
only integers, the four operators, parentheses and unary minus are accepted; nothing is ever
passed to ``eval()``. Stdlib only.
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

from rlvr.rewards.extract import last_boxed

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def safe_arithmetic(expr: str) -> tuple[Fraction, list[int]] | None:
    """Exact value of an arithmetic expression and the integers it uses, or None if it is not one.

    Accepts integers, ``+ - * /`` (also ``×``, ``÷``), parentheses and unary minus, by walking the
    parsed AST; anything else (names, calls, powers, floats, attributes) gives None. Division is
    exact (fractions); division by zero gives None. Never calls ``eval``.
    """
    expr = expr.replace("×", "*").replace("÷", "/").replace("\\times", "*").replace("\\div", "/").strip()
    if not expr or len(expr) > 200:  # bounds the work on adversarial text
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError):
        return None
    used: list[int] = []

    def walk(node) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ZeroDivisionError
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(f"not allowed: {type(node).__name__}")

    try:
        return walk(tree.body), used
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


def _countdown_expression(completion: str) -> str | None:
    """The expression a completion commits to: the last ``<answer>`` content, else the last ``\\boxed{}``."""
    tags = re.findall(r"<answer>(.*?)</answer>", completion, re.DOTALL)
    text = tags[-1] if tags else last_boxed(completion)
    if text is None:
        return None
    boxed = last_boxed(text)
    text = boxed if boxed is not None else text
    return text.split("=")[0].strip()  # "3 + 4 = 7" -> "3 + 4"


def countdown_expression_ok(expr: str | None, target: int | str, numbers: list[int]) -> bool:
    """Whether ``expr`` (text after an ``=`` ignored) uses each of ``numbers`` exactly once and
    equals ``target`` exactly. A bare number is never enough: it uses no numbers."""
    parsed = safe_arithmetic(expr.split("=")[0]) if expr else None
    if parsed is None:
        return False
    value, used = parsed
    return sorted(used) == sorted(int(n) for n in numbers) and value == Fraction(int(target))


def countdown_score(completion: str, target: int | str, numbers: list[int]) -> float:
    """1.0 if the completion's answer is an expression that uses each of ``numbers`` exactly once
    and equals ``target`` exactly, else 0.0. The answer is the last ``<answer>…</answer>``
    (else the last ``\\boxed{}``); text after an ``=`` is ignored."""
    return float(countdown_expression_ok(_countdown_expression(completion), target, numbers))


def countdown_numbers(n: int, fields: dict) -> list[list[int] | None]:
    """Per item, the countdown ``numbers`` of its row, or None for a row of another task.

    Rules get a row's extra values either as their own keyword (``numbers=[...]``, as in
    ``rlvr reward score``) or inside the row's ``fields`` dict (``fields=[{"numbers": ...}]``,
    as the trainer and evaluation pass built-in task rows)."""
    direct = fields.get("numbers")
    nested = fields.get("fields")
    out: list[list[int] | None] = []
    for i in range(n):
        nums = direct[i] if isinstance(direct, (list, tuple)) and i < len(direct) else None
        if nums is None and isinstance(nested, (list, tuple)) and i < len(nested) and isinstance(nested[i], dict):
            nums = nested[i].get("numbers")
        out.append(list(nums) if isinstance(nums, (list, tuple)) and nums else None)
    return out


def countdown_reward(completions: list[str], labels: list, **fields) -> list[float]:
    """Countdown: 1 if the <answer> (else last \\boxed{}) expression uses each of the row's numbers once and \
equals the target, else 0.

    Batch form of :func:`countdown_score` (the ``countdown`` rule): ``labels[i]`` is the target,
    the numbers come from ``numbers=[...]`` or the rows' ``fields`` (see :func:`countdown_numbers`).
    An item without numbers scores 0."""
    nums = countdown_numbers(len(completions), fields)
    return [countdown_score(c, t, n) if n else 0.0 for c, t, n in zip(completions, labels, nums)]
