"""Test-wide settings: tiny models run faster on one thread, and nothing may touch the network.
Fixtures: ``tiny_model``, one tiny model for tests that only load it, and ``tiny_dir``, a tiny model
of a test's own to train (the tiny run's overrides are in tiny_run.py)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from rlvr.models.tiny import save_tiny_model  # noqa: E402
from rlvr.rewards import registry  # noqa: E402

torch.set_num_threads(1)


def sevens(completions: list[str], labels: list[str], **fields) -> list[float]:
    """Fraction of each completion's words that are '7': trivially learnable by a tiny model."""
    return [sum(w == "7" for w in c.split()) / max(len(c.split()), 1) for c in completions]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny model directory (named ``m``) shared by the session's tests that only load it."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture
def tiny_dir(tmp_path, monkeypatch):
    """A tiny model directory of this test's own, the `sevens` reward registered, and a private model cache."""
    monkeypatch.setitem(registry.REWARDS, "sevens", sevens)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    return save_tiny_model(tmp_path / "tiny")
