"""distributed.strategy=fsdp on a torch without the FSDP2 calls rlvr makes: one line naming the torch
version, before Ray starts, and the same floor in pyproject.toml (the calls are taken away here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch.distributed.fsdp as fsdp

from rlvr.config import load_config
from rlvr.distributed.versions import FSDP_TORCH, fsdp_missing, require_fsdp
from rlvr.errors import UserError

FSDP = ("distributed.backend=ray", "distributed.num_workers=2", "distributed.strategy=fsdp")


def test_this_torch_has_every_call():
    assert fsdp_missing() == []
    require_fsdp()


@pytest.mark.parametrize(
    "owner, name",
    [
        (fsdp.FSDPModule, "set_force_sum_reduction_for_comms"),
        (fsdp.FSDPModule, "set_gradient_divide_factor"),
        (fsdp, "fully_shard"),
    ],  # fmt: skip
)
def test_a_missing_call_is_one_line_naming_the_version_before_ray_starts(monkeypatch, tmp_path, owner, name):
    ray = pytest.importorskip("ray")
    from rlvr.distributed.driver import RayTrainer

    monkeypatch.delattr(owner, name)
    with pytest.raises(UserError) as err:
        require_fsdp()
    line = str(err.value)
    assert "\n" not in line and f"torch>={FSDP_TORCH}" in line and name in line, line
    assert "distributed.strategy=ddp" in line
    cfg = load_config(None, [*FSDP, f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(UserError, match=rf"^distributed.strategy=fsdp needs torch>={re.escape(FSDP_TORCH)} "):
        RayTrainer(cfg).setup()
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


def test_pyproject_floor_is_the_fsdp_version():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert re.findall(r'^\s*"(torch[^"]*)"', text, re.MULTILINE) == [f"torch>={FSDP_TORCH}"]
