"""The trainer prints the memory estimate before training and the measured peak beside it at the end."""

import io

import pytest
from rich.console import Console
from tiny_run import tiny_config

from rlvr.training import train

pytestmark = pytest.mark.slow


def test_trainer_prints_estimate_then_measured_peak(tiny_dir, tmp_path, device):
    cfg = tiny_config(tiny_dir, tmp_path / "run", "train.steps=1", "eval.at_start=false", "eval.at_end=false")
    out = io.StringIO()
    train(cfg, console=Console(file=out, width=300))
    text = out.getvalue()
    # what is measured follows the device (`pytest --device cuda`): the process's RSS, or CUDA's allocator
    estimated, measured = (
        ("CUDA allocated", "torch.cuda.max_memory_allocated") if device.type == "cuda" else ("RSS",) * 2
    )
    assert "memory estimate:" in text and f"peak {estimated}" in text, text
    line = next(l for l in text.splitlines() if l.startswith("memory: measured peak"))
    assert f"({measured}) beside the estimate" in line, line
    assert text.index("memory estimate:") < text.index("memory: measured peak")


def test_a_cpu_run_past_the_available_ram_is_warned_with_the_keys_that_shrink_it(
    tiny_dir, tmp_path, device, monkeypatch
):
    if device.type != "cpu":
        pytest.skip("the RAM warning is a CPU run's; a GPU run is refused by its memory check")
    monkeypatch.setattr("rlvr.training.setup.available_ram", lambda: 2**20)  # 1 MiB left on this machine
    cfg = tiny_config(tiny_dir, tmp_path / "run", "train.steps=1", "eval.at_start=false", "eval.at_end=false")
    out = io.StringIO()
    train(cfg, console=Console(file=out, width=300))
    text = out.getvalue()
    line = next(l for l in text.splitlines() if l.startswith("warning: this run may need up to"))
    assert "0.0 GiB of RAM available" in line and "reduce it (" in line, line
    assert text.index("memory estimate:") < text.index("warning: this run may need")
    assert "memory: measured peak" in text  # a warning: the run went on
