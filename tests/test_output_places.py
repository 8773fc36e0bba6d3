"""Each kind of output has one place (docs/contributing.md, "Where outputs go"): result files under
benchmarks/results/, the figures the README and the docs show under docs/images/, a result page's
plots beside it under docs/results/. A tracked result file or figure anywhere else fails here, but for
the data files :data:`ALLOWED` names. Checked on the tracked files (``git ls-files``); skipped where
there is no git checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULT = (".json", ".jsonl", ".csv")
FIGURE = (".png", ".svg", ".jpg", ".jpeg", ".gif", ".pdf")
PLACES = {RESULT: ("benchmarks/results/",), FIGURE: ("docs/images/", "docs/results/")}
ALLOWED = {  # data files that are inputs, not outputs (a path, or a folder ending in /); no figures
    "examples/": "the small data files the README's and the docs' examples read",
    "tests/rewards/numeric_answers.jsonl": "the numeric-answer table the reward tests parametrize over",
}


def misplaced(paths: list[str]) -> list[str]:
    """The paths of ``paths`` that are a result file or a figure outside their places and not allowed."""
    out = []
    for path in paths:
        kinds = [places for suffixes, places in PLACES.items() if path.lower().endswith(suffixes)]
        if not kinds or path.startswith(kinds[0]):
            continue
        data = kinds[0] == PLACES[RESULT]  # ALLOWED holds data files: never a figure
        if data and any(path == a or (a.endswith("/") and path.startswith(a)) for a in ALLOWED):
            continue
        out.append(path)
    return out


def tracked() -> list[str]:
    done = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return done.stdout.splitlines()


def test_every_result_file_and_figure_is_in_its_place():
    wrong = misplaced(tracked())
    assert not wrong, (
        "result files go to benchmarks/results/, figures to docs/images/ (docs/contributing.md, "
        "'Where outputs go'); move these, or name a data fixture in ALLOWED:\n  " + "\n  ".join(wrong)
    )


def test_the_rule_refuses_what_it_should():
    assert misplaced(
        [
            "benchmarks/vs_trl-2026-12-01.json",  # a result beside the scripts
            "benchmarks/dev/results/update_ab.json",  # a dev script writing next to itself
            "docs/quickstart.png",  # a figure outside docs/images/
            "benchmarks/results/quickstart_overview.png",  # a figure among the results
            "examples/plot.png",  # examples/ is allowed its data, not figures
        ]
    ) == [
        "benchmarks/vs_trl-2026-12-01.json",
        "benchmarks/dev/results/update_ab.json",
        "docs/quickstart.png",
        "benchmarks/results/quickstart_overview.png",
        "examples/plot.png",
    ]
    assert not misplaced(
        [
            "benchmarks/results/vs_trl-2026-12-01.json",
            "benchmarks/results/ablations/steps/steps=40/metrics.jsonl",
            "docs/images/quickstart_overview.png",
            "docs/results/arithmetic_hard/plots/eval.png",
            "examples/gsm8k_train.jsonl",
            "tests/rewards/numeric_answers.jsonl",
            "rlvr/configs/quickstart.yaml",
        ]
    )


def test_each_allowed_entry_still_exists():
    files = tracked()
    stale = [a for a in ALLOWED if not any(f == a or (a.endswith("/") and f.startswith(a)) for f in files)]
    assert not stale, f"ALLOWED names what is no longer tracked: {stale}"
