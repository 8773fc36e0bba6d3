"""The reference model never trains: kept in bf16 when its passes run under bf16 autocast, in
``model.dtype`` otherwise (where policy == reference must give KL 0 exactly), and under FSDP its root
resharded after each pass (FSDP2 keeps a root's weights gathered after a forward, for a backward)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from tiny_run import tiny_config
from torch.distributed.tensor import DTensor

from rlvr.models.precision import reference_dtype
from rlvr.models.tiny import tiny_model
from rlvr.training.trainer import Trainer


def test_reference_dtype_rule():
    assert reference_dtype("float32", True) == "bfloat16"
    assert reference_dtype("float32", False) == "float32"
    assert reference_dtype("bfloat16", False) == "bfloat16"


@pytest.mark.parametrize("autocast, want", [("true", torch.bfloat16), ("false", torch.float32)])
def test_the_trainer_loads_the_reference_in_its_dtype(tiny_dir, tmp_path, autocast, want):
    cfg = tiny_config(tiny_dir, tmp_path / "run", "algo.kl_coef=0.01", f"model.autocast_bf16={autocast}")
    trainer = Trainer(cfg)
    try:
        assert trainer.setup()
        assert {p.dtype for p in trainer.ref.parameters()} == {want}
        assert {p.dtype for p in trainer.policy.parameters()} == {torch.float32}  # the masters stay fp32
        for (k, p), r in zip(trainer.policy.named_parameters(), trainer.ref.parameters()):
            assert torch.equal(r, p.to(want)), k  # the same starting weights, cast
    finally:
        trainer.close()


def test_fsdp_reshards_the_reference_root_after_its_pass():
    from rlvr.distributed.fsdp import ShardedGroup

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        group = ShardedGroup(0, 1, "cpu", wait_for_rank0_s=60)
        ref = group.shard(tiny_model(seed=1).to(torch.bfloat16).eval().requires_grad_(False))
        root, layer = ref.model.embed_tokens, ref.model.layers[0].mlp.up_proj
        trainer = Trainer.__new__(Trainer)  # the reference() block alone: a sharded run's state
        trainer.adapter, trainer.ref, trainer.shards, trainer.group = None, ref, True, group
        with trainer.reference() as model, torch.no_grad():
            model(torch.tensor([[3, 4, 5, 6]]))
            model(torch.tensor([[7, 8]]))
            assert not isinstance(root.weight, DTensor)  # gathered through the block (no re-gather per pass)
            assert isinstance(layer.weight, DTensor)  # a layer reshards after its own forward
        assert isinstance(root.weight, DTensor) and isinstance(ref.lm_head.weight, DTensor)  # freed after it
    finally:
        dist.destroy_process_group()
