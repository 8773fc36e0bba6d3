"""offload.params and offload.optimizer: FSDP2's CPUOffloadPolicy, for GPU workers that shard. Every
other combination is one line at config load that names the keys and the fix; `rlvr estimate` counts
the offloaded shards in host memory, not on the GPU."""

from __future__ import annotations

import pytest

from rlvr.config import load_config
from rlvr.errors import UserError

OFFLOAD = ("offload.params=true", "offload.optimizer=true")
GPU_FSDP = (
    "distributed.backend=ray",
    "distributed.num_workers=2",
    "distributed.strategy=fsdp",
    "distributed.gpus_per_worker=1",
    "model.device=cuda",
)


def test_offload_loads_for_gpu_workers_that_shard():
    pytest.importorskip("ray")
    cfg = load_config(None, [*GPU_FSDP, *OFFLOAD])
    assert cfg.offload.params and cfg.offload.optimizer
    hsdp = [*GPU_FSDP, "distributed.strategy=hsdp", "distributed.workers_per_node=1", *OFFLOAD]
    assert load_config(None, hsdp).offload.params


RAY2 = ("distributed.backend=ray", "distributed.num_workers=2")
MISMATCH = "FSDP2's CPUOffloadPolicy keeps a worker's shards of the parameters, gradients and AdamW state"


@pytest.mark.parametrize(
    "overrides, start, fix",
    [
        (
            ["offload.optimizer=true"],
            f"offload.params=false and offload.optimizer=true: {MISMATCH}",
            "set both to true",
        ),
        (["offload.params=true"], f"offload.params=true and offload.optimizer=false: {MISMATCH}", "set both to true"),
        (
            list(OFFLOAD),
            "offload.params=true moves FSDP2's shards to host memory (CPUOffloadPolicy), but "
            "distributed.strategy=ddp with distributed.backend=none shards nothing",
            "set distributed.backend=ray and distributed.strategy=fsdp or hsdp",
        ),
        ([*RAY2, *OFFLOAD], "offload.params=true moves FSDP2's shards", "distributed.strategy=fsdp or hsdp"),
        (
            [*RAY2, "distributed.strategy=fsdp", *OFFLOAD],
            "offload.params=true moves the shards off a GPU, but distributed.gpus_per_worker=0",
            "set distributed.gpus_per_worker=1",
        ),
    ],
)
def test_offload_elsewhere_is_one_line_naming_the_fix(overrides, start, fix):
    if any(o.startswith("distributed.backend=ray") for o in overrides):
        pytest.importorskip("ray")
    with pytest.raises(UserError) as err:
        load_config(None, overrides)
    line = str(err.value)
    assert "\n" not in line and line.startswith(start) and fix in line, line


def test_the_estimate_counts_offloaded_shards_on_the_host():
    pytest.importorskip("ray")
    from rlvr.estimate import KNOWN_MODELS, GiB, estimate, load_memory

    shape = KNOWN_MODELS["Qwen/Qwen2.5-7B"]  # a published shape: no download
    base = [*GPU_FSDP, "distributed.num_workers=8", "train.prompts_per_step=8", "model.path=Qwen/Qwen2.5-7B"]
    kept = estimate(load_config(None, base), shape, device="cuda", prompt=(512, "test"))
    moved = estimate(load_config(None, [*base, *OFFLOAD]), shape, device="cuda", prompt=(512, "test"))
    size = {i.name: i.bytes for i in kept.items}
    host = size["parameters"] + size["gradients"] + size["AdamW state"]
    assert kept.host == 0 and moved.host == host
    assert {i.name for i in moved.items if i.phase == "host"} == {"parameters", "gradients", "AdamW state"}
    # the device peak loses the resident shards and the update's gradients
    assert moved.total == kept.total - host
    assert any(line.startswith("  host (offload)") for line in moved.lines())
    assert "parameters" not in moved.summary() and "AdamW state" not in moved.summary()
    # host RAM: the offloaded shards with the background checkpoint's copy, or the whole policy read at load
    hm, hk = load_memory(load_config(None, [*base, *OFFLOAD]), moved), load_memory(load_config(None, base), kept)
    assert hm.host_worker >= hk.host_worker and "offloaded shards" in hm.host_how
    assert hm.host_worker - hk.host_worker <= host + GiB


KL = "algo.kl_coef=0.01"  # a reference to offload


def test_offload_reference_loads_for_gpu_workers_that_shard():
    pytest.importorskip("ray")
    assert load_config(None, [*GPU_FSDP, KL, "offload.reference=true"]).offload.reference
    hsdp = [*GPU_FSDP, KL, "distributed.strategy=hsdp", "distributed.workers_per_node=1", "offload.reference=true"]
    assert load_config(None, [*hsdp, *OFFLOAD]).offload.reference


@pytest.mark.parametrize(
    "overrides, start, fix",
    [
        (
            [KL, "offload.reference=true"],
            "offload.reference=true moves the reference's FSDP2 shards to host memory (CPUOffloadPolicy), but "
            "distributed.strategy=ddp with distributed.backend=none shards nothing",
            "set distributed.backend=ray and distributed.strategy=fsdp or hsdp",
        ),
        (
            [*RAY2, KL, "distributed.strategy=fsdp", "offload.reference=true"],
            "offload.reference=true moves the reference's shards off a GPU, but distributed.gpus_per_worker=0",
            "set distributed.gpus_per_worker=1",
        ),
        (
            [*GPU_FSDP, "algo.kl_coef=0", "offload.reference=true"],
            "offload.reference=true, but algo.kl_coef=0 loads no reference",
            "set offload.reference=false",
        ),
    ],
)
def test_offload_reference_elsewhere_is_one_line_naming_the_fix(overrides, start, fix):
    test_offload_elsewhere_is_one_line_naming_the_fix(overrides, start, fix)


def test_the_estimate_counts_an_offloaded_reference_on_the_host():
    pytest.importorskip("ray")
    from rlvr.estimate import KNOWN_MODELS, estimate, load_memory

    shape = KNOWN_MODELS["Qwen/Qwen2.5-7B"]
    base = [*GPU_FSDP, KL, "distributed.num_workers=8", "train.prompts_per_step=8", "model.path=Qwen/Qwen2.5-7B"]
    kept_cfg, moved_cfg = load_config(None, base), load_config(None, [*base, "offload.reference=true"])
    kept = estimate(kept_cfg, shape, device="cuda", prompt=(512, "test"))
    moved = estimate(moved_cfg, shape, device="cuda", prompt=(512, "test"))
    ref = {i.name: i for i in kept.items}["reference"]
    assert ref.bytes > 0 and kept.host == 0 and moved.host == ref.bytes
    assert {i.name for i in moved.items if i.phase == "host"} == {"reference"}
    assert moved.total == kept.total - ref.bytes and "reference" not in moved.summary()
    # read whole into host memory and sharded from there: the GPU's load peak never holds it whole
    lm, lk = load_memory(moved_cfg, moved), load_memory(kept_cfg, kept)
    assert lm.device_peak <= lk.device_peak and "offloaded shards" in lm.host_how
    # with offload.params too, every shard of both models is in host memory
    both = estimate(
        load_config(None, [*base, "offload.reference=true", *OFFLOAD]), shape, device="cuda", prompt=(512, "t")
    )
    assert {i.name for i in both.items if i.phase == "host"} == {"parameters", "gradients", "AdamW state", "reference"}
