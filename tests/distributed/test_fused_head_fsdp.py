"""The fused LM-head log-probs under FSDP2: the head's weight is whole only inside the root module's
forward, where pass_logprobs swaps the head; values and the full gradients of every parameter equal
the full-logits path on two gloo processes (tied and untied heads), and the state dict is unchanged.
The one-pass shared prompt (each group's prompt and rows in one forward) runs under FSDP2 too, and
equals the per-row pass."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        import rlvr.algos.logprobs as logprobs_mod
        from rlvr.distributed.fsdp import decoder_layers
        from rlvr.models.forward import fused_head, pass_logprobs
        from rlvr.models.tiny import tiny_model, tiny_qwen2

        # several tiles, recomputed in the backward (the weight must be gathered again there)
        logprobs_mod.HEAD_CHUNK_TOKENS, logprobs_mod.HEAD_CHUNK_VOCAB, logprobs_mod.HEAD_KEEP_LOGITS_BYTES = 5, 32, 0
        mesh = init_device_mesh("cpu", (world,))
        for make in (tiny_model, tiny_qwen2):
            got = {}
            for fused, G in ((True, 1), (False, 1), ("shared", 2)):
                model = make()
                keys = list(model.state_dict())
                for layer in decoder_layers(model):
                    fully_shard(layer, mesh=mesh)
                fully_shard(model, mesh=mesh)
                assert fused_head(model) is not None
                ids = torch.randint(2, 100, (4, 12), generator=torch.Generator().manual_seed(rank))
                ids[1::2, :6] = ids[::2, :6]  # two groups of two rows, each sharing its prompt
                kw = dict(temperature=0.7, entropy=True, entropy_grad=True, fused=fused is not False, group_size=G)
                logp, ent = pass_logprobs(model, ids, torch.ones_like(ids), ids[:, 6:], **kw)
                ((logp * torch.linspace(-1, 1, 6)).sum() + 0.3 * ent.sum()).backward()
                grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
                got[fused] = (logp.detach(), grads)
                assert list(model.state_dict()) == keys
            for side in (True, "shared"):
                torch.testing.assert_close(got[side][0], got[False][0], rtol=1e-5, atol=1e-5)
                for name, g in got[False][1].items():
                    torch.testing.assert_close(got[side][1][name], g, rtol=1e-4, atol=1e-6, msg=f"{side} {name}")
    finally:
        dist.destroy_process_group()


def test_fused_head_under_fsdp2_equals_the_full_logits():
    if not dist.is_gloo_available():
        pytest.skip("no gloo backend")
    mp.spawn(_worker, args=(2, _free_port()), nprocs=2)
