"""Code data sets' tests as the ``code_tests`` reward reads them (:mod:`rlvr.rewards.code`).

Each reader takes one record of a data set's published schema and returns ``(question, tests)``,
``tests`` in the reward's form (``{"kind": "call" | "stdin", "fn_name", "setup", "cases"}``), or
raises :class:`BadRow` (counted and reported like any bad row) for a record whose
tests it cannot hold to that form. Schemas: ``shared/reference/code-rlvr.md`` §1.

Assert-style tests (HumanEval's ``check(candidate)``, MBPP's ``test_list``) become call cases: each
``assert f(args) == literal`` (either side), ``assert f(args)``, ``assert not f(args)`` and
``assert abs(f(args) - literal) < tol`` is read with :mod:`ast`, its arguments and expected value
as literals. That is what keeps the expected value out of the code's reach (the harness compares; the
candidate's process never gets it), where running the asserts beside the candidate would let it patch
them. A record with an assert of any other shape (a loop, a helper, a comparison the reader does not
know) is left out, with that reason, rather than run in a weaker way.
"""

from __future__ import annotations

import ast
import json


class BadRow(ValueError):
    """A record whose tests this module cannot hold to the reward's form; the data loader counts it as a
    bad row (:class:`rlvr.data.presets.BadRow`) with this reason."""


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise BadRow(f"a test argument or expected value that is not a literal: {ast.unparse(node)[:60]}") from None


def _call_of(node: ast.AST, names: set[str]) -> tuple[str, list] | None:
    """(function name, literal args) when ``node`` calls one of ``names`` with positional literals."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names and not node.keywords:
        return node.func.id, [_literal(a) for a in node.args]
    return None


def assert_cases(source: str, names: set[str]) -> tuple[str | None, list[dict]]:
    """The call cases of the assert statements in ``source`` that call one of ``names``; (the function
    they call, cases). Raises BadRow on an assert of another shape."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise BadRow(f"tests that do not parse ({e.msg})") from None
    fn, cases = None, []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        test, case = node.test, None
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            left, right = test.left, test.comparators[0]
            for call_side, value_side in ((left, right), (right, left)):
                if (got := _call_of(call_side, names)) is not None:
                    case = (got, {"expected": _literal(value_side)})
                    break
        elif (got := _call_of(test, names)) is not None:
            case = (got, {"expected": True})
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and (got := _call_of(test.operand, names)):
            case = (got, {"expected": False})
        elif (  # abs(f(args) - literal) < tolerance
            isinstance(test, ast.Compare)
            and isinstance(test.ops[0], (ast.Lt, ast.LtE))
            and isinstance(test.left, ast.Call)
            and getattr(test.left.func, "id", None) == "abs"
            and len(test.left.args) == 1
            and isinstance(test.left.args[0], ast.BinOp)
            and isinstance(test.left.args[0].op, ast.Sub)
            and (got := _call_of(test.left.args[0].left, names)) is not None
        ):
            case = (got, {"expected": _literal(test.left.args[0].right)})
        if case is None:
            raise BadRow(f"a test of a shape rlvr does not run safely: {ast.unparse(test)[:80]}")
        (name, args), extra = case
        fn = fn or name
        cases.append({"args": args, **extra})
    return fn, cases


def humaneval(record: dict) -> tuple[str, dict]:
    """openai/openai_humaneval: ``prompt`` (a signature and docstring), ``test`` (``check(candidate)``),
    ``entry_point``."""
    entry = str(record.get("entry_point") or "")
    if not entry or not record.get("test") or not record.get("prompt"):
        raise BadRow("no prompt, test or entry_point")
    _, cases = assert_cases(record["test"], {"candidate", entry})
    if not cases:
        raise BadRow("no tests")
    question = f"Complete this Python function; give the whole function:\n```python\n{record['prompt']}```"
    return question, {"kind": "call", "fn_name": entry, "setup": "", "cases": cases}


def mbpp(record: dict) -> tuple[str, dict]:
    """google-research-datasets/mbpp, ``full`` (``text``) or ``sanitized`` (``prompt``, ``test_imports``):
    the first test is shown in the question, as MBPP's prompt does; every test is run."""
    tests = list(record.get("test_list") or [])
    text = record.get("text") or record.get("prompt")
    if not tests or not text:
        raise BadRow("no text or test_list")
    names = {
        n.func.id
        for t in tests
        for n in ast.walk(ast.parse(t))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    fn, cases = assert_cases("\n".join(tests), names - {"abs", "set", "sorted", "len", "round", "list", "tuple", "str"})
    setup = "\n".join([*(record.get("test_imports") or []), str(record.get("test_setup_code") or "")]).strip()
    question = f"{text}\nYour code should pass tests like this one:\n{tests[0]}"
    return question, {"kind": "call", "fn_name": fn, "setup": setup, "cases": cases}


def _io(raw) -> dict:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise BadRow("input_output that is not JSON") from None
    if not isinstance(raw, dict) or not raw.get("inputs") or len(raw["inputs"]) != len(raw.get("outputs") or []):
        raise BadRow("no tests in input_output")
    return raw


def apps(record: dict) -> tuple[str, dict]:
    """codeparrot/apps and BAAI/TACO (DeepCoder's ``taco`` too): ``question``, ``input_output`` (``inputs``,
    ``outputs``, ``fn_name`` for call-based problems), ``starter_code``. A call-based output is usually the
    return value in a one-element list: either form passes."""
    io = _io(record.get("input_output") or record.get("tests"))
    question = str(record.get("question") or record.get("problem") or "")
    if not question:
        raise BadRow("no question")
    starter = str(record.get("starter_code") or "")
    if io.get("fn_name"):
        cases = []
        for args, out in zip(io["inputs"], io["outputs"]):
            alternatives = [out, out[0]] if isinstance(out, list) and len(out) == 1 else [out]
            cases.append({"args": args if isinstance(args, list) else [args], "expected_any": alternatives})
        tests = {"kind": "call", "fn_name": io["fn_name"], "setup": "", "cases": cases}
        ask = f"{question}\nWrite it in Python, starting from:\n```python\n{starter}\n```" if starter else question
    else:
        outs = ["\n".join(o) if isinstance(o, list) else str(o) for o in io["outputs"]]
        tests = {"kind": "stdin", "cases": [{"input": str(i), "output": o} for i, o in zip(io["inputs"], outs)]}
        ask = f"{question}\nWrite a Python program that reads standard input and prints the answer."
    return ask, tests


READERS = {"humaneval": humaneval, "mbpp": mbpp, "apps": apps}
"""Preset name -> reader (``data.preset=humaneval|mbpp|apps``, or detected from the columns)."""
