"""distributed.strategy=hsdp: 4 gloo ranks as 2 "nodes" x 2 shard within a node and replicate across
nodes (a 2-D device mesh), accumulate 2 micro-batches with no cross-node traffic, sum the node shards'
gradients across nodes once per optimizer step, and end 2 steps where one process does. Plain
processes, no Ray (seconds); the Ray run on two nodes is `extended` (test_two_nodes.py).

offload.params: FSDP2's CPUOffloadPolicy on 2 gloo ranks reaches every sharded parameter and trains
like one process. On a CPU it moves nothing (the shards already live in host memory); what it does on
a GPU (host-to-device copies, the AdamW step on the CPU) has not run."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tiny_run import assert_same_state

pytestmark = pytest.mark.slow

WORLD, PER_NODE, MICRO, STEPS = 4, 2, 2, 2  # WORLD: the slots of the global batch (a rank of 2 takes 2)
MAX_NORM = 0.02  # small enough that every step clips: the norm must be the global one


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batches() -> torch.Tensor:
    """[STEPS, WORLD, MICRO, 2 rows, 7 tokens]: rank r's micro-batches of each step."""
    return torch.randint(0, 100, (STEPS, WORLD, MICRO, 2, 7), generator=torch.Generator().manual_seed(11))


def _loss(model, ids: torch.Tensor) -> torch.Tensor:
    """A sum over the micro-batch divided by the whole step's element count (the trainer's global
    denominator), so summed gradients are the step's."""
    logits = model(ids).logits.float()
    return logits.pow(2).sum() / (logits.numel() * WORLD * MICRO)


def _model():
    from rlvr.models.tiny import tiny_model

    return tiny_model(seed=3, layers=2, hidden=32)


def _train(rank: int, world: int, per_node: int, offload: bool, port: int, out: str) -> None:
    """``world`` sharded ranks (HSDP with ``per_node`` > 0) train 2 steps on the global batch."""
    from torch.distributed.fsdp import FSDPModule

    from rlvr.distributed.fsdp import ShardedGroup

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = ShardedGroup(rank, world, "cpu", wait_for_rank0_s=120, workers_per_node=per_node)
    model = group.shard(_model(), offload=offload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    embed = model.get_input_embeddings().weight
    shard = per_node or world
    assert embed.device_mesh.size() == shard and embed.to_local().shape[0] == embed.shape[0] // shard
    fsdp = [m for m in model.modules() if isinstance(m, FSDPModule)]
    # the policy object reached every fully_shard call (FSDP2 keeps it per parameter)
    assert {p.offload_to_cpu for m in fsdp for g in m._get_fsdp_state()._fsdp_param_groups for p in g.fsdp_params} == {
        offload
    }
    slots = WORLD // world  # this rank's slots of the global batch

    crossed = {"backward": 0, "reduce_grads": 0}  # all-reduces over the cross-node group
    phase = ["backward"]
    all_reduce = dist.all_reduce

    def counting(tensor, *args, group=None, **kw):
        if group is not None and group is replicate:
            crossed[phase[0]] += 1
        return all_reduce(tensor, *args, group=group, **kw)

    replicate = group.replicate
    dist.all_reduce = counting
    losses = []
    for step, batch in enumerate(_batches()):
        total = torch.zeros(())
        phase[0] = "backward"
        for ids in batch[rank * slots : (rank + 1) * slots].flatten(0, 1):
            loss = _loss(model, ids)
            loss.backward()
            total += loss.detach()
        phase[0] = "reduce_grads"
        group.reduce_grads(model)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).full_tensor()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append((group.sum(total), norm))
    dist.all_reduce = all_reduce
    group.save(Path(out) / "ckpt", model, optimizer)  # both nodes hold each shard: DCP writes it once
    saved = _full(model, optimizer)
    if rank == 0:
        torch.save({"losses": losses, "crossed": crossed, "saved": saved}, Path(out) / "trained.pt")
    dist.destroy_process_group()


def _full(model, optimizer) -> dict:
    """The whole policy and AdamW state (every rank takes part)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {"model": model_sd, "optim": optim_sd}


def _load_flat(rank: int, port: int, out: str) -> None:
    """2 flat FSDP ranks load the HSDP checkpoint (resuming on another strategy and worker count)."""
    from rlvr.distributed.fsdp import ShardedGroup

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = ShardedGroup(rank, 2, "cpu", wait_for_rank0_s=120)
    model = group.shard(_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 100, (1, 3))).logits.sum().backward()  # AdamW state exists before it is loaded
    optimizer.step()
    group.load(Path(out) / "ckpt", model, optimizer)
    full = _full(model, optimizer)
    if rank == 0:
        torch.save(full, Path(out) / "loaded.pt")
    dist.destroy_process_group()


def _one_process() -> tuple[dict, list]:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for batch in _batches():
        total = torch.zeros(())
        for ids in batch.flatten(0, 1):  # every rank's micro-batches, in one process
            loss = _loss(model, ids)
            loss.backward()
            total += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append((total, norm))
    return model.state_dict(), losses


def _same_as_one_process(got: dict) -> None:
    weights, losses = _one_process()
    for (loss, norm), (want_loss, want_norm) in zip(got["losses"], losses):
        torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(norm, want_norm, rtol=1e-4, atol=1e-6)
        assert norm > MAX_NORM  # clipped
    assert got["saved"]["model"].keys() == weights.keys()
    for k, w in weights.items():
        torch.testing.assert_close(got["saved"]["model"][k], w, rtol=1e-4, atol=1e-5, msg=k)


def test_hsdp_on_2_nodes_of_2_equals_one_process(tmp_path):
    mp.spawn(_train, args=(WORLD, PER_NODE, False, _port(), str(tmp_path)), nprocs=WORLD)
    got = torch.load(tmp_path / "trained.pt")
    # within a step no collective crosses nodes; one bucket of node shards does, per optimizer step
    assert got["crossed"] == {"backward": 0, "reduce_grads": STEPS}, got["crossed"]
    _same_as_one_process(got)

    # the checkpoint: every parameter and AdamW moment exactly, loaded by 2 flat FSDP ranks
    mp.spawn(_load_flat, args=(_port(), str(tmp_path)), nprocs=2)
    assert_same_state(got["saved"], torch.load(tmp_path / "loaded.pt"))


def test_cpu_offload_policy_reaches_the_shards_and_trains_like_one_process(tmp_path):
    mp.spawn(_train, args=(2, 0, True, _port(), str(tmp_path)), nprocs=2)
    got = torch.load(tmp_path / "trained.pt")
    assert got["crossed"] == {"backward": 0, "reduce_grads": 0}  # flat FSDP: no cross-node group
    _same_as_one_process(got)
