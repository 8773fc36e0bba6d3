"""Commit subjects are 72 characters or fewer (the detail goes in the body), from the commit that set the
rule on: checked on the clone CI runs, skipped where there is no git history."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SINCE = "4b5d47f"  # the last commit before the subject rule was adopted
PUBLISHED = {"176e65d": "Report distinct tool samples; note the base model's calls and a smoke run"}
"""Longer subjects already under other commits of the shared branch (73 characters): rewording one would
rewrite everyone's history, so they stay, named here one by one."""


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60)


def test_commit_subjects_are_at_most_72_characters():
    if _git("cat-file", "-e", f"{SINCE}^{{commit}}").returncode != 0:
        pytest.skip(f"no git history with {SINCE} here")
    subjects = _git("log", "--format=%s", f"{SINCE}..HEAD").stdout.splitlines()
    long = [s for s in subjects if len(s) > 72 and s not in PUBLISHED.values()]
    assert not long, "shorten these subjects (detail goes in the body):\n  " + "\n  ".join(long)
