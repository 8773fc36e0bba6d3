"""Tools: the calculator's exact arithmetic and its limits, the python sandbox's limits, the
registry (built-ins, plugins, one-line errors), the call syntax, and calls in the worker pool."""

from __future__ import annotations

import time

import pytest

from rlvr.config import load_config
from rlvr.errors import UserError
from rlvr.tools import CallSyntax, Toolbox, ToolError, calculator, get, python, sandbox


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("37*58", "2146"),
        ("123 × 45", "5535"),
        ("(2 + 3) * -4", "-20"),
        ("1/3 + 1/6", "1/2"),  # exact fractions
        ("0.1 + 0.2", "3/10"),  # decimals read as written
        ("7 ÷ 2", "7/2"),
        ("2**10", "1024"),
        ("2^10", "1024"),  # ^ is a power here, as calculators write it
        ("10**-3", "1/1000"),
        ("1,234 + 1", "1235"),
        ("  -(-5)  ", "5"),
        ("37 * 58 =", "2146"),  # the left side of an equation
        ("37 * 58 = 1000", "2146"),
        ("1e3 + 2.5e-1", "4001/4"),  # exponents within the bound are exact
    ],
)
def test_calculator_is_exact(expr, value):
    assert calculator(expr) == value


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("9**9**9", "bits"),  # refused before it is computed
        ("2**100000000", "bits"),
        ("(10**150)*(10**150)", "bits"),
        ("1e400", "bits"),
        ("1e999999999", "bits"),  # refused before Fraction builds 10**999999999 (issue 62: minutes)
        ("1e-999999999", "bits"),
        ("2.5E+999999999", "bits"),
        ("(" * 40 + "1" + ")" * 40, "parentheses"),
        ("-" * 100 + "1", "deeper"),
        ("1+" * 150 + "1", "longer"),
        ("x + 1", "Name"),
        ("__import__('os').system('true')", "Call"),
        ("(1).real", "Attribute"),
        ("1/0", "division by zero"),
        ("0**-1", "division by zero"),
        ("2**0.5", "integer exponents"),
        ("", "empty"),
        ("1 +", "not an arithmetic expression"),
    ],
)
def test_calculator_refuses_fast(expr, why):
    t0 = time.perf_counter()
    with pytest.raises(ToolError, match=why):
        calculator(expr)
    assert time.perf_counter() - t0 < 0.5


def test_python_runs_code_in_a_scratch_folder_with_an_empty_environment():
    out = python("import os\nprint(6 * 7, os.getcwd(), 'solution.py' in os.listdir('.'), 'HOME' in os.environ)")
    assert out == "42 /work True False"  # the sandbox's scratch (tests/sandbox checks what else it cannot see)
    assert python("```python\nprint('fenced')\n```") == "fenced"


@pytest.mark.parametrize(
    ("code", "why"),
    [
        ("while True: pass", "CPU limit"),
        ("import time\ntime.sleep(60)", "timed out"),
        ("x = bytearray(10**10)", "MemoryError"),
        ("print('a' * 10**7)", "output longer"),
        ("raise ValueError('boom')", "ValueError: boom"),
    ],
)
def test_python_hostile_code_ends_within_its_limits(monkeypatch, code, why):
    monkeypatch.setattr(sandbox, "CPU_S", 1)
    monkeypatch.setattr(sandbox, "WALL_S", 1.5)
    t0 = time.perf_counter()
    with pytest.raises(ToolError, match=why):
        python(code)
    assert time.perf_counter() - t0 < 4


def test_registry_names_plugins_and_one_line_errors(tmp_path, monkeypatch):
    assert get("calculator") is calculator
    with pytest.raises(UserError, match="unknown tool 'calculater'.*did you mean 'calculator'"):
        get("calculater")
    plugin = tmp_path / "mytools.py"
    plugin.write_text("def shout(args):\n    return args.upper()\n")
    assert get(f"{plugin}:shout")("hi") == "HI"
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get("mytools:shout")("a") == "A"
    with pytest.raises(UserError, match="has no function 'whisper'"):
        get(f"{plugin}:whisper")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    with pytest.raises(UserError, match="failed to import: ModuleNotFoundError") as e:
        get(f"{broken}:f")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="not found"):
        get(f"{tmp_path / 'absent.py'}:f")
    with pytest.raises(UserError, match="cannot import tool module"):
        get("no_such_pkg.tools:f")


def test_call_syntax_parses_calls_and_rejects_bad_syntax():
    s = CallSyntax()
    assert s.close == "</tool>" and s.format_result("5") == "<result>5</result>"
    assert s.parse("First <tool>calculator: 37 * 58</tool>") == ("calculator", "37 * 58")
    assert s.parse("<tool>calculator:1+1</tool>") == ("calculator", "1+1")
    assert s.parse("no opening</tool>") is None
    assert s.parse("<tool>: 1+1</tool>") is None  # no name
    bare = CallSyntax("<calc>{args}</calc>", "=> {output};")
    assert bare.parse("so <calc> 2*3 </calc>") == (None, "2*3") and bare.format_result("6") == "=> 6;"
    for call, result, why in [
        ("<tool>{name}</tool>", "<result>{output}</result>", "{args} exactly once"),
        ("{name}: {args}</tool>", "<result>{output}</result>", "text before"),
        ("<tool>{name}: {args}", "<result>{output}</result>", "text before"),
        ("<tool>{name}{args}</tool>", "<result>{output}</result>", "between {name} and {args}"),
        ("<tool>{name}: {args}</tool>", "<result></result>", "{output} exactly once"),
    ]:
        with pytest.raises(UserError, match="rollout.tool_") as e:
            CallSyntax(call, result)
        assert why in str(e.value)
    with pytest.raises(UserError, match="rollout.tool_call=.*exactly once"):
        load_config("quickstart", ["rollout.tool_call=<t>{name}</t>"])
    with pytest.raises(UserError, match="rollout.tools lists calculator twice"):
        load_config("quickstart", ["rollout.tools=[calculator, calculator]"])


def test_toolbox_runs_calls_in_the_pool_with_a_time_limit(tmp_path):
    plugin = tmp_path / "slow.py"
    plugin.write_text(
        "import time\n"
        "def nap(args):\n    time.sleep(float(args))\n    return 'awake'\n"
        "def big(args):\n    return 'x' * int(args)\n"
        "def number(args):\n    return 5\n"
    )
    box = Toolbox(
        ["calculator", f"{plugin}:nap", f"{plugin}:big", f"{plugin}:number"], timeout_s=1.0, max_chars=50, workers=2
    )
    box.warm()
    t0 = time.perf_counter()
    out = box.run(
        [
            ("calculator", "6*7"),
            ("nap", "30"),
            ("nap", "0"),
            ("big", "10"),
            ("big", "1000"),
            ("number", ""),
            ("calculator", "2**100000"),
            ("search", "x"),
            None,
        ]
    )
    assert time.perf_counter() - t0 < 10
    assert [r.output for r in out[:4]] == ["42", "error: timed out after 1 s", "awake", "x" * 10]
    assert [r.error for r in out] == [False, True, False, False, True, True, True, True, True]
    assert "more than 50" in out[4].output and "not text" in out[5].output and "bits" in out[6].output
    assert "no tool 'search'" in out[7].output and "not a call" in out[8].output
    in_process = Toolbox(["calculator"], workers=0).run([("calculator", "2+2"), (None, "3*3")])
    assert [r.output for r in in_process] == ["4", "9"]


def test_toolbox_rejects_what_cannot_run():
    with pytest.raises(UserError, match="no tools given"):
        Toolbox([])
    with pytest.raises(UserError, match="does not name the tool"):
        Toolbox(["calculator", "python"], CallSyntax("<calc>{args}</calc>"))
    with pytest.raises(UserError, match="unknown tool 'calc'"):
        Toolbox.from_config(load_config("quickstart", ["rollout.tools=[calc]"]).rollout, 0)
    assert Toolbox.from_config(load_config("quickstart").rollout, 0) is None
