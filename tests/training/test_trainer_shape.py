"""The trainer keeps a shape a reader (and a Ray worker) can follow: no function in rlvr/training
runs 60 lines or more, ``train`` is a loop over the Trainer's methods, and the metric
names it writes live in one standard-library module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr.training

TRAINING = Path(rlvr.training.__file__).parent
MAX_LINES = 60


def _functions(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("path", sorted(TRAINING.glob("*.py")), ids=lambda p: p.name)
def test_every_function_is_under_60_lines(path):
    functions = list(_functions(path))
    too_long = {name: n for name, n in functions if n >= MAX_LINES}
    assert not too_long, f"{path.name}: split these (lines, from def to the last line): {too_long}"


def test_the_limit_catches_a_long_function(tmp_path):
    """The negative control: a 60-line function is reported."""
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    long = tmp_path / "long.py"
    long.write_text(f"def long():\n{body}")
    assert dict(_functions(long)) == {"long": 60}


def test_the_trainer_and_train_are_in_the_training_modules():
    names = {name for path in TRAINING.glob("*.py") for name, _ in _functions(path)}
    assert {"train", "setup", "step", "save", "finish", "loss_denominators"} <= names


def test_metric_names_import_only_the_standard_library():
    code = (
        "import sys\n"
        "import rlvr.metric_names as M\n"
        "assert M.reward_mean('format') == 'reward/format_mean' and M.rule_of_mean(M.reward_mean('a_b')) == 'a_b'\n"
        "assert M.train(M.stat(M.KL)) == M.KL\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'numpy', 'transformers', 'yaml', 'rich')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]"
