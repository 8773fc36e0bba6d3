"""Built-in offline tasks: seeded generators of problems with exact answers. The countdown checker
(an AST walk over the model's expression, never ``eval``) lives with the rewards, in
:mod:`rlvr.rewards.countdown`, and is re-exported here."""

from __future__ import annotations

import random
from fractions import Fraction

from rlvr.rewards.countdown import countdown_reward, countdown_score, safe_arithmetic

__all__ = [
    "arithmetic",
    "arithmetic_tool",
    "countdown",
    "countdown_question",
    "countdown_reward",
    "countdown_score",
    "safe_arithmetic",
]


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
    if op == "*":
        return f"{a} * {c} + {b}", a * c + b
    return f"{a} {op} {b} * {c}", a + b * c if op == "+" else a - b * c


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


# --- arithmetic_tool: exact products and short expressions, for a model with a calculator ---------


def _tool_problem(rng: random.Random, difficulty: int) -> tuple[str, int]:
    if difficulty == 1 or rng.random() < 0.5:  # a 3-digit by 2-digit product
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        return f"{a} * {b}", a * b
    shape = rng.randrange(3)  # difficulty 2: half products, half two-step expressions
    if shape == 0:
        a, b, c = rng.randint(100, 999), rng.randint(10, 99), rng.randint(100, 999)
        return f"{a} * {b} + {c}", a * b + c
    if shape == 1:
        a, b, c = rng.randint(10, 999), rng.randint(10, 999), rng.randint(10, 99)
        return f"({a} + {b}) * {c}", (a + b) * c
    a, b, c, d = rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
    return f"{a} * {b} - {c} * {d}", a * b - c * d


def arithmetic_tool(n: int, *, seed: int, difficulty: int = 1) -> list[dict]:
    """``n`` problems ``{"question", "answer"}`` a small model cannot do in its head but can with a
    calculator: difficulty 1 = a 3-digit times a 2-digit number (``What is 437 * 58?``), 2 = half of
    those, half two-step expressions (``a * b + c``, ``(a + b) * c``, ``a * b - c * d``). Exact
    integer answers; a seeded generator (train and test use different seeds; 90,000 distinct
    products, so a test problem rarely appears in training)."""
    rng = random.Random(f"arithmetic_tool:{seed}")
    rows = []
    for _ in range(n):
        expr, value = _tool_problem(rng, min(max(difficulty, 1), 2))
        rows.append({"question": f"What is {expr}?", "answer": str(value)})
    return rows


# --- countdown -------------------------------------------------------------------------------
# Reach a target with the given numbers and + - * /, each number used exactly once
# (TinyZero's task). Model text is checked by walking its Python AST: only numbers, the four
# operators, parentheses and unary minus are accepted; nothing is ever passed to eval().

COUNTDOWN_SHAPES = {1: (3, 10), 2: (3, 25), 3: (4, 50), 4: (5, 100)}
"""difficulty -> (how many numbers, largest number)."""


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
