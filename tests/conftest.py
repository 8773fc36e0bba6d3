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


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="device for the tests that build a tiny model and train, sample, score or evaluate on it: "
        "cpu (default) or cuda / cuda:N",
    )


def pytest_configure(config):
    """``--device`` checked at once (one line, no collection), and handed to the tiny runs (tiny_run.DEVICE)."""
    device = config.getoption("--device")
    if not (device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise pytest.UsageError(f"--device {device}: expected cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise pytest.UsageError(
                f"--device {device}: no CUDA device is visible (torch.cuda.is_available() is False); "
                "run on a GPU machine, or use --device cpu"
            )
        index = int(device[5:] or 0)
        if index >= torch.cuda.device_count():
            raise pytest.UsageError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    import tiny_run

    tiny_run.DEVICE = device


def pytest_collection_modifyitems(config, items):
    """On a GPU, the tests of what exists only on a CPU (tests/cpu: packed weights, compiled kernels) skip."""
    if config.getoption("--device") == "cpu":
        return
    skip = pytest.mark.skip(reason="CPU-only by nature (rlvr.cpu: oneDNN packing, compiled CPU kernels)")
    for item in items:
        if "cpu_only" in item.keywords or "/tests/cpu/" in str(item.path):
            item.add_marker(skip)


@pytest.fixture
def device(request) -> torch.device:
    """The device of ``pytest --device`` (default cpu), for tests that put a tiny model on it."""
    return torch.device(request.config.getoption("--device"))


def sevens(completions: list[str], labels: list[str], **fields) -> list[float]:
    """Fraction of each completion's words that are '7': trivially learnable by a tiny model."""
    return [sum(w == "7" for w in c.split()) / max(len(c.split()), 1) for c in completions]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny model directory (named ``m``) shared by the session's tests that only load it."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """The test runs in its own ``tmp_path``, with a private model cache (nothing is converted or fetched
    into the real one). A test module may override it to lay files there first."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture
def tiny_dir(tmp_path, monkeypatch):
    """A tiny model directory of this test's own, the `sevens` reward registered, and a private model cache."""
    monkeypatch.setitem(registry.REWARDS, "sevens", sevens)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    return save_tiny_model(tmp_path / "tiny")


@pytest.fixture(autouse=True)
def _fresh_fallbacks(monkeypatch):
    """A fail-soft fallback one test triggers (the fused log-probs, pinned memory) is process state: every
    test starts with none, so no test runs on a fallback path without knowing it."""
    import rlvr.models.forward as fwd
    import rlvr.rollout.static as static

    monkeypatch.setattr(fwd, "fused_failure", None)
    monkeypatch.setattr(static, "pinning_failure", None)
