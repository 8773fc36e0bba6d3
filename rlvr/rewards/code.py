"""Rewards that run code: ``code_tests`` (1 when every test passes, else 0) and ``code_tests_frac``
(the fraction that pass), against the tests in each row's ``fields["tests"]``, in the sandbox
(:mod:`rlvr.sandbox`), all of one completion's tests in one sandboxed process.

A row's tests, as the data presets and the built-in ``code`` task write them::

    {"kind": "call", "fn_name": "f", "setup": "", "cases": [{"args": [12], "expected": 3}, ...]}
    {"kind": "stdin", "cases": [{"input": "3\\n", "output": "6\\n"}, ...]}

The code is the completion's last fenced block (```` ```python ````, else any fence), else the text
inside its last ``<answer>``. A completion without code, or a row without tests, scores 0. How the
code runs (``reward.sandbox``: ``bwrap`` or ``none``) reaches the scoring workers as the environment
variable ``RLVR_SANDBOX``, which the trainer sets from the config.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict

from rlvr.sandbox import Limits, run_tests

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
SANDBOX_ENV = "RLVR_SANDBOX"

_STATS = {"programs": 0, "timeouts": 0, "sandbox_errors": 0, "exec_s": 0.0}
"""What the code rules ran in this process since :func:`drain_stats` last read it."""
_STATS_LOCK = threading.Lock()


def drain_stats() -> dict[str, float]:
    """The code rules' counts since the last call, and reset them: ``programs`` (completions whose code
    ran), ``timeouts`` (tests stopped by their time limit), ``sandbox_errors`` (runs where the sandbox
    or the harness failed, not the code) and ``exec_s`` (seconds in the sandbox, summed over
    completions; they run side by side). Empty when no code ran."""
    with _STATS_LOCK:
        out = dict(_STATS) if _STATS["programs"] else {}
        _STATS.update(programs=0, timeouts=0, sandbox_errors=0, exec_s=0.0)
    return out


def extract_code(completion: str) -> str | None:
    """The completion's code: its last ```python block (``py`` and ``python3`` too), else its last fenced
    block of any language tag, else its last ``<answer>`` (fences inside it stripped); None if none."""
    blocks = _FENCE.findall(completion)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python or blocks:
        return (python or [body for _, body in blocks])[-1]
    answers = _ANSWER.findall(completion)
    if answers and answers[-1].strip():
        return answers[-1].strip().strip("`")
    return None


def _tests_of(fields: dict, i: int):
    direct = fields.get("tests")
    if isinstance(direct, (list, tuple)) and i < len(direct) and isinstance(direct[i], dict):
        return direct[i]
    nested = fields.get("fields")
    if isinstance(nested, (list, tuple)) and i < len(nested) and isinstance(nested[i], dict):
        return nested[i].get("tests")
    return None


_OUTCOMES: OrderedDict = OrderedDict()
"""(code, tests) -> the passed list of a run of every test: what ``code_tests_frac`` ran answers
``code_tests`` too (and an identical completion later), so a step with both rules runs each program once."""
_OUTCOMES_MAX = 4096


def _score(completions: list[str], fields: dict, *, fraction: bool) -> list[float]:
    """The completions' scores; their sandboxes run side by side, one per core (each a process: the
    threads here only wait). Identical (code, tests) pairs run once; a pair whose every test already ran
    (:data:`_OUTCOMES`) does not run again."""
    from concurrent.futures import ThreadPoolExecutor

    isolation = os.environ.get(SANDBOX_ENV, "bwrap")
    keys: list[tuple | None] = []
    for i, completion in enumerate(completions):
        tests, code = _tests_of(fields, i), extract_code(completion)
        ok = tests and tests.get("cases") and code is not None
        keys.append((code, json.dumps(tests, sort_keys=True, default=str)) if ok else None)

    def run(key: tuple) -> list[bool]:
        code, tests = key[0], json.loads(key[1])
        outcome = run_tests(
            code, tests["kind"], tests["cases"], fn_name=tests.get("fn_name", ""), setup=tests.get("setup", ""),
            limits=Limits(), stop_on_fail=not fraction, isolation=isolation,
        )  # fmt: skip
        with _STATS_LOCK:
            _STATS["programs"] += 1
            _STATS["timeouts"] += outcome.timeouts
            _STATS["sandbox_errors"] += outcome.error is not None
            _STATS["exec_s"] += outcome.seconds
            if (fraction or all(outcome.passed)) and outcome.error is None:  # every test ran: keep it
                _OUTCOMES[key] = list(outcome.passed)
                while len(_OUTCOMES) > _OUTCOMES_MAX:
                    _OUTCOMES.popitem(last=False)
        return list(outcome.passed)

    with _STATS_LOCK:
        known = {k: _OUTCOMES[k] for k in set(keys) if k is not None and k in _OUTCOMES}
    todo = [k for k in dict.fromkeys(keys) if k is not None and k not in known]
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        known.update(zip(todo, pool.map(run, todo)))

    def score(key: tuple | None) -> float:
        if key is None:
            return 0.0
        passed = known[key]
        return sum(passed) / len(passed) if fraction else float(all(passed) and len(passed) > 0)

    return [score(k) for k in keys]


def code_tests(completions: list[str], labels: list, **fields) -> list[float]:
    """1 when the completion's code passes every test of its row, else 0 (it stops at the first failure)."""
    return _score(completions, fields, fraction=False)


def code_tests_frac(completions: list[str], labels: list, **fields) -> list[float]:
    """The fraction of its row's tests the completion's code passes (every test runs)."""
    return _score(completions, fields, fraction=True)
