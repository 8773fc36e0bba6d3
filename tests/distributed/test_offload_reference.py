"""offload.reference: the reference sharded with FSDP2's CPUOffloadPolicy. On 2 gloo ranks the policy
reaches every shard and the reference's log-probs are those of one unsharded process, before and after
its root is resharded; the trainer reads the reference into host memory and passes the policy. On a
CPU the policy moves nothing (the shards already live in host memory); what it does on a GPU (the
host-to-device copy of each layer for its all-gather) has not run."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlvr.algos import token_logprobs
from rlvr.models.tiny import tiny_model

pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch() -> torch.Tensor:
    """[2 passes, 2 rows, 9 tokens]: the same on every rank, as a reference pass is."""
    return torch.randint(0, 100, (2, 2, 9), generator=torch.Generator().manual_seed(5))


@torch.no_grad()
def _logp(model) -> torch.Tensor:
    """[2 passes, 2 rows, 8] the reference's log-probs of each next token."""
    return torch.stack([token_logprobs(model(ids).logits[:, :-1], ids[:, 1:]) for ids in _batch()])


def _reference(rank: int, world: int, port: int, out: str) -> None:
    from torch.distributed.fsdp import FSDPModule

    from rlvr.distributed.fsdp import ShardedGroup

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = ShardedGroup(rank, world, "cpu", wait_for_rank0_s=120)
    ref = group.shard(tiny_model(seed=3, layers=2, hidden=32).eval().requires_grad_(False), offload=True)
    fsdp = [m for m in ref.modules() if isinstance(m, FSDPModule)]
    params = [p for m in fsdp for g in m._get_fsdp_state()._fsdp_param_groups for p in g.fsdp_params]
    assert params and all(p.offload_to_cpu for p in params)  # the policy reached every fully_shard call
    first = _logp(ref)
    group.reshard(ref)  # the root's whole weights freed, as the trainer does after each reference block
    embed = ref.get_input_embeddings().weight
    assert embed.to_local().shape[0] == embed.shape[0] // world
    second = _logp(ref)
    if rank == 0:
        torch.save({"first": first, "second": second}, Path(out) / "logp.pt")
    dist.destroy_process_group()


def test_an_offloaded_reference_gives_the_log_probs_of_one_process(tmp_path):
    mp.spawn(_reference, args=(2, _port(), str(tmp_path)), nprocs=2)
    got = torch.load(tmp_path / "logp.pt")
    want = _logp(tiny_model(seed=3, layers=2, hidden=32).eval())
    torch.testing.assert_close(got["first"], want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got["second"], want, atol=1e-5, rtol=0)


def test_the_trainer_reads_an_offloaded_reference_to_the_host_and_passes_the_policy(monkeypatch):
    """The wiring of :meth:`Trainer._shard_models` (GPU workers: no process group, no GPU needed): rank 0
    reads the policy and the reference whole into host memory (load_model's default device) and
    each is sharded, the reference's shards offloaded with ``offload.reference``."""
    pytest.importorskip("ray")
    import rlvr.training.setup as setup_module
    import rlvr.training.trainer as trainer_module
    from rlvr.config import load_config

    gpu_fsdp = [
        "distributed.backend=ray",
        "distributed.num_workers=2",
        "distributed.strategy=fsdp",
        "distributed.gpus_per_worker=1",
        "model.device=cuda",
        "algo.kl_coef=0.01",
    ]
    loaded, sharded = [], []
    monkeypatch.setattr(setup_module, "load_model", lambda path, **kw: loaded.append(kw) or torch.nn.Linear(1, 1))
    monkeypatch.setattr(setup_module, "empty_model", lambda path, **kw: torch.nn.Linear(1, 1, device="meta"))

    class Group:  # rank 0's view: it calls the loader
        def shard_loaded(self, model, load, **kw):
            load()
            sharded.append((model, kw))
            return model

    for offload in (False, True):
        loaded.clear(), sharded.clear()
        t = trainer_module.Trainer.__new__(trainer_module.Trainer)
        t.cfg = load_config(None, [*gpu_fsdp, f"offload.reference={str(offload).lower()}"])
        t.group, t.device, t.adapter, t.model_path, t.policy = Group(), torch.device("cuda"), None, "m", object()
        t.shards = True
        t.printer = type("Printer", (), {"note": lambda self, line: None})()
        t._shard_models()
        assert loaded == [{"dtype": "float32"}, {"dtype": "float32"}]  # policy, reference: no device, the host
        (policy, policy_kw), (ref, ref_kw) = sharded
        assert policy is t.policy and ref is t.ref and not ref.weight.requires_grad
        assert ref_kw["offload"] is offload and policy_kw["offload"] is False
