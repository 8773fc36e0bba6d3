"""Built-in offline tasks: seeded generators of problems with exact answers. The countdown checker
(an AST walk over the model's expression, never ``eval``) lives with the rewards, in
:mod:`rlvr.rewards.countdown`, and is re-exported here."""

from __future__ import annotations

import math
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
    if difficulty == 3:  # a mix: half need the calculator, half do not (a single-digit sum)
        if rng.random() < 0.5:
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            return f"{a} + {b}", a + b
        difficulty = 1
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
    those, half two-step expressions (``a * b + c``, ``(a + b) * c``, ``a * b - c * d``), 3 = half
    3-digit by 2-digit products, half single-digit sums (``What is 4 + 7?``: no calculator needed),
    to learn *when* to call. Exact integer answers; a seeded generator (train and test use different
    seeds; 90,000 distinct products, so a test problem rarely appears in training)."""
    rng = random.Random(f"arithmetic_tool:{seed}")
    rows = []
    for _ in range(n):
        expr, value = _tool_problem(rng, min(max(difficulty, 1), 3))
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


# --- code ------------------------------------------------------------------------------------


def _digit_sum(x):
    return sum(int(c) for c in str(abs(x)))


def _count_primes(n):
    return sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, n))


def _fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _rle(s):
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(f"{s[i]}{j - i}")
        i = j
    return "".join(out)


_WORDS = ["level", "banana", "python", "aabbbc", "rotor", "queue", "mississippi", "abc", "zz", "noon", "tree"]

# (difficulty, name, the sentence after "returns", the function, the argument generator)
CODE_PROBLEMS = [
    (1, "add_k", "x plus {k}", lambda k: lambda x: x + k, lambda r: [r.randint(-50, 50)]),
    (1, "times_k", "x times {k}", lambda k: lambda x: x * k, lambda r: [r.randint(-30, 30)]),
    (1, "square", "the square of x", lambda k: lambda x: x * x, lambda r: [r.randint(-40, 40)]),
    (
        1,
        "digit_sum",
        "the sum of the decimal digits of x (x >= 0)",
        lambda k: _digit_sum,
        lambda r: [r.randint(0, 10**6)],
    ),
    (1, "is_even", "True if x is even, else False", lambda k: lambda x: x % 2 == 0, lambda r: [r.randint(-99, 99)]),
    (1, "reverse", "the string s reversed", lambda k: lambda s: s[::-1], lambda r: [r.choice(_WORDS)]),
    (
        1,
        "count_vowels",
        "the number of vowels (a, e, i, o, u) in the string s",
        lambda k: lambda s: sum(c in "aeiou" for c in s),
        lambda r: [r.choice(_WORDS)],
    ),
    (
        1,
        "largest",
        "the largest number in the list xs",
        lambda k: max,
        lambda r: [[r.randint(-99, 99) for _ in range(r.randint(1, 6))]],
    ),
    (
        2,
        "second_largest",
        "the second largest distinct number in the list xs (it has at least two)",
        lambda k: lambda xs: sorted(set(xs))[-2],
        lambda r: [r.sample(range(-50, 50), r.randint(2, 7))],
    ),
    (2, "count_primes", "how many primes are smaller than x", lambda k: _count_primes, lambda r: [r.randint(0, 200)]),
    (
        2,
        "fibonacci",
        "the x-th Fibonacci number (fibonacci(0) = 0, fibonacci(1) = 1)",
        lambda k: _fib,
        lambda r: [r.randint(0, 40)],
    ),
    (
        2,
        "run_length",
        "the run-length encoding of s: each run of a letter as the letter and the run's length ('aab' -> 'a2b1')",
        lambda k: _rle,
        lambda r: [r.choice(_WORDS)],
    ),
    (
        2,
        "is_palindrome",
        "True if the string s reads the same backwards, else False",
        lambda k: lambda s: s == s[::-1],
        lambda r: [r.choice(_WORDS)],
    ),
    (
        2,
        "gcd_k",
        "the greatest common divisor of x and {k}",
        lambda k: lambda x: math.gcd(x, k),
        lambda r: [r.randint(1, 500)],
    ),
]
"""The built-in code task's problems: each a one-argument function to write, in two tiers."""


def code(n: int, *, seed: int, difficulty: int = 1, tests: int = 6) -> list[dict]:
    """``n`` code problems from a seeded generator: "write ``name(x)`` that returns ...", with one
    example in the question and ``tests`` hidden cases (the ``code_tests`` reward's; their expected
    values come from the reference function and never reach the sandbox's candidate). Difficulty 1
    draws from the easy tier, 2 (or more) from both."""
    rng = random.Random(seed)
    pool = [p for p in CODE_PROBLEMS if p[0] <= max(1, difficulty)]
    rows = []
    for _ in range(n):
        _, name, says, make, gen = rng.choice(pool)
        k = rng.randint(2, 9)
        fn = make(k)
        arg = {"add_k": "x", "times_k": "x", "square": "x", "digit_sum": "x", "is_even": "x", "count_primes": "x",
               "fibonacci": "x", "gcd_k": "x", "largest": "xs", "second_largest": "xs"}.get(name, "s")  # fmt: skip
        example = gen(rng)
        cases = [{"args": gen(rng), "expected": None} for _ in range(tests)]
        for c in cases:
            c["expected"] = fn(*c["args"])
        question = (
            f"Write a Python function `{name}({arg})` that returns {says.format(k=k)}. "
            f"For example, {name}({example[0]!r}) returns {fn(*example)!r}."
        )
        answer = f"{name}: {len(cases)} hidden tests"
        rows.append({"question": question, "answer": answer,
                     "fields": {"tests": {"kind": "call", "fn_name": name, "cases": cases}}})  # fmt: skip
    return rows
