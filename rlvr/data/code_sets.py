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
import pickle


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


class _NoClasses(pickle.Unpickler):
    """An unpickler that builds no object but plain data: LiveCodeBench's private tests are a pickled
    str of JSON, and a pickle that names a class is refused rather than run."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"they name {module}.{name}; only a pickled str is read")


def _json_tests(raw) -> list:
    """A list of tests from JSON text, or from base64 + zlib + a pickled str of JSON (LCB's private tests)."""
    if isinstance(raw, list):
        return raw
    if not isinstance(raw, str) or not raw.strip():
        return []
    try:
        return json.loads(raw)
    except ValueError:
        pass
    import base64
    import io
    import pickle
    import zlib

    try:
        text = _NoClasses(io.BytesIO(zlib.decompress(base64.b64decode(raw.encode("utf-8"))))).load()
        return json.loads(text) if isinstance(text, str) else []
    except pickle.UnpicklingError as e:
        raise BadRow(f"pickled tests refused: {e}") from None
    except (ValueError, zlib.error, EOFError):
        raise BadRow("tests that are neither JSON nor base64+zlib+pickle of JSON") from None


def _listed(tests: list, fn_name: str) -> dict:
    """LiveCodeBench's and DeepCoder's test lists: ``{"input", "output", "testtype": "stdin" | "functional"}``
    (LCB: a functional input is one JSON value a line, its output JSON) or ``{"type": "stdin_stdout" |
    "function_call", "input", "output", "fn_name"}`` (PrimeIntellect: input a list of arguments, output
    the return value in a one-element list)."""
    stdin, calls = [], []
    for t in tests:
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            raise BadRow("a test without input and output")
        kind = t.get("testtype") or t.get("type") or "stdin"
        if kind in ("stdin", "stdin_stdout"):
            stdin.append({"input": str(t["input"]), "output": str(t["output"])})
            continue
        fn_name = fn_name or t.get("fn_name") or ""
        if isinstance(t["input"], str):  # LCB: one JSON value a line
            try:
                args = [json.loads(line) for line in t["input"].split("\n") if line.strip()]
                out = json.loads(t["output"]) if isinstance(t["output"], str) else t["output"]
            except ValueError:
                raise BadRow("a functional test whose input or output is not JSON") from None
            calls.append({"args": args, "expected": out})
        else:  # PrimeIntellect: the arguments, and the return value in a one-element list
            out = t["output"]
            alternatives = [out, out[0]] if isinstance(out, list) and len(out) == 1 else [out]
            calls.append({"args": list(t["input"]), "expected_any": alternatives})
    if stdin and calls:
        raise BadRow("stdin and functional tests in one row")
    if calls:
        if not fn_name:
            raise BadRow("functional tests without a function name (metadata.func_name or fn_name)")
        return {"kind": "call", "fn_name": fn_name, "setup": "", "cases": calls}
    if not stdin:
        raise BadRow("no tests")
    return {"kind": "stdin", "cases": stdin}


def _ask(question: str, starter: str, tests: dict) -> str:
    if tests["kind"] == "call":
        return f"{question}\nWrite it in Python, starting from:\n```python\n{starter}\n```" if starter else question
    return f"{question}\nWrite a Python program that reads standard input and prints the answer."


def _func_name(record: dict) -> str:
    """``metadata.func_name`` (LiveCodeBench, DeepCoder's lcbv5): metadata a mapping or its JSON text."""
    meta = record.get("metadata") or {}
    if isinstance(meta, str):
        try:
            meta = json.loads(meta) if meta.strip() else {}
        except ValueError:
            meta = {}
    return str(meta.get("func_name") or "") if isinstance(meta, dict) else ""


def lcb(record: dict) -> tuple[str, dict]:
    """livecodebench/code_generation_lite: ``question_content``, ``starter_code``, ``public_test_cases`` and
    ``private_test_cases`` (JSON, or base64+zlib+pickle of JSON), ``metadata`` (JSON with ``func_name``)."""
    tests = _listed(
        [*_json_tests(record.get("public_test_cases")), *_json_tests(record.get("private_test_cases"))],
        _func_name(record),
    )
    question = str(record.get("question_content") or "")
    if not question:
        raise BadRow("no question_content")
    return _ask(question, str(record.get("starter_code") or ""), tests), tests


def deepcoder(record: dict) -> tuple[str, dict]:
    """agentica-org/DeepCoder-Preview-Dataset: ``problem`` and ``tests`` in its configs' forms (``lcbv5``:
    LCB's list and ``metadata.func_name``; ``taco``: APPS's ``inputs``/``outputs``; ``primeintellect``:
    typed tests; ``codeforces``: input/output pairs)."""
    raw = record.get("tests")
    parsed = _json_tests(raw) if isinstance(raw, (str, list)) else raw
    if isinstance(parsed, dict):  # the taco config: APPS's form
        return apps({**record, "input_output": parsed})
    tests = _listed(parsed or [], _func_name(record))
    question = str(record.get("problem") or "")
    if not question:
        raise BadRow("no problem")
    return _ask(question, str(record.get("starter_code") or ""), tests), tests


def kodcode(record: dict) -> tuple[str, dict]:
    """KodCode/KodCode-V1 (and its RL subsets, e.g. KodCode-Light-RL-10K): ``question``, ``test_code`` (a
    pytest file: ``from solution import f`` then ``def test_...():`` functions), ``test_info`` (each
    function's ``function_name`` and ``function_declaration``). A test function whose body is anything
    but asserts of the readable shapes (a local variable, ``pytest.raises``, a class) leaves the record
    out with that reason: a skipped test would pass code the data set fails."""
    question, source = str(record.get("question") or ""), str(record.get("test_code") or "")
    if not question or not source:
        raise BadRow("no question or test_code")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise BadRow(f"test_code that does not parse ({e.msg})") from None
    info = [i for i in (record.get("test_info") or []) if isinstance(i, dict) and i.get("function_name")]
    imported = [a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "solution"
                for a in n.names]  # fmt: skip
    names = {str(info[0]["function_name"])} if info else set(imported)
    if len(names) != 1:
        raise BadRow(f"tests of {len(names)} functions ({', '.join(sorted(names))[:60]}); rlvr runs one per problem")
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    if not tests:
        raise BadRow("no test functions in test_code")
    for fn in tests:
        body = [n for n in fn.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        if fn.args.args or any(not isinstance(n, ast.Assert) for n in body):
            raise BadRow(f"test {fn.name} is not only asserts (fixtures, variables or pytest.raises)")
    fn_name, cases = assert_cases("\n".join(ast.unparse(t) for t in tests), names)
    if not cases:
        raise BadRow("no tests")
    declaration = next(
        (str(i.get("function_declaration") or "") for i in info if i.get("function_name") == fn_name), ""
    )
    ask = f"{question}\nWrite it in Python as `{declaration or fn_name}`." if declaration or fn_name else question
    return ask, {"kind": "call", "fn_name": fn_name, "setup": "", "cases": cases}


READERS = {
    "humaneval": humaneval,
    "mbpp": mbpp,
    "apps": apps,
    "lcb": lcb,
    "deepcoder": deepcoder,
    "kodcode": kodcode,
}
"""Preset name -> reader (``data.preset=humaneval|mbpp|apps``, or detected from the columns)."""
