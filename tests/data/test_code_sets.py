"""Code data sets (rlvr.data.code_sets): HumanEval, MBPP, APPS/TACO rows in their published schemas,
from local files and by Hub name from a hub-style cache (offline), become rows whose tests the
code_tests reward runs; a reference solution passes them and a wrong one does not; rows whose
tests rlvr cannot run safely are left out with the reason."""

from __future__ import annotations

import json

import hub_cache
import pytest
from test_hub_data import hf_hub  # noqa: F401 (the fixture)

from rlvr.config import DataConfig
from rlvr.data import load_split
from rlvr.data.code_sets import BadRow, assert_cases
from rlvr.errors import UserError
from rlvr.rewards import get
from rlvr.sandbox import bwrap_problem

needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"no bubblewrap here: {bwrap_problem()}")

HUMANEVAL = [
    {
        "task_id": "HumanEval/0",
        "prompt": 'def close(xs: list, t: float) -> bool:\n    """True if two numbers are closer than t."""\n',
        "canonical_solution": "    return any(abs(a - b) < t for i, a in enumerate(xs) for b in xs[i + 1 :])\n",
        "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n"
        "    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3) == True\n"
        "    assert candidate([1.0, 2.0, 3.0], 0.5) == False\n    assert not candidate([1.0, 5.0], 1.0)\n",
        "entry_point": "close",
    },
    {
        "task_id": "HumanEval/2",
        "prompt": "def trunc(x: float) -> float:\n",
        "canonical_solution": "    return x % 1.0\n",
        "test": "def check(candidate):\n    assert abs(candidate(3.5) - 0.5) < 1e-6\n"
        "    assert abs(candidate(1.33) - 0.33) < 1e-6\n",
        "entry_point": "trunc",
    },
    {
        "task_id": "HumanEval/9",
        "prompt": "def f(x):\n",
        "canonical_solution": "    return x\n",
        "test": "def check(candidate):\n    for i in range(3):\n        assert candidate(i) == i\n",
        "entry_point": "f",
    },
]
MBPP = [
    {
        "task_id": 11,
        "text": "Write a python function to remove first and last occurrence of a given character from the string.",
        "code": "def remove_Occ(s, ch):\n    s = s.replace(ch, '', 1)\n    i = s.rfind(ch)\n"
        "    return s[:i] + s[i + 1 :] if i >= 0 else s\n",
        "test_list": [
            'assert remove_Occ("hello","l") == "heo"',
            'assert remove_Occ("abcda","a") == "bcd"',
            'assert remove_Occ("PHP","P") == "H"',
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    }
]
APPS = [
    {
        "problem_id": 0,
        "question": "Read n and print 2n.",
        "solutions": json.dumps(["print(int(input()) * 2)"]),
        "input_output": json.dumps({"inputs": ["3\n", "21\n"], "outputs": ["6 \n", "42\n"]}),
        "difficulty": "introductory",
        "url": "",
        "starter_code": "",
    },
    {
        "problem_id": 1,
        "question": "Return the sum of the list.",
        "solutions": json.dumps(["class Solution:\n    def total(self, xs):\n        return sum(xs)\n"]),
        "input_output": json.dumps({"fn_name": "total", "inputs": [[[1, 2]], [[5, 5]]], "outputs": [[3], [10]]}),
        "difficulty": "interview",
        "url": "",
        "starter_code": "class Solution:\n    def total(self, xs):\n",
    },
    {
        "problem_id": 2,
        "question": "No tests.",
        "solutions": "[]",
        "input_output": "",
        "difficulty": "",
        "url": "",
        "starter_code": "",
    },
]


def _rows(path: str, **kw):
    return load_split(DataConfig(task="files", path=path, on_bad_row="skip", **kw))


def _solve(split, solutions: list[str]):
    tests = [r["fields"]["tests"] for r in split.rows]
    return get("code_tests")([f"```python\n{s}\n```" for s in solutions], [""] * len(tests), tests=tests)


def test_assert_shapes_rlvr_runs_and_those_it_leaves_out():
    fn, cases = assert_cases(
        "assert f(1, 'a') == [2]\nassert 3 == f(2, 'b')\nassert f(0, '')\nassert not f(9, 'z')", {"f"}
    )
    assert fn == "f" and [c["expected"] for c in cases] == [[2], 3, True, False]
    with pytest.raises(BadRow, match="not a literal"):
        assert_cases("assert f(x) == 1", {"f"})
    with pytest.raises(BadRow, match="shape rlvr does not run safely"):
        assert_cases("assert sorted(f(1)) == [1]", {"f"})


@needs_bwrap
def test_humaneval_rows_from_a_file(tmp_path):
    (tmp_path / "he.jsonl").write_text(hub_cache.jsonl(HUMANEVAL))
    split = _rows(str(tmp_path / "he.jsonl"))
    assert split.preset == "humaneval" and len(split.rows) == 2  # the loop's test is left out
    assert any("left out 1" in n for n in split.notes)
    assert "```python\ndef close(" in split.rows[0]["question"] and split.rows[0]["answer"] == "3 tests"
    right = [r["prompt"] + r["canonical_solution"] for r in HUMANEVAL[:2]]
    assert _solve(split, right) == [1.0, 1.0]
    assert _solve(split, ["def close(xs, t):\n    return True\n", "def trunc(x):\n    return 0.5\n"]) == [0.0, 0.0]


@needs_bwrap
def test_mbpp_and_apps_rows_by_hub_name(hf_hub):  # noqa: F811
    hub_cache.put_dataset(
        hf_hub, "google-research-datasets/mbpp", {"full/test-00000-of-00001.parquet": hub_cache.parquet(MBPP)}
    )
    hub_cache.put_dataset(hf_hub, "codeparrot/apps", {"test.jsonl": hub_cache.jsonl(APPS)})
    mbpp = load_split(DataConfig(task="files", path="google-research-datasets/mbpp:full", test_path=""), "test")
    assert mbpp.preset == "mbpp" and len(mbpp.rows) == 1
    assert 'assert remove_Occ("hello","l") == "heo"' in mbpp.rows[0]["question"]
    assert _solve(mbpp, [MBPP[0]["code"]]) == [1.0]
    apps = load_split(DataConfig(task="files", path="codeparrot/apps", on_bad_row="skip"), "test")
    assert apps.preset == "apps" and [r["fields"]["tests"]["kind"] for r in apps.rows] == ["stdin", "call"]
    assert _solve(apps, [json.loads(r["solutions"])[0] for r in APPS[:2]]) == [1.0, 1.0]
    assert _solve(apps, ["print(6)", "class Solution:\n    def total(self, xs):\n        return 3\n"]) == [0.0, 0.0]


def _private(tests: list) -> str:
    """LiveCodeBench's private-test encoding: base64 of zlib of a pickled str of JSON."""
    import base64
    import pickle
    import zlib

    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


LCB = [
    {
        "question_title": "Double",
        "question_content": "Read n and print 2n.",
        "platform": "atcoder",
        "question_id": "abc1",
        "contest_id": "abc",
        "contest_date": "2024-08-10T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "3\n", "output": "6\n", "testtype": "stdin"}]),
        "private_test_cases": _private([{"input": "21\n", "output": "42\n", "testtype": "stdin"}]),
        "metadata": "{}",
    },
    {
        "question_title": "Pairs",
        "question_content": "Return the element-wise sums of two lists.",
        "platform": "leetcode",
        "question_id": "2849",
        "contest_id": "w1",
        "contest_date": "2023-06-01T00:00:00",
        "starter_code": "class Solution:\n    def pairSums(self, a: List[int], b: List[int]) -> List[int]:\n",
        "difficulty": "medium",
        "public_test_cases": json.dumps([{"input": "[1, 2]\n[3, 4]", "output": "[4, 6]", "testtype": "functional"}]),
        "private_test_cases": json.dumps([{"input": "[0]\n[5]", "output": "[5]", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "pairSums"}),
    },
]
DEEPCODER = [
    {  # primeintellect: typed tests, the return value in a one-element list
        "problem": "Return x squared.",
        "tests": json.dumps([{"type": "function_call", "fn_name": "sq", "input": [3], "output": [9]}]),
    },
    {  # taco: APPS's form
        "problem": "Print the sum of two numbers on a line.",
        "tests": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}),
    },
]


@needs_bwrap
def test_livecodebench_and_deepcoder_rows(tmp_path):
    (tmp_path / "lcb.jsonl").write_text(hub_cache.jsonl(LCB))
    lcb = _rows(str(tmp_path / "lcb.jsonl"))
    assert lcb.preset == "lcb" and [len(r["fields"]["tests"]["cases"]) for r in lcb.rows] == [2, 2]
    assert lcb.rows[1]["fields"]["tests"]["cases"][0] == {"args": [[1, 2], [3, 4]], "expected": [4, 6]}
    pair_sums = "class Solution:\n    def pairSums(self, a, b):\n        return [x + y for x, y in zip(a, b)]\n"
    assert _solve(lcb, ["print(int(input()) * 2)", pair_sums]) == [1.0, 1.0]
    assert _solve(lcb, ["print(6)", pair_sums.replace("x + y", "x")]) == [0.0, 0.0]  # the private test decides
    (tmp_path / "dc.jsonl").write_text(hub_cache.jsonl(DEEPCODER))
    dc = _rows(str(tmp_path / "dc.jsonl"))
    assert dc.preset == "deepcoder" and [r["fields"]["tests"]["kind"] for r in dc.rows] == ["call", "stdin"]
    assert _solve(dc, ["def sq(x):\n    return x * x\n", "print(sum(map(int, input().split())))"]) == [1.0, 1.0]


def test_a_pickled_class_in_private_tests_is_refused_not_run(tmp_path):
    import base64
    import pickle
    import zlib

    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    hostile = dict(LCB[0], private_test_cases=base64.b64encode(zlib.compress(pickle.dumps(Boom()))).decode())
    (tmp_path / "h.jsonl").write_text(hub_cache.jsonl([hostile, LCB[0]]))
    split = _rows(str(tmp_path / "h.jsonl"))
    assert len(split.rows) == 1 and any("only a pickled str is read" in n for n in split.notes), split.notes


def test_livecodebench_date_filter(tmp_path):
    (tmp_path / "lcb.jsonl").write_text(hub_cache.jsonl(LCB))
    path = str(tmp_path / "lcb.jsonl")
    after = load_split(DataConfig(task="files", path=path, date_from="2024-01-01"), "train")
    assert [r["fields"]["contest_date"][:10] for r in after.rows] == ["2024-08-10"]
    assert after.dropped == {"outside data.date_from..date_to": 1}
    before = load_split(DataConfig(task="files", path=path, date_to="2023-12-31"), "train")
    assert [r["question"].split("\n")[0] for r in before.rows] == ["Return the element-wise sums of two lists."]
    (tmp_path / "undated.jsonl").write_text(hub_cache.jsonl([{k: v for k, v in LCB[0].items() if k != "contest_date"}]))
    with pytest.raises(UserError, match="1 without a date"):
        load_split(DataConfig(task="files", path=str(tmp_path / "undated.jsonl"), date_from="2024-01-01"), "train")
    with pytest.raises(UserError, match="data.date_from=2024-8-1: give a date as YYYY-MM-DD"):
        DataConfig(date_from="2024-8-1")
    with pytest.raises(UserError, match="is after data.date_to"):
        DataConfig(date_from="2024-09-01", date_to="2024-01-01")


KODCODE = [
    {  # KodCode-V1's columns (a few): a pytest file importing from `solution`
        "style": "instruct",
        "subset": "Leetcode",
        "question_id": "Leetcode_1_I",
        "question": "Return the number of vowels in the string s.",
        "solution": "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)\n",
        "test_code": "from solution import count_vowels\n\ndef test_none():\n    assert count_vowels('xyz') == 0\n\n"
        'def test_some():\n    """Vowels counted."""\n    assert count_vowels(\'banana\') == 3\n'
        "    assert count_vowels('') == 0\n",
        "test_info": [
            {
                "function_name": "count_vowels",
                "parameter_list": "(s)",
                "function_declaration": "def count_vowels(s):",
                "docstring": None,
            }
        ],  # fmt: skip
        "gpt_pass_percentage": 1.0,
    },
    {  # a test with a local variable: left out, not run weaker
        "question_id": "Leetcode_2_I",
        "question": "Double x.",
        "test_code": "from solution import double\n\ndef test_double():\n    x = 2\n    assert double(x) == 4\n",
        "test_info": [{"function_name": "double", "function_declaration": "def double(x):"}],
    },
]


@needs_bwrap
def test_kodcode_rows_by_hub_name(hf_hub):  # noqa: F811
    hub_cache.put_dataset(
        hf_hub, "KodCode/KodCode-Light-RL-10K", {"data/train-00000-of-00001.parquet": hub_cache.parquet(KODCODE)}
    )
    split = load_split(DataConfig(task="files", path="KodCode/KodCode-Light-RL-10K", on_bad_row="skip"), "train")
    assert split.preset == "kodcode" and len(split.rows) == 1
    assert split.dropped == {"test test_double is not only asserts (fixtures, variables or pytest.raises)": 1}
    row = split.rows[0]
    assert "`def count_vowels(s):`" in row["question"] and row["fields"]["question_id"] == "Leetcode_1_I"
    assert row["fields"]["tests"]["cases"] == [
        {"args": ["xyz"], "expected": 0}, {"args": ["banana"], "expected": 3}, {"args": [""], "expected": 0}
    ]  # fmt: skip
    assert _solve(split, [KODCODE[0]["solution"]]) == [1.0]
    assert _solve(split, ["def count_vowels(s):\n    return len(s) // 2\n"]) == [0.0]
