"""Fixtures shared by the end-to-end tests on tiny models."""

import pytest

from rlvr.models.tiny import save_tiny_model
from rlvr.rewards import registry


def sevens(completions: list[str], labels: list[str], **fields) -> list[float]:
    """Fraction of each completion's words that are '7': trivially learnable by a tiny model."""
    return [sum(w == "7" for w in c.split()) / max(len(c.split()), 1) for c in completions]


@pytest.fixture
def tiny_dir(tmp_path, monkeypatch):
    """A tiny model directory, the `sevens` reward registered, and a private model cache."""
    monkeypatch.setitem(registry.REWARDS, "sevens", sevens)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    return save_tiny_model(tmp_path / "tiny")
