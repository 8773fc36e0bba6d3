"""Built-in offline tasks: seeded generators of problems with exact answers."""

from __future__ import annotations

import random


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
