"""rollout.engine and offload.*: the keys veRL/OpenRLHF users look for. What rlvr has not built (the
vLLM engine) is a one-line error at config load, from the loader and the CLI (offload.*:
tests/config/test_offload_config.py)."""

from __future__ import annotations

import pytest

from rlvr.choices import Engine
from rlvr.cli import main
from rlvr.config import all_keys, load_config
from rlvr.errors import UserError

NOT_BUILT = [
    ("rollout.engine=vllm", ["rollout.engine=vllm", "vLLM engine is not built", "NVIDIA GPU", "use rollout.engine=hf"]),
]


def test_defaults_are_what_rlvr_runs():
    cfg = load_config(None, [])
    assert cfg.rollout.engine == Engine.HF and str(cfg.rollout.engine) == "hf"
    assert (cfg.offload.reference, cfg.offload.optimizer) == (False, False)
    assert {"rollout.engine", "offload.reference", "offload.optimizer"} <= set(all_keys())


def test_the_built_values_load():
    cfg = load_config(None, ["rollout.engine=hf", "offload.reference=false", "offload.optimizer=false"])
    assert cfg.rollout.engine == Engine.HF and not cfg.offload.reference and not cfg.offload.optimizer


@pytest.mark.parametrize("override, needles", NOT_BUILT)
def test_what_is_not_built_fails_at_config_load_with_one_line(override, needles):
    with pytest.raises(UserError) as e:
        load_config(None, [override])
    assert "\n" not in str(e.value)
    for needle in needles:
        assert needle in str(e.value), str(e.value)


def test_an_unknown_engine_lists_the_engines():
    with pytest.raises(UserError, match="rollout.engine=sglang: must be one of hf, vllm"):
        load_config(None, ["rollout.engine=sglang"])


@pytest.mark.parametrize("command", ["train", "config", "estimate"])
@pytest.mark.parametrize("override, needles", NOT_BUILT)
def test_the_cli_exits_2_with_one_line(cwd, capsys, command, override, needles):
    assert main([command, "run_dir=r", override]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert all(needle in err for needle in needles), err
    assert not (cwd / "r").exists()


def test_estimate_and_config_work_with_the_hf_engine(cwd, capsys, tiny_model):
    keys = ["rollout.engine=hf", "offload.reference=false", "offload.optimizer=false"]
    assert main(["config", *keys]) == 0
    out = capsys.readouterr().out
    assert "  engine: hf\n" in out and "offload:\n  reference: false\n  optimizer: false\n" in out
    assert main(["estimate", f"model.path={tiny_model}", "model.device=cpu", *keys]) == 0
    assert "peak" in capsys.readouterr().out
