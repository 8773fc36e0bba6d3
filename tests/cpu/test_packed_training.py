"""Training with oneDNN-packed linear weights (model.packed_weights, rlvr.cpu.packed) takes the steps that
training without them takes, to float rounding: the same samples, rewards, losses and final weights."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file
from tiny_run import metrics, tiny_args, tiny_config

from rlvr.cpu import packed as packed_module
from rlvr.cpu.packed import packing_available
from rlvr.training import train

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN prepacked linear")


@pytest.mark.parametrize("train_path", [True, False], ids=["packed-update", "packed-sampling-only"])
@pytest.mark.parametrize("extra", [(), ("algo.num_iterations=2",)], ids=["one-update", "two-updates-per-rollout"])
def test_packed_training_equals_plain_training(tiny_dir, tmp_path, extra, train_path, monkeypatch):
    """Both the AVX-512 choice (the update on packed weights too) and the AVX2 one (sampling and no-grad
    passes only), whatever this CPU dispatches."""
    monkeypatch.setattr(packed_module, "packed_training_pays", lambda: train_path)
    runs = {}
    for packed in ("true", "false"):
        run_dir = tmp_path / packed
        train(
            tiny_config(
                tiny_dir,
                run_dir,
                "train.steps=3",
                f"model.packed_weights={packed}",
                "model.autocast_bf16=false",
                *extra,
            )
        )
        runs[packed] = (
            metrics(run_dir, timings=False),
            load_file(run_dir / "checkpoints" / "last" / "model.safetensors"),
        )
    (a, wa), (b, wb) = runs["true"], runs["false"]
    assert [r["rollout/reward_mean"] for r in a] == [r["rollout/reward_mean"] for r in b]  # the same samples
    for row_a, row_b in zip(a, b):
        assert row_a == pytest.approx(row_b, rel=1e-3, abs=1e-5), row_a["step"]
    start = load_file(tiny_dir / "model.safetensors")
    assert any(not torch.equal(wa[k], start[k]) for k in wa)  # it trained
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5, msg=k)


def _refuse_bf16(monkeypatch) -> str:
    """What the bf16 probe says on a CPU without the features oneDNN's bf16 reorder needs: the real
    answer here if this CPU lacks them, else a faked one (patched where the trainer and engine read it)."""
    why = packed_module.dtype_unpackable(torch.bfloat16)
    if why is None:
        why = "oneDNN cannot pack bfloat16 weights on this CPU: it needs avx512bw+avx512vl+avx512dq or avx_ne_convert"
        real = packed_module.dtype_unpackable
        fake = lambda d: why if d == torch.bfloat16 else real(d)  # noqa: E731
        monkeypatch.setattr(packed_module, "dtype_unpackable", fake)
        monkeypatch.setattr("rlvr.training.setup.dtype_unpackable", fake)
    return why


def test_a_bf16_rollout_trains_unpacked_where_onednn_cannot_pack_bf16(tiny_dir, tmp_path, monkeypatch):
    """auto: trains, with one line saying the bf16 rollout runs unpacked and why; the fp32 policy still packs."""
    why = _refuse_bf16(monkeypatch)
    run_dir = tmp_path / "run"
    buf = io.StringIO()
    train(
        tiny_config(
            tiny_dir,
            run_dir,
            "train.steps=2",
            "rollout.dtype=bfloat16",
            "model.packed_weights=auto",
            "model.autocast_bf16=false",
            "log.progress=true",
        ),
        console=Console(file=buf, width=400),
    )
    out = buf.getvalue()
    assert f"model.packed_weights=auto: the bfloat16 rollout runs unpacked ({why})" in out
    assert len(metrics(run_dir)) == 2


def test_packed_weights_true_with_a_bf16_rollout_is_one_error_naming_the_cpu_feature(
    tiny_dir, tmp_path, monkeypatch, capsys
):
    from rlvr.cli import main

    _refuse_bf16(monkeypatch)
    rc = main(
        [
            "train",
            *tiny_args(
                tiny_dir,
                tmp_path / "run",
                "rollout.dtype=bfloat16",
                "model.packed_weights=true",
                "train.steps=1",
                "reward.rules=[format_partial]",
                "reward.accuracy_rule=format_partial",
            ),
        ]
    )
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.startswith("error")]
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("error: model.packed_weights=true: oneDNN cannot pack bfloat16 weights on this CPU")
    assert "avx512bw+avx512vl+avx512dq or avx_ne_convert" in err[0] and "model.packed_weights=auto or false" in err[0]
