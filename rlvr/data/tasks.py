"""Built-in offline tasks: seeded generators of problems with exact answers, and the safe
countdown checker (an AST walk over the model's expression, never ``eval``)."""

from __future__ import annotations

import ast
import operator
import random
import re
from fractions import Fraction


def _problem(rng: random.Random, difficulty: int) -> tuple[str, int]:
    if difficulty == 1:  # single-digit addition
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return f"{a} + {b}", a + b
    if difficulty == 2:  # addition / subtraction up to 20
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        return (f"{a} + {b}", a + b) if rng.random() < 0.5 else (f"{max(a, b)} - {min(a, b)}", abs(a - b))
    if difficulty == 3:  # two-digit products and a - b + c
        if rng.random() < 0.5:
            a, b = rng.randint(2, 12), rng.randint(2, 12)
            return f"{a} * {b}", a * b
        a, b, c = rng.randint(10, 99), rng.randint(1, 50), rng.randint(1, 50)
        return f"{a} - {b} + {c}", a - b + c
    a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)  # difficulty 4
    op = rng.choice(["+", "-", "*"])
    expr = f"{a} {op} {b} * {c}" if op != "*" else f"{a} * {c} + {b}"
    return expr, eval(expr)  # noqa: S307 - expr is built above from integers and + - *


def arithmetic(n: int, *, seed: int, difficulty: int = 1, exclude: set[str] = frozenset()) -> list[dict]:
    """``n`` arithmetic problems ``{"question", "answer"}`` from a seeded generator.

    Args:
        n: number of problems (with difficulty 1 there are only 81 distinct ones; they repeat).
        seed: generator seed; train and test use different seeds.
        difficulty: 1..4, see ``DataConfig.difficulty``.
        exclude: questions to skip (used to keep test problems out of train when possible).
    """
    rng = random.Random(seed)
    rows = []
    attempts = 0
    while len(rows) < n:
        expr, value = _problem(rng, difficulty)
        question = f"What is {expr}?"
        attempts += 1
        if question in exclude and attempts < 50 * n:
            continue
        rows.append({"question": question, "answer": str(value)})
    return rows


# --- countdown -------------------------------------------------------------------------------
# Reach a target with the given numbers and + - * /, each number used exactly once
# (TinyZero's task). Model text is checked by walking its Python AST: only numbers, the four
# operators, parentheses and unary minus are accepted; nothing is ever passed to eval().

COUNTDOWN_SHAPES = {1: (3, 10), 2: (3, 25), 3: (4, 50), 4: (5, 100)}
"""difficulty -> (how many numbers, largest number)."""

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _countdown_problem(rng: random.Random, difficulty: int) -> tuple[list[int], int, str]:
    count, largest = COUNTDOWN_SHAPES[difficulty]
    while True:
        numbers = [rng.randint(1, largest) for _ in range(count)]
        items = [(Fraction(n), str(n)) for n in numbers]
        while len(items) > 1:  # combine two random items until one expression is left
            (a, ea), (b, eb) = (items.pop(rng.randrange(len(items))) for _ in range(2))
            op = rng.choice(["+", "-", "*", "/"])
            if op == "-" and a < b:
                (a, ea), (b, eb) = (b, eb), (a, ea)
            if op == "/" and (b == 0 or (a / b).denominator != 1):
                op = "+"
            value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op]
            items.append((value, f"({ea} {op} {eb})"))
        value, expr = items[0]
        if value.denominator == 1 and 1 <= value <= 10 * largest:
            return numbers, int(value), expr[1:-1] if expr.startswith("(") else expr


def countdown_question(numbers: list[int], target: int) -> str:
    """The user-facing countdown problem text."""
    return (
        f"Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
        "operations (+, -, *, /) and each number must be used exactly once."
    )


def countdown(n: int, *, seed: int, difficulty: int = 1) -> list[dict]:
    """``n`` countdown problems from a seeded generator; every one has a solution by construction.

    Rows are ``{"question", "answer", "fields"}`` with ``answer`` the target as a string and
    ``fields = {"numbers": [...], "target": int, "solution": "one valid expression"}``; score
    completions with :func:`countdown_score` (the numbers are needed, not just the target).

    Args:
        n: number of problems.
        seed: generator seed; train and test use different seeds.
        difficulty: 1..4, see :data:`COUNTDOWN_SHAPES` (3 numbers up to 10 ... 5 numbers up to 100).
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        numbers, target, solution = _countdown_problem(rng, difficulty)
        fields = {"numbers": numbers, "target": target, "solution": solution}
        rows.append({"question": countdown_question(numbers, target), "answer": str(target), "fields": fields})
    return rows


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


def countdown_score(completion: str, target: int | str, numbers: list[int]) -> float:
    """1.0 if the completion's answer is an expression that uses each of ``numbers`` exactly once
    and equals ``target`` exactly, else 0.0. The answer is the last ``<answer>…</answer>``
    (else the last ``\\boxed{}``); text after an ``=`` is ignored."""
    expr = _countdown_expression(completion)
    parsed = safe_arithmetic(expr) if expr else None
    if parsed is None:
        return 0.0
    value, used = parsed
    return float(sorted(used) == sorted(int(n) for n in numbers) and value == Fraction(int(target)))


def countdown_reward(completions: list[str], labels: list[str], *, numbers: list[list[int]], **_) -> list[float]:
    """Batch form of :func:`countdown_score` for the ``(completions, labels, **fields)`` rule
    convention: ``labels[i]`` is the target, ``numbers[i]`` the row's ``fields["numbers"]``."""
    return [countdown_score(c, t, n) for c, t, n in zip(completions, labels, numbers)]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (nested braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None
