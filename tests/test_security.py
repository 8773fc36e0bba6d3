"""No model text can reach eval/exec/sympify, and no remote code is trusted.

The package is read as syntax trees, so a new call anywhere fails this test."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlvr.data import tasks

PACKAGE = Path(__file__).resolve().parents[1] / "rlvr"
BUILTINS = {"eval", "exec", "compile", "__import__"}  # as bare names (re.compile is fine)
PARSERS = {"sympify", "parse_expr", "parse_latex"}  # sympy's string parsers, however reached


def _forbidden(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name) and f.id in BUILTINS | PARSERS:
        return f.id
    if isinstance(f, ast.Attribute) and (f.attr in PARSERS or (f.attr in ("eval", "exec") and node.args)):
        return f.attr  # model.eval() takes no arguments; builtins.eval(text) does
    return None


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_eval_exec_or_sympify_and_no_remote_code(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if name := _forbidden(node):
            pytest.fail(f"{path.relative_to(PACKAGE)}:{node.lineno} calls {name}()")
        for kw in node.keywords:
            if kw.arg == "trust_remote_code" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                pytest.fail(
                    f"{path.relative_to(PACKAGE)}:{node.lineno} passes trust_remote_code={ast.unparse(kw.value)}"
                )


def _auto_loads(tree: ast.AST) -> list[ast.Call]:
    """Calls such as ``AutoTokenizer.from_pretrained(...)`` and ``AutoModelForCausalLM.from_config(...)``."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("from_pretrained", "from_config")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id.startswith("Auto")
    ]


def test_every_transformers_auto_load_passes_trust_remote_code_false():
    """Not left unset: with None, transformers asks on stdin whether to run a model repo's code and runs
    it on 'y' (a piped answer too). False makes it refuse instead (tests/commands/test_cli_errors.py)."""
    calls = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in _auto_loads(ast.parse(path.read_text(encoding="utf-8"))):
            calls += 1
            given = {kw.arg: kw.value for kw in node.keywords}
            value = given.get("trust_remote_code")
            assert isinstance(value, ast.Constant) and value.value is False, (
                f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node.func)} without trust_remote_code=False"
            )
    assert calls >= 6  # the check reaches the loads: tokenizer, model, config, GGUF conversion


def test_difficulty_4_answers_are_the_arithmetic_of_their_question():
    """The generator no longer evals its own expression; check its answers by hand-parsing."""
    for row in tasks.arithmetic(200, seed=3, difficulty=4):
        expr = row["question"].removeprefix("What is ").removesuffix("?")
        a, op, b, _, c = expr.split()
        a, b, c = int(a), int(b), int(c)
        want = {"+": a + b * c, "-": a - b * c, "*": a * b + c}[op]
        assert int(row["answer"]) == want, row
