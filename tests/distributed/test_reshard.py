"""A sharded (DCP) checkpoint written by 2 FSDP ranks loads exactly on 3: policy and AdamW state, each
rank reading the parts it now holds. Written in the background (``dcp.async_save``): the checkpoint's
rename runs only once every rank's shards are on disk. Processes over gloo, no Ray (seconds)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tiny_run import assert_same_state

pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sharded(rank: int, world: int, port: int):
    """(group, sharded tiny model, its AdamW), the same on every rank."""
    from rlvr.distributed.fsdp import ShardedGroup
    from rlvr.models.tiny import tiny_model

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = ShardedGroup(rank, world, "cpu", wait_for_rank0_s=120)
    model = group.shard(tiny_model(seed=3, layers=3, hidden=48))
    return group, model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)


def _full(model, optimizer) -> dict:
    """The whole policy and AdamW state (rank 0's; every rank takes part)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {"model": model_sd, "optim": optim_sd}


def _save(rank: int, world: int, port: int, out: str) -> None:
    group, model, optimizer = _sharded(rank, world, port)
    torch.manual_seed(100 + rank)  # each rank its own batch, as data-parallel ranks have
    for _ in range(2):
        model(torch.randint(0, 100, (2, 7))).logits.float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    ckpt = Path(out) / "ckpt"

    def renamed():  # rank 0's commit: every rank's shards and DCP's metadata must be there already
        files = sorted(p.name for p in ckpt.iterdir())
        (Path(out) / "seen_at_commit").write_text(" ".join(files))

    group.save(ckpt, model, optimizer, background=True, then=renamed if rank == 0 else None)
    saved = _full(model, optimizer)  # the state at the save (AdamW's step counters are the live tensors)
    if rank == 0:
        torch.save(saved, Path(out) / "saved.pt")
    model(torch.randint(0, 100, (2, 7))).logits.float().pow(2).mean().backward()
    optimizer.step()  # training goes on while the shards are written: the checkpoint must not see it
    group.wait_saved()
    dist.destroy_process_group()


def _load(rank: int, world: int, port: int, out: str) -> None:
    group, model, optimizer = _sharded(rank, world, port)
    model(torch.randint(0, 100, (1, 3))).logits.sum().backward()  # AdamW state exists before it is loaded
    optimizer.step()
    group.load(Path(out) / "ckpt", model, optimizer)
    full = _full(model, optimizer)
    if rank == 0:
        torch.save(full, Path(out) / f"loaded_{world}.pt")
    dist.destroy_process_group()


def test_a_checkpoint_of_2_ranks_resumes_exactly_on_3(tmp_path):
    mp.spawn(_save, args=(2, _port(), str(tmp_path)), nprocs=2)
    seen = (tmp_path / "seen_at_commit").read_text().split()
    assert ".metadata" in seen and len([f for f in seen if f.endswith(".distcp")]) == 2, seen
    mp.spawn(_load, args=(3, _port(), str(tmp_path)), nprocs=3)
    saved, loaded = torch.load(tmp_path / "saved.pt"), torch.load(tmp_path / "loaded_3.pt")
    assert saved["optim"]["state"], "AdamW state was saved"
    assert_same_state(saved, loaded)


def test_a_failed_background_write_is_one_line_and_the_previous_checkpoint_stays(tmp_path):
    from concurrent.futures import Future

    from rlvr.distributed.fsdp import ShardedGroup
    from rlvr.errors import UserError

    group = ShardedGroup.__new__(ShardedGroup)  # wait_saved alone: no process group needed
    failed = Future()
    failed.set_exception(OSError(28, "No space left on device"))
    group.pending = (tmp_path / ".step_000004.tmp-1" / "fsdp", failed)
    with pytest.raises(UserError) as err:
        group.wait_saved()
    line = str(err.value)
    assert "\n" not in line and line.startswith("writing the checkpoint step_000004 in the background failed")
    assert "No space left on device" in line and "the previous checkpoint is intact" in line
    assert group.pending is None
    group.wait_saved()  # nothing pending: returns
