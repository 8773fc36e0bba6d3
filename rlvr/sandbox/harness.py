"""The program that runs inside the sandbox (rlvr.sandbox.run_tests): it runs the candidate's code
against the tests, compares, and reports on its own stdout, the one channel out of the sandbox.

Trusted, and kept out of the candidate's reach: the candidate runs in a child process that does not
inherit this process's stdout (the report channel), gets no test's expected output, and cannot open
this process's files or memory (the sandbox mounts no /proc, this process is not dumpable, and no
process in the sandbox holds a capability). The report carries the per-call token the host sent on
stdin, which the child never sees, so nothing the child writes anywhere can pass for a report.

Standard library only; run as ``python3 -I -S harness.py`` with the spec as JSON on stdin:

    {"token", "code", "kind": "call" | "stdin", "fn_name", "setup", "cases": [{"args" | "input",
     "expected" | "output"}], "test_s", "total_s", "memory_bytes", "file_bytes", "processes", "stop_on_fail"}
"""

import ctypes
import json
import math
import os
import resource
import select
import signal
import subprocess
import sys
import time
from decimal import Decimal, InvalidOperation

WORK = sys.argv[1] if len(sys.argv) > 1 else "/work"  # reward.sandbox=none: a host folder
DRIVER = """
import json, os, sys
_write, _dumps, _loads, _out = os.write, json.dumps, json.loads, int(sys.argv[1])
_readline = sys.stdin.buffer.readline
_g = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(open("setup.py").read(), "setup.py", "exec"), _g)
    exec(compile(open("solution.py").read(), "solution.py", "exec"), _g)
    _name = sys.argv[2]
    _fn = _g[_name] if _name in _g else getattr(_g["Solution"](), _name)  # LeetCode: a method of Solution
    _write(_out, b"ready\\n")
except BaseException as _e:
    _write(_out, (_dumps(["load", type(_e).__name__ + ": " + str(_e)[:300]]) + "\\n").encode())
    raise SystemExit(1)
while True:
    _line = _readline()
    if not _line:
        break
    try:
        _v = _fn(*_loads(_line))
        try:
            _text = _dumps(_v)
        except BaseException:
            _text = _dumps({"unserialisable": repr(type(_v))})
        _msg = ["ok", _text]
    except BaseException as _e:
        _msg = ["error", type(_e).__name__ + ": " + str(_e)[:300]]
    _write(_out, (_dumps(_msg) + "\\n").encode())
"""


def _not_dumpable():
    """PR_SET_DUMPABLE 0: no process of this uid may open this one's /proc files or ptrace it."""
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _limits(spec):
    def apply():
        os.setsid()
        cpu = int(math.ceil(spec.get("cpu_s") or spec["total_s"] + 1))
        for what, soft, hard in (
            (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
            (resource.RLIMIT_AS, spec["memory_bytes"], spec["memory_bytes"]),
            (resource.RLIMIT_FSIZE, spec["file_bytes"], spec["file_bytes"]),
            (resource.RLIMIT_NPROC, spec["processes"], spec["processes"]),
            (resource.RLIMIT_CORE, 0, 0),
        ):
            try:
                resource.setrlimit(what, (soft, hard))
            except (ValueError, OSError):
                pass

    return apply


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.kill()
    except OSError:
        pass
    proc.wait()


def _same_number(a, b):
    try:
        return Decimal(a) == Decimal(b)
    except (InvalidOperation, ValueError):
        return False


def same_stdout(got, want):
    """LiveCodeBench's rule: the whole output stripped, split into lines, each stripped; as many lines;
    each line equal as text, else token by token as decimal numbers."""
    got_lines = [x.strip() for x in got.strip().split("\n")]
    want_lines = [x.strip() for x in want.strip().split("\n")]
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines):
        if g == w:
            continue
        gt, wt = g.split(), w.split()
        if len(gt) != len(wt) or not all(x == y or _same_number(x, y) for x, y in zip(gt, wt)):
            return False
    return True


def same_value(got, want):
    """Plain JSON-like values equal, tuples as lists, floats within 1e-6 (relative) or 1e-9."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return got == want or math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in want)
    return got == want


def _read_line(fd, deadline):
    """One line from fd before the deadline: (line or None on EOF, timed_out)."""
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            return None, True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None, True
        chunk = os.read(fd, 65536)
        if not chunk:
            return None, False
        buf += chunk
        if len(buf) > 1 << 20:
            return None, False
    return buf.decode("utf-8", "replace"), False


def run_calls(spec, end, results):
    read_fd, write_fd = os.pipe()
    err = open(WORK + "/stderr.txt", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", DRIVER, str(write_fd), spec["fn_name"]],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err, pass_fds=(write_fd,), cwd=WORK, env={},
        preexec_fn=_limits(spec),
    )  # fmt: skip
    os.close(write_fd)
    try:
        first, timed_out = _read_line(read_fd, min(end, time.monotonic() + spec["test_s"] + 2))
        if first != "ready\n":
            why = "timeout" if timed_out else (json.loads(first)[1] if first and first.startswith("[") else "crashed")
            results += [{"passed": False, "why": f"load: {why}"[:300]} for _ in spec["cases"]]
            return
        for case in spec["cases"]:
            if results and not results[-1]["passed"] and spec["stop_on_fail"]:
                results.append({"passed": False, "why": "not run"})
                continue
            try:
                proc.stdin.write((json.dumps(case["args"]) + "\n").encode())
                proc.stdin.flush()
            except OSError:
                results.append({"passed": False, "why": "the program had exited"})
                continue
            line, timed_out = _read_line(read_fd, min(end, time.monotonic() + spec["test_s"]))
            if line is None:
                results.append({"passed": False, "why": "timeout" if timed_out else "the program exited"})
                if timed_out:
                    _kill(proc)
                continue
            status, text = json.loads(line)
            if status != "ok":
                results.append({"passed": False, "why": text[:300]})
                continue
            got = json.loads(text)
            ok = any(same_value(got, want) for want in case.get("expected_any", [case.get("expected")]))
            results.append({"passed": ok, "why": "" if ok else f"returned {text[:200]}"})
    finally:
        _kill(proc)
        os.close(read_fd)
        err.close()


def run_stdin(spec, end, results):
    for case in spec["cases"]:
        if results and not results[-1]["passed"] and spec["stop_on_fail"]:
            results.append({"passed": False, "why": "not run"})
            continue
        with open(WORK + "/stdout.txt", "wb") as out, open(WORK + "/stderr.txt", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", WORK + "/solution.py"],
                stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=WORK, env={}, preexec_fn=_limits(spec),
            )  # fmt: skip
            try:
                proc.communicate(case["input"].encode(), timeout=max(0.01, min(end - time.monotonic(), spec["test_s"])))
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            except OSError:
                timed_out = False
            _kill(proc)
        if timed_out:
            results.append({"passed": False, "why": "timeout"})
            continue
        with open(WORK + "/stdout.txt", "rb") as f:
            got = f.read(1 << 20).decode("utf-8", "replace")
        if proc.returncode != 0:
            results.append({"passed": False, "why": f"exit status {proc.returncode}"})
            continue
        ok = same_stdout(got, case["output"])
        results.append({"passed": ok, "why": "" if ok else f"printed {got[:200]!r}"})


def run_program(spec, end):
    """``kind: run``: the program once, stdin given, stdout and stderr together (the python tool)."""
    with open(WORK + "/stdout.txt", "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", WORK + "/solution.py"], stdin=subprocess.PIPE, stdout=out,
            stderr=subprocess.STDOUT, cwd=WORK, env={}, preexec_fn=_limits(spec),
        )  # fmt: skip
        timed_out = False
        try:
            proc.communicate(
                (spec.get("stdin") or "").encode(), timeout=max(0.01, min(end - time.monotonic(), spec["test_s"]))
            )
        except subprocess.TimeoutExpired:
            timed_out = True
        except OSError:
            pass
        _kill(proc)
    size = os.path.getsize(WORK + "/stdout.txt")
    with open(WORK + "/stdout.txt", "rb") as f:
        text = f.read(spec.get("output_bytes", 65536)).decode("utf-8", "replace")
    return {"status": proc.returncode, "output": text, "size": size, "timed_out": timed_out}


def main():
    spec = json.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    _not_dumpable()
    token = spec.pop("token")
    with open(WORK + "/solution.py", "w") as f:
        f.write(spec["code"])
    with open(WORK + "/setup.py", "w") as f:
        f.write(spec.get("setup") or "")
    start = time.monotonic()
    end = start + spec["total_s"]
    results = []
    if spec["kind"] == "run":
        report = {"run": run_program(spec, end), "seconds": time.monotonic() - start}
        sys.stdout.write(token + json.dumps(report) + "\n")
        sys.stdout.flush()
        return
    try:
        (run_calls if spec["kind"] == "call" else run_stdin)(spec, end, results)
    except Exception as e:  # a harness failure is reported, never taken for a pass
        report = {"error": f"{type(e).__name__}: {e}"[:300]}
    else:
        report = {"results": results}
    report["seconds"] = time.monotonic() - start
    sys.stdout.write(token + json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
