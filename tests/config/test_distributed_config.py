"""The distributed section: defaults, and one-line errors for what Ray cannot run."""

from __future__ import annotations

import importlib.util

import pytest

from rlvr.choices import Backend
from rlvr.config import load_config
from rlvr.errors import UserError

RAY = ("distributed.backend=ray",)


def test_default_is_one_process():
    d = load_config(None, []).distributed
    assert (d.backend, d.num_workers, d.address, d.cpus_per_worker, d.gpus_per_worker) == (
        Backend.NONE,
        1,
        "local",
        1.0,
        0.0,
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("distributed.num_workers=2",), "distributed.num_workers=2 needs distributed.backend=ray"),
        (("distributed.backend=spark",), "distributed.backend=spark: must be one of none, ray"),
        ((*RAY, "distributed.num_workers=0"), "distributed.num_workers must be >= 1"),
        ((*RAY, "distributed.num_workers=3"), "train.prompts_per_step=4 is not divisible by distributed.num_workers=3"),
        (
            (
                *RAY,
                "distributed.num_workers=2",
                "train.prompts_per_step=6",
                "rollout.samples_per_prompt=4",
                "train.micro_batch_seqs=8",
            ),
            "each of the 2 workers trains on 12 sequences per step, not divisible by train.micro_batch_seqs=8",
        ),
        (
            (*RAY, "distributed.gpus_per_worker=1", "model.device=cpu"),
            "model.device=cpu with distributed.gpus_per_worker=1.0",
        ),
        ((*RAY, "distributed.cpus_per_worker=0"), "distributed.cpus_per_worker must be > 0"),
    ],
)
def test_bad_distributed_settings_fail_with_one_line(overrides, message):
    with pytest.raises(UserError, match=message) as e:
        load_config(None, list(overrides))
    assert "\n" not in str(e.value)


def test_ray_not_installed_says_how_to_get_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(UserError, match=r"needs Ray, which is not installed: pip install ray"):
        load_config(None, list(RAY))
    load_config(None, [])  # without Ray, one process still works


def test_two_workers_split_the_quickstart():
    cfg = load_config(None, [*RAY, "distributed.num_workers=2", "distributed.address=auto"])
    assert cfg.distributed.num_workers == 2 and cfg.distributed.address == "auto"
