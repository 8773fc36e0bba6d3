"""The one tiny training run that end-to-end tests build on, the one reader of what it wrote, and the
exact comparison of saved state trees.

The run: a tiny random model (``rlvr.models.tiny``) on CPU in float32, 4 prompts x 8 samples of
at most 8 new tokens, the ``sevens`` reward (registered in process by the ``tiny_dir`` fixture of
tests/conftest.py), lr 1e-2, no step checkpoints (the final one is still written), no TensorBoard,
progress bar or report. A test passes only what differs, as extra overrides: the last one of a key
wins, and a preset, when given, sits under all of them.

Imported as ``tiny_run``: pytest's default "prepend" import mode puts tests/ on ``sys.path`` when
it loads tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlvr.config import Config, load_config
from rlvr.run_dir import RunDir

DEVICE = "cpu"
"""The device the tiny runs train on: ``pytest --device`` (tests/conftest.py sets it)."""

TINY_RUN = (
    "model.device=cpu",
    "data.template=plain",
    "data.system_prompt=",
    "data.assistant_prefix=",
    "rollout.max_new_tokens=8",
    "rollout.samples_per_prompt=8",
    "rollout.dtype=float32",
    "model.autocast_bf16=false",  # the same precision on every CPU kind (auto autocasts where bf16 pays)
    "reward.rules=[sevens]",
    "reward.weights=[1.0]",
    "reward.accuracy_rule=sevens",
    "train.prompts_per_step=4",
    "train.micro_batch_seqs=8",
    "train.lr=1e-2",
    "train.save_every=0",
    "log.tensorboard=false",
    "log.progress=false",
    "log.report=false",
)

FORMAT_REWARD = ("reward.rules=[format_partial]", "reward.weights=[1.0]", "reward.accuracy_rule=format_partial")
"""A built-in reward in place of ``sevens``, for runs outside the test process (``rlvr train`` subprocesses)
and for tests without the ``tiny_dir`` fixture."""


def tiny_args(model_dir: Path | str, run_dir: Path | str, *extra: str) -> list[str]:
    """The tiny run's overrides for ``model_dir`` writing to ``run_dir``, then ``extra``."""
    return [f"model.path={model_dir}", f"run_dir={run_dir}", *TINY_RUN, f"model.device={DEVICE}", *extra]


def tiny_config(model_dir: Path | str, run_dir: Path | str, *extra: str, preset: str | None = None) -> Config:
    """The tiny run's config (on the quickstart preset unless ``preset`` names another)."""
    return load_config(preset, tiny_args(model_dir, run_dir, *extra))


def _timing(key: str) -> bool:
    return key.startswith(("time/", "perf/")) or key.endswith("time_s") or key == "async/overlap_frac"


def metrics(run_dir: Path | str, *, timings: bool = True) -> list[dict]:
    """The rows of the run's metrics.jsonl, read by ``RunDir``; ``timings=False`` drops wall times,
    throughput and memory, which differ between two runs that are otherwise bit-identical.

    Strict where ``RunDir`` is tolerant: the file must exist and every line must be a row, so that a
    torn or missing line fails the test instead of being skipped.
    """
    run = RunDir(Path(run_dir))
    rows = run.read_metrics()
    lines = run.metrics_file.read_text(encoding="utf-8").splitlines()
    assert len(rows) == len(lines), f"{run.metrics_file}: {len(lines) - len(rows)} line(s) that are not a row"
    return rows if timings else [{k: v for k, v in row.items() if not _timing(k)} for row in rows]


def assert_same_metrics(run_a: Path | str, run_b: Path | str, steps: int) -> None:
    """Both runs wrote ``steps`` rows with the same keys, whose values agree to float tolerance (1e-4
    relative): what data-parallel or sharded workers owe one process (wall times and memory aside)."""
    import pytest  # tests only

    a, b = metrics(run_a, timings=False), metrics(run_b, timings=False)
    assert len(a) == len(b) == steps
    for row_a, row_b in zip(a, b):
        assert row_a.keys() == row_b.keys()
        for k in row_a:
            assert row_b[k] == pytest.approx(row_a[k], rel=1e-4, abs=1e-6), (row_a["step"], k)


def assert_same_state(a, b, where: str = "") -> None:
    """Two state trees (dicts of tensors and plain values, e.g. loaded checkpoints) equal exactly: the same
    keys, dtypes and bits."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where
