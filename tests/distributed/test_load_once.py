"""Sharded loading reads the weights once: rank 0 reads the checkpoint into host memory, the other ranks
build the model on the meta device, every rank shards it, and rank 0's weights are broadcast into the
shards one tensor at a time (``ShardedGroup.shard_loaded``). On 2 gloo ranks, for a tiny Llama with tied
embeddings and a tiny Qwen2 (q/k/v biases, untied head) saved to a folder: rank 1 never calls
``from_pretrained`` and never creates a tensor larger than the largest parameter; every rank's whole
state, rotary ``inv_freq`` buffers included, equals the file's bit for bit; the head stays tied; one
AdamW step equals one process's; also with the shards offloaded and under HSDP. Through the Trainer:
the rollout copy filled from the shards is the file's, and its first rollout on rank 1 samples what
rank 0 samples for the same seeds. Plain processes, no Ray (seconds)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tiny_run import FORMAT_REWARD, tiny_args

from rlvr.models.tiny import save_tiny_model, tiny_model, tiny_qwen2

pytestmark = pytest.mark.slow

WORLD = 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch() -> torch.Tensor:
    """[WORLD, 2 rows, 7 tokens]: rank r's rows of the step."""
    return torch.randint(0, 100, (WORLD, 2, 7), generator=torch.Generator().manual_seed(7), device="cpu")  # gloo ranks


def _loss(model, ids: torch.Tensor) -> torch.Tensor:
    """A sum over the rows divided by the whole step's element count, so summed gradients are the step's."""
    logits = model(ids).logits.float()
    return logits.pow(2).sum() / (logits.numel() * WORLD)


def _never_whole() -> None:
    """In this process, any whole-model read from a checkpoint fails (rank 1 must receive its shards)."""
    from transformers import AutoModelForCausalLM, PreTrainedModel

    def refuse(*args, **kwargs):
        raise AssertionError("rank 1 read a whole model (from_pretrained)")

    PreTrainedModel.from_pretrained = classmethod(refuse)
    AutoModelForCausalLM.from_pretrained = classmethod(refuse)


class _Largest(torch.utils._python_dispatch.TorchDispatchMode):
    """The largest tensor (elements) any operation returned while active: no whole model in one."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.numel = max(self.numel, t.numel())
        return out


def _shard_loaded(rank: int, port: int, model_dir: str, out: str, per_node: int, offload: bool) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    from rlvr.distributed.fsdp import ShardedGroup
    from rlvr.models.loading import empty_model, load_model

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    group = ShardedGroup(rank, WORLD, "cpu", wait_for_rank0_s=120, workers_per_node=per_node)
    if rank != 0:
        _never_whole()
    model = empty_model(Path(model_dir))
    assert all(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))
    largest = _Largest()
    with largest:
        group.shard_loaded(model, lambda: load_model(Path(model_dir)), offload=offload)
    if rank != 0:  # its shards and the one tensor being broadcast, never a whole model
        assert largest.numel <= max(p.numel() for p in model.parameters()), largest.numel
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == model.config.tie_word_embeddings
    whole = StateDictOptions(full_state_dict=True)
    loaded = {k: v.clone() for k, v in get_model_state_dict(model, options=whole).items()}  # before AdamW steps
    buffers = {k: b.clone() for k, b in model.named_buffers()}

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _loss(model, _batch()[rank]).backward()
    group.reduce_grads(model)  # HSDP: the node shards' sum across "nodes"
    optimizer.step()
    trained = get_model_state_dict(model, options=whole)
    torch.save({"loaded": loaded, "buffers": buffers, "trained": trained}, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "make, per_node, offload",
    [(tiny_model, 0, False), (tiny_qwen2, 0, True), (tiny_model, 1, False)],
    ids=["llama-tied", "qwen2-offloaded", "llama-tied-hsdp"],
)
def test_rank0_reads_the_weights_and_every_rank_holds_the_files_exactly(tmp_path, make, per_node, offload):
    """FSDP over both ranks, with the shards offloaded (CPUOffloadPolicy: on a CPU they stay in host
    memory), and HSDP as 2 "nodes" of 1 (a 2-D mesh: each rank holds its node's whole shard)."""
    from rlvr.models.loading import load_model

    model_dir = tmp_path / "m"
    make(seed=3).save_pretrained(model_dir)
    mp.spawn(_shard_loaded, args=(_port(), str(model_dir), str(tmp_path), per_node, offload), nprocs=WORLD)

    one = load_model(model_dir)  # the file, as one process reads it
    want = {k: v.clone() for k, v in one.state_dict().items()}  # before the step below
    want_buffers = dict(one.named_buffers())
    assert any("inv_freq" in k for k in want_buffers) and not any("inv_freq" in k for k in want)
    optimizer = torch.optim.AdamW(one.parameters(), lr=1e-2)
    for ids in _batch():  # every rank's rows, in one process
        _loss(one, ids).backward()
    optimizer.step()
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["loaded"].keys() == want.keys()
        for k, w in want.items():
            assert torch.equal(got["loaded"][k], w), (rank, k)
        assert got["buffers"].keys() == want_buffers.keys()
        for k, w in want_buffers.items():  # non-persistent: in no state dict, broadcast from rank 0
            assert torch.equal(got["buffers"][k], w), (rank, k)
        for k, w in one.state_dict().items():
            torch.testing.assert_close(got["trained"][k], w, rtol=1e-5, atol=1e-5, msg=k)


def _trainer(rank: int, port: int, args: list[str], out: str) -> None:
    from rlvr.config import load_config
    from rlvr.distributed.fsdp import ShardedGroup
    from rlvr.training import setup as setup_module
    from rlvr.training import trainer as trainer_module

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    group = ShardedGroup(rank, WORLD, "cpu", wait_for_rank0_s=120)
    if rank != 0:
        _never_whole()

        def refuse(*a, **kw):
            raise AssertionError("rank 1 loaded a whole model")

        setup_module.load_model = refuse  # where the trainer's setup reads it
    trainer = trainer_module.Trainer(load_config(None, args), group=group)
    assert trainer.setup()
    engine = trainer.engine
    assert engine.model is not trainer.policy and engine.gathered
    copy = {k: v.clone() for k, v in engine.model.state_dict().items()}
    buffers = {k: b.clone() for k, b in engine.model.named_buffers()}
    tied = engine.model.lm_head.weight is engine.model.model.embed_tokens.weight
    batch = engine.generate(["what is 7 + 7 ?", "2 + 2 = ?"], 2, seeds=[11, 12, 13, 14])
    torch.save(
        {"tokens": batch.input_ids, "copy": copy, "buffers": buffers, "tied": tied, "has_ref": trainer.ref is not None},
        Path(out) / f"trainer{rank}.pt",
    )
    trainer.close()
    dist.destroy_process_group()


def test_the_rollout_copy_filled_from_the_shards_samples_alike_on_every_rank(tmp_path):
    """The trainer's wiring: rank 1 loads nothing whole; the engine's copy is the file's and its first
    rollout after loading (no update yet) is rank 0's, token for token."""
    from rlvr.models.loading import load_model

    model_dir = save_tiny_model(tmp_path / "m", seed=3)
    args = tiny_args(
        model_dir, tmp_path / "run", *FORMAT_REWARD, "reward.workers=0", "eval.at_start=false",
        "eval.at_end=false", "algo.kl_coef=0.01", "model.autocast_bf16=false", "distributed.backend=ray",
        f"distributed.num_workers={WORLD}", "distributed.strategy=fsdp",
    )  # fmt: skip
    mp.spawn(_trainer, args=(_port(), args, str(tmp_path)), nprocs=WORLD)

    one = load_model(model_dir)
    want = torch.load(tmp_path / "trainer0.pt")["tokens"]
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"trainer{rank}.pt")
        assert got["tied"] and got["has_ref"]
        for k, w in one.state_dict().items():
            assert torch.equal(got["copy"][k], w), (rank, k)
        for k, w in one.named_buffers():
            assert torch.equal(got["buffers"][k], w), (rank, k)
        assert torch.equal(got["tokens"], want), rank
