"""Sandboxed programs per second on this machine: the code_tests reward's cost.

Times, interleaved over ``--rounds``: a bare ``bwrap`` + Python start (``print(1)``), one completion's
call tests (bubblewrap, the harness, the candidate's process, six call cases), one completion's stdin
tests (a process per case, three cases), and a step's worth of completions scored by the rule
(``--batch`` completions, side by side on every core), against the same harness without bubblewrap.

    python benchmarks/dev/sandbox.py --rounds 20 --batch 32

Writes benchmarks/results/sandbox-<capability>-<date>.json. Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
ADD = "def add_k(x):\n    return x + 3\n"
ECHO = "print(int(input()) * 2)\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()

    import torch

    from rlvr.rewards import get
    from rlvr.sandbox import Limits, _drop_to_nobody, bwrap_argv, bwrap_problem, python, run_tests

    if (problem := bwrap_problem()) is not None:
        raise SystemExit(f"no sandbox here: {problem}")
    call_cases = [{"args": [i], "expected": i + 3} for i in range(6)]
    stdin_cases = [{"input": f"{i}\n", "output": str(2 * i)} for i in range(3)]
    bare = [*bwrap_argv(Limits(), python()), python(), "-I", "-S", "-c", "print(1)"]
    completion = f"```python\n{ADD}```"
    tests = {"kind": "call", "fn_name": "add_k", "cases": call_cases}

    def rule(isolation: str) -> None:
        os.environ["RLVR_SANDBOX"] = isolation
        assert (
            get("code_tests")([completion] * args.batch, [""] * args.batch, tests=[tests] * args.batch)
            == [1.0] * args.batch
        )

    sides = {
        "bare bwrap + python": lambda: subprocess.run(bare, capture_output=True, preexec_fn=_drop_to_nobody, env={}),
        "call tests, one completion": lambda: run_tests(ADD, "call", call_cases, fn_name="add_k"),
        "stdin tests, one completion": lambda: run_tests(ECHO, "stdin", stdin_cases),
        "call tests, no isolation": lambda: run_tests(ADD, "call", call_cases, fn_name="add_k", isolation="none"),
        f"code_tests rule, {args.batch} completions": lambda: rule("bwrap"),
        f"code_tests rule, {args.batch} completions, no isolation": lambda: rule("none"),
    }
    times = {k: [] for k in sides}
    for i in range(args.rounds + 1):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            fn()
            if i:  # the first round warms the page cache
                times[name].append(time.perf_counter() - t0)
    os.environ.pop("RLVR_SANDBOX", None)
    cap = torch.backends.cpu.get_cpu_capability()
    rows = {k: {"median_s": round(statistics.median(v), 4), "min_s": round(min(v), 4)} for k, v in times.items()}
    for k, v in rows.items():
        if "rule" in k:
            v["completions_per_s"] = round(args.batch / v["median_s"], 1)
        else:
            v["per_s"] = round(1 / v["median_s"], 1)
    print(f"{cap}, {os.cpu_count()} cores, {args.rounds} rounds (medians)")
    for k, v in rows.items():
        print(f"  {k:55s} {v}")
    out = RESULTS / f"sandbox-{cap}-{datetime.date.today()}.json"
    body = {"date": str(datetime.date.today()), "cpu_capability": cap, "cores": os.cpu_count(), "rounds": args.rounds}
    out.write_text(json.dumps({**body, "batch": args.batch, "timings": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
