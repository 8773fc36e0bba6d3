"""``rlvr estimate``: the table without loading weights, one-line errors, and the R1-Zero presets,
which pass ``rlvr config`` and ``rlvr estimate`` with no model directory present."""

import pytest

from rlvr.cli import main


def test_estimate_table(cwd, capsys, tiny_model):
    assert main(["estimate", f"model.path={tiny_model}", "model.device=cpu"]) == 0
    out = capsys.readouterr().out
    for needle in [
        "parameters",
        "AdamW state",
        "gradients",
        "activations",
        "KV cache",
        "runtime",
        "peak",
        "fits a machine with",
    ]:
        assert needle in out, out
    assert not (cwd / "runs").exists()  # nothing written


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["model.path=nowhere/at-all"], "not a known architecture"),
        (["train.micro_batch_seqs=5"], "not divisible"),
        (["trian.lr=1"], "unknown config key 'trian.lr'"),
    ],
)
def test_estimate_errors_are_one_line(cwd, capsys, overrides, needle):
    assert main(["estimate", *overrides]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and needle in err, err


def test_r1_zero_7b_preset(cwd, capsys):
    assert main(["config", "--config", "r1_zero_qwen25_7b"]) == 0
    out = capsys.readouterr().out
    assert "lr: 5.0e-07" in out and "base_acc" in out and "max_new_tokens: 2048" in out
    assert main(["estimate", "--config", "r1_zero_qwen25_7b"]) == 0
    out = capsys.readouterr().out
    assert "Qwen/Qwen2.5-7B" in out and "7,616M parameters" in out and "reference" in out


def test_r1_zero_7b_preset_fits_80_gb_gpus_under_fsdp(cwd, capsys):
    """Full-parameter 7B: one replica per GPU needs far more than 80 GB; sharded over 8 FSDP workers each
    holds 1/8 of the weights, reference, gradients and AdamW state, and the per-GPU estimate is <= 70 GiB."""
    from rlvr.config import load_config
    from rlvr.estimate import GiB, estimate_config

    assert main(["estimate", "--config", "r1_zero_qwen25_7b"]) == 0
    out = capsys.readouterr().out
    assert "per worker of 8, sharded by FSDP" in out and "fits one 80 GiB GPU per worker (8 FSDP shards)" in out
    cfg = load_config("r1_zero_qwen25_7b")
    sharded, _ = estimate_config(cfg, device="cuda")
    replica, _ = estimate_config(load_config("r1_zero_qwen25_7b", ["distributed.strategy=ddp"]), device="cuda")
    assert sharded.total <= 70 * GiB < replica.total
    assert "static KV cache" in out  # on a GPU the static decode's cache is counted through the update
    item = lambda est, name: next(i.bytes for i in est.items if i.name == name)  # noqa: E731
    for name in ("parameters", "reference", "AdamW state", "gradients"):
        assert item(sharded, name) == item(replica, name) // 8, name
    assert item(sharded, "rollout copy") == item(replica, "rollout copy")  # each worker samples from a whole copy


def test_r1_zero_05b_lora_preset(cwd, capsys):
    assert main(["config", "--config", "r1_zero_qwen25_0.5b"]) == 0
    assert "rank: 64" in capsys.readouterr().out
    assert main(["estimate", "--config", "r1_zero_qwen25_0.5b"]) == 0
    out = capsys.readouterr().out
    assert "Qwen/Qwen2.5-0.5B" in out and "LoRA rank 64" in out and "fits one 8 GiB GPU" in out


def test_r1_zero_7b_lora_preset_fits_one_80_gb_gpu(cwd, capsys):
    """The 7B LoRA preset: the estimate (per GPU, one process) stays under 70 GiB of an 80 GB card."""
    from rlvr.config import load_config
    from rlvr.estimate import GiB, estimate_config

    assert main(["estimate", "--config", "r1_zero_qwen25_7b_lora"]) == 0
    out = capsys.readouterr().out
    assert "Qwen/Qwen2.5-7B" in out and "LoRA rank 64" in out and "fits one 80 GiB GPU" in out
    est, _ = estimate_config(load_config("r1_zero_qwen25_7b_lora"), device="cuda")
    assert est.total < 70 * GiB


def test_every_gpu_preset_counts_the_static_decode_cache_through_the_update():
    """The presets that name a CUDA device decode statically: their estimate holds the static cache
    resident (the budgets above are met with it counted), the dynamic decode's rollout-only cache none."""
    from pathlib import Path

    import rlvr
    from rlvr.config import load_config
    from rlvr.estimate import estimate_config

    presets = sorted(Path(rlvr.__file__).parent.glob("configs/*.yaml"))
    gpu = [p.stem for p in presets if load_config(p.stem).model.device.startswith("cuda")]
    assert {"r1_zero_qwen25_7b", "r1_zero_qwen25_7b_lora", "r1_zero_qwen25_0.5b"} <= set(gpu), gpu
    for name in gpu:
        est, _ = estimate_config(load_config(name))
        items = {i.name: i for i in est.items}
        assert items["static KV cache"].phase == "resident" and items["static KV cache"].bytes > 0, name
        assert items["KV cache"].bytes == 0, name


def test_without_a_network_estimate_falls_back_at_once(cwd, capsys, monkeypatch):
    """No network and no HF_HUB_OFFLINE: one probe of the hub's host, one line saying so, then the cache
    alone (huggingface_hub's retries with back-off took 27.5 s before the published shape was used)."""
    import socket

    import huggingface_hub
    from huggingface_hub import constants

    from rlvr import hub

    def no_network(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    calls = []
    real = huggingface_hub.hf_hub_download

    def download(*args, **kwargs):
        calls.append(kwargs.get("local_files_only", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    hub.unreachable.cache_clear()
    try:
        assert main(["estimate", "--config", "r1_zero_qwen25_7b"]) == 0
        assert main(["estimate", "--config", "r1_zero_qwen25_7b"]) == 0  # probed once per process
    finally:
        hub.unreachable.cache_clear()
    out, err = capsys.readouterr()
    assert "7,616M parameters" in out and "the published config of Qwen/Qwen2.5-7B" in out
    said = [line for line in err.splitlines() if "not reachable" in line]
    assert said == [
        "the Hugging Face hub is not reachable (huggingface.co:443 did not answer (Name or service not known)): "
        "reading its cache only; HF_HUB_OFFLINE=1 skips this check"
    ]
    assert calls and all(calls)  # the cache alone: no request was tried
