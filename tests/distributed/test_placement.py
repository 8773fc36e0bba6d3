"""Where Ray workers run and what they read (rlvr.distributed.placement), without a GPU or a second node:
the device from the GPU Ray assigned, absolute paths, and the shared-run-directory check."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.config import load_config
from rlvr.distributed.placement import absolute_paths, check_shared, mark_shared, unmark, worker_device
from rlvr.errors import UserError


@pytest.mark.parametrize(
    "setting, gpu_ids, want",
    [
        ("cuda", [3], "cuda:0"),  # the bug: torch.cuda.set_device(torch.device("cuda")) raised on every GPU worker
        ("cuda:5", [5], "cuda:0"),  # Ray's CUDA_VISIBLE_DEVICES makes the assigned GPU the first visible one
        ("auto", [0], "cuda:0"),
        ("auto", [], "cpu"),  # a CPU worker, whatever the driver's head node has
        ("cpu", [], "cpu"),
    ],
)
def test_a_worker_takes_its_device_from_the_gpu_ray_assigned(setting, gpu_ids, want):
    assert worker_device(setting, gpu_ids) == want


def test_a_gpu_setting_without_a_reserved_gpu_or_the_reverse_is_one_line():
    with pytest.raises(UserError, match="needs a GPU each: set distributed.gpus_per_worker=1"):
        worker_device("cuda", [])
    with pytest.raises(UserError, match="model.device=cpu, but distributed.gpus_per_worker reserves GPUs"):
        worker_device("cpu", [0])


def test_relative_paths_become_absolute_before_they_leave_the_driver(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    (tmp_path / "my_reward.py").write_text("def r(c, l, **f):\n    return [0.0] * len(c)\n")
    (tmp_path / "model").mkdir()
    cfg = load_config(
        None,
        [
            "model.path=model",
            "data.task=files",
            "data.path=data/train.jsonl,data/*.jsonl",
            "reward.rules=[accuracy,my_reward.py:r]",
            "reward.weights=[1.0,1.0]",
            "run_dir=runs/x",
            "eval.data=arithmetic",
        ],
    )
    out = absolute_paths(cfg, tmp_path)
    assert out.model.path == str(tmp_path / "model")
    assert out.data.path == f"{tmp_path / 'data' / 'train.jsonl'},{tmp_path / 'data' / '*.jsonl'}"
    assert out.reward.rules == ["accuracy", f"{tmp_path / 'my_reward.py'}:r"]
    assert out.run_dir == str(tmp_path / "runs" / "x")  # need not exist yet
    assert out.eval.data == "arithmetic" and out.resume is None  # a task name is not a path
    builtin = absolute_paths(load_config(None, []), tmp_path)
    assert builtin.model.path == "smollm2-135m-instruct"


def test_every_rank_must_see_rank_0s_run_directory(tmp_path):
    shared, elsewhere = tmp_path / "run", tmp_path / "other-node-view"
    shared.mkdir()
    elsewhere.mkdir()
    name = mark_shared(shared)
    check_shared(shared, name, rank=1)  # the same filesystem: seen
    with pytest.raises(UserError, match=r"run_dir=.*other-node-view is not shared: rank 1 on .* cannot see"):
        check_shared(elsewhere, name, rank=1)  # a node with its own disk: not seen
    unmark(shared, name)
    assert not list(Path(shared).iterdir())


def test_hsdp_places_one_strictly_packed_group_per_node_with_contiguous_ranks():
    from rlvr.distributed.placement import placement

    assert placement(4) == ("PACK", [4], [(0, 0), (0, 1), (0, 2), (0, 3)])  # ddp, fsdp: one group
    # hsdp, 2 nodes x 2: ranks 0-1 on one node, 2-3 on the other; ShardedGroup shards over the same pairs
    assert placement(4, 2) == ("STRICT_PACK", [2, 2], [(0, 0), (0, 1), (1, 0), (1, 1)])
    assert placement(6, 3)[2][3] == (1, 0)
    with pytest.raises(ValueError, match="does not divide"):
        placement(6, 4)


HSDP = ("distributed.backend=ray", "distributed.num_workers=4", "distributed.strategy=hsdp")


def test_hsdp_config_needs_workers_per_node_dividing_num_workers():
    pytest.importorskip("ray")
    cfg = load_config(None, [*HSDP, "distributed.workers_per_node=2"])
    assert cfg.distributed.strategy.shards and cfg.distributed.workers_per_node == 2
    for bad in ("0", "3"):
        with pytest.raises(UserError, match=rf"^distributed.strategy=hsdp shards within a node .* \(it is {bad}\)$"):
            load_config(None, [*HSDP, f"distributed.workers_per_node={bad}"])
    with pytest.raises(
        UserError, match="^distributed.workers_per_node=2 sizes the shard groups of distributed.strategy=hsdp"
    ):
        load_config(None, ["distributed.backend=ray", "distributed.num_workers=4", "distributed.workers_per_node=2"])
    with pytest.raises(
        UserError, match="^distributed.strategy=hsdp shards full-parameter training, but model.lora.rank=4"
    ):
        load_config(None, [*HSDP, "distributed.workers_per_node=2", "model.lora.rank=4"])


def test_the_estimate_counts_one_nodes_shards_under_hsdp():
    pytest.importorskip("ray")
    from rlvr.estimate import shard_count

    base = ["distributed.backend=ray", "distributed.num_workers=8", "train.prompts_per_step=8"]
    assert shard_count(load_config(None, base)) == 1
    assert shard_count(load_config(None, [*base, "distributed.strategy=fsdp"])) == 8
    assert shard_count(load_config(None, [*base, "distributed.strategy=hsdp", "distributed.workers_per_node=4"])) == 4


@pytest.mark.parametrize(
    "device, offload, want",
    [("cpu", False, "gloo"), ("cpu", True, "gloo"), ("cuda", False, "nccl"), ("cuda", True, "cuda:nccl,cpu:gloo")],
)
def test_offloaded_shards_get_a_host_backend_beside_nccl(device, offload, want):
    from rlvr.distributed.placement import process_group_backend

    assert process_group_backend(device, offload=offload) == want
