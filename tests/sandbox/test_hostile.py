"""Hostile code in the sandbox (rlvr.sandbox): each case ends within its limits with no test passed,
the run (this process) unharmed and nothing of the user's touched; and none of the ways a program
could fake a pass scores. Needs bubblewrap (`apt-get install bubblewrap`; .ci/run installs it)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from rlvr.sandbox import Limits, bwrap_problem, run_tests

pytestmark = pytest.mark.skipif(bwrap_problem() is not None, reason=f"no bubblewrap here: {bwrap_problem()}")

FAST = Limits(test_s=1.0, total_s=2.0, memory_bytes=512 << 20, file_bytes=1 << 20)
ADD = [{"args": [1, 2], "expected": 3}, {"args": [20, 22], "expected": 42}]
ECHO = [{"input": "4\n", "output": "8"}, {"input": "21\n", "output": "42"}]


def call(code: str, limits: Limits = FAST):
    return run_tests(code, "call", ADD, fn_name="add", limits=limits)


def stdin(code: str, limits: Limits = FAST):
    return run_tests(code, "stdin", ECHO, limits=limits)


def test_an_honest_solution_passes_both_forms():
    assert call("def add(a, b):\n    return a + b\n").passed == [True, True]
    assert stdin("print(int(input()) * 2)").passed == [True, True]


HOSTILE = {
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "while True": "while True:\n    pass\n",
    "memory bomb": "x = []\nwhile True:\n    x.append(bytearray(1 << 24))\n",
    "1 GB of output": "import sys\nfor _ in range(1 << 14):\n    sys.stdout.write('x' * (1 << 16))\n",
    "deep recursion": "import sys\nsys.setrecursionlimit(10**9)\ndef f(n):\n    return f(n + 1)\nf(0)\n",
    "kill the harness": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "kill every process": "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
    "signal tricks": (
        "import signal, os\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGXCPU, signal.SIGINT):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n"
    ),
    "ctypes": "import ctypes\nctypes.string_at(0)\n",
    "outlive its parent": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
        "    open('/work/late', 'w').write('x')\n"
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_code_ends_within_its_limits_and_passes_nothing(name):
    for run in (call, stdin):
        start = time.monotonic()
        outcome = run(HOSTILE[name] + "\ndef add(a, b):\n    return 0\n")
        assert time.monotonic() - start < FAST.total_s + 10, name
        assert not any(outcome.passed), (name, outcome)
    assert os.getpid() > 0  # this process is alive


def test_nothing_outside_the_sandbox_is_seen_or_touched(tmp_path):
    """The user's files and caches are not there; writing outside the scratch fails; /etc/passwd
    is not readable; the program learns this by trying, and reports what it found as its output."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's")
    probe = f"""
import os
found = []
for p in ({str(secret)!r}, "/etc/passwd", {str(os.path.expanduser("~/.cache"))!r}, {os.getcwd()!r}, "/proc/self"):
    found.append(os.path.exists(p))
for p in ("/usr/evil", "/evil", "/etc/evil", {str(tmp_path / "evil")!r}):
    try:
        open(p, "w").write("x")
        found.append(True)
    except OSError:
        found.append(False)
print(sum(found))
"""
    outcome = run_tests(probe, "stdin", [{"input": "", "output": "0"}], limits=FAST)
    assert outcome.passed == [True], outcome.why  # every probe False: printed 0
    assert not (tmp_path / "evil").exists() and secret.read_text() == "the user's"


def test_no_network_not_even_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(5)
    port = server.getsockname()[1]
    hits = []
    threading.Thread(target=lambda: hits.append(_accept(server)), daemon=True).start()
    code = f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1)
    print("connected")
except OSError:
    print("no network")
"""
    outcome = run_tests(code, "stdin", [{"input": "", "output": "no network"}], limits=FAST)
    server.close()
    assert outcome.passed == [True], outcome.why
    assert hits in ([], [None])


def _accept(server):
    try:
        return server.accept()
    except OSError:
        return None


CHEATS = {
    "os._exit(0) before the tests": "import os\nos._exit(0)\n",
    "sys.exit(0) before the tests": "import sys\nsys.exit(0)\n",
    "SystemExit inside a test": "def add(a, b):\n    raise SystemExit(0)\n",
    "os._exit inside a test": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "print and builtins patched": (
        "import builtins\nbuiltins.print = lambda *a, **k: None\nbuiltins.abs = lambda x: 0\n"
        "def add(a, b):\n    return 0\n"
    ),
    "the comparison patched": (
        "import json\njson.dumps = lambda *a, **k: '3'\njson.loads = lambda *a, **k: 3\ndef add(a, b):\n    return 0\n"
    ),
    "an object equal to everything": (
        "class E(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return E(0)\n"
    ),
    "writes to the harness's channel": (
        "import os\nfor fd in range(3, 64):\n    try:\n"
        '        os.write(fd, b\'ready\\n["ok", "3"]\\n["ok", "42"]\\n\')\n'
        "    except OSError:\n        pass\ndef add(a, b):\n    return 0\n"
    ),
    "reads the harness's memory": (
        "import os\ntry:\n    print(open(f'/proc/{os.getppid()}/mem', 'rb').read(10))\nexcept OSError:\n    pass\n"
        "def add(a, b):\n    return 0\n"
    ),
}


@pytest.mark.parametrize("name", list(CHEATS))
def test_a_program_cannot_fake_a_pass(name):
    outcome = run_tests(CHEATS[name], "call", ADD, fn_name="add", limits=FAST, stop_on_fail=False)
    assert outcome.passed == [False, False], (name, outcome)


def test_printing_without_computing_fails_when_the_output_is_not_in_the_prompt():
    """A stdin program that prints a fixed answer passes only the case whose answer it guessed."""
    outcome = run_tests("print(8)", "stdin", ECHO, limits=FAST, stop_on_fail=False)
    assert outcome.passed == [True, False]
