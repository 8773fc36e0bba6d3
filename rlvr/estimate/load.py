"""One process's peak while the models load, and a node's host RAM (:func:`load_memory`).

Besides the training peak (:mod:`rlvr.estimate.peak`), :func:`load_memory` gives one process's peak
while the models load (the whole policy, the rollout copy built in its dtype, the reference; under
FSDP the larger of the whole policy with the copy before sharding and the shards with the whole
reference) and the host RAM of a node: a GPU worker reads the whole policy in ``model.dtype`` into
host memory before moving it, and under FSDP a background checkpoint stages its shards there
(``distributed.async_save``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.choices import Backend, Strategy
from rlvr.config import Config
from rlvr.estimate.peak import BYTES, CPU_RUNTIME_BYTES, GiB, MemoryEstimate

GPU_HOST_RUNTIME_BYTES = 2 * GiB
"""Assumed, not measured: a GPU worker's host memory besides the weights it reads (Python, torch, the
CUDA and NCCL libraries' host side, tokenizer, prompts); the CPU figure is :data:`CPU_RUNTIME_BYTES`."""
GPUS_PER_NODE = 8
"""Assumed GPUs per node, for how many GPU workers share a node's host RAM."""


@dataclass(frozen=True)
class LoadMemory:
    """What a run needs while its models load, on the device and in host RAM (:func:`load_memory`)."""

    device_peak: int
    """The largest device memory of a worker while the models load (on a CPU: with the runtime)."""
    device_how: str
    host_worker: int
    """Rank 0's host RAM at its peak: the load (rank 0 reads the weights into host memory; unsharded,
    every worker does), or a checkpoint staged for the background write (FSDP); on a CPU the larger of
    that and the training peak."""
    host_how: str
    workers_per_node: int
    host_node: int
    """Rank 0's host RAM, ``workers_per_node - 1`` others', and rank 0's Hugging Face weights while it
    writes them: each process at its own peak, an upper bound."""
    device: str
    hf_write: int = 0
    """Rank 0's Hugging Face weights in host memory while it writes them (FSDP with ``train.save_hf``)."""
    host_other: int = -1
    """Another worker's host RAM at its peak (sharded: it reads no weights); -1 = :attr:`host_worker`."""
    host_other_how: str = ""

    @property
    def others(self) -> int:
        return self.host_worker if self.host_other < 0 else self.host_other

    def lines(self) -> list[str]:
        where = "GPU" if self.device == "cuda" else "RAM"
        k = self.workers_per_node
        sharded = self.host_other >= 0
        out = [f"  {'load peak':17s} {self.device_peak / GiB:8.2f} GiB  one process's {where}: {self.device_how}"]
        if sharded:
            out.append(f"  {'host RAM rank 0':17s} {self.host_worker / GiB:8.2f} GiB  {self.host_how}")
            out.append(f"  {'host RAM others':17s} {self.host_other / GiB:8.2f} GiB  each: {self.host_other_how}")
        else:
            out.append(f"  {'host RAM':17s} {self.host_worker / GiB:8.2f} GiB  one process: {self.host_how}")
        who = f"rank 0 + {k - 1} other{'s' if k > 2 else ''}" if sharded and k > 1 else f"{k} process{'es' * (k > 1)}"
        out.append(
            f"  {'host RAM / node':17s} {self.host_node / GiB:8.2f} GiB  {who} on a node"
            + (f" (of {GPUS_PER_NODE} GPUs, assumed)" if self.device == "cuda" else "")
            + (f", + rank 0's Hugging Face weights {self.hf_write / GiB:.2f} as it writes" if self.hf_write else "")
        )
        return out


def load_memory(cfg: Config, est: MemoryEstimate) -> LoadMemory:
    """The load-time peak of one worker and the host RAM of a node, from the estimate's items.

    Loading, as the trainer does it. Unsharded: every worker reads the whole policy in ``model.dtype``
    into host memory (``from_pretrained``) and moves it to its device; the rollout copy is then built in
    ``rollout.dtype`` directly (no second full-precision copy), and the reference read whole.

    Sharded (FSDP/HSDP, :meth:`~rlvr.distributed.fsdp.ShardedGroup.shard_loaded`): global rank 0 alone
    reads the whole policy in ``model.dtype`` into its host memory, then the reference in its dtype, one
    after the other; every rank builds them on the meta device, allocates its shards (in host memory
    when offloaded) and receives rank 0's weights one tensor at a time, so a device holds its shards
    plus one whole tensor (at most the embeddings) in ``model.dtype``; the whole rollout copy is then
    allocated and filled from the shards, one all-gathered tensor at a time. Rank 0's host peak is the
    larger of the models it reads (beside any offloaded shards) and, with ``distributed.async_save``,
    the copy of its shards that a background checkpoint stages; another worker's is its runtime, its
    offloaded shards and that staged copy. With ``train.save_hf`` rank 0 also holds the Hugging Face
    weights it writes. A node's host RAM is rank 0's + ``workers_per_node - 1`` others' (+ that write),
    each at its own peak."""
    n, N = est.shards, est.params
    item = {i.name: i.bytes for i in est.items}
    on_device = {i.name: i.bytes for i in est.items if i.phase != "host"}
    policy = N * BYTES[cfg.model.dtype]
    copy, ref = item["rollout copy"], item["reference"] * n  # whole: FSDP's items are 1/n
    gb = lambda b: f"{b / GiB:.2f}"  # noqa: E731
    read = max(policy, ref)  # unsharded: by every worker; sharded: by rank 0 alone, one model at a time
    if n > 1:
        shards = on_device.get("parameters", 0) + on_device.get("reference", 0)
        tensor = est.largest * BYTES[cfg.model.dtype]
        device_peak = shards + copy + tensor
        device_how = (
            f"policy + reference shards {gb(shards)} + the whole rollout copy {gb(copy)}, filled from them "
            f"one whole {cfg.model.dtype} tensor at a time ({gb(tensor)})"
        )
    else:
        device_peak = policy + copy + ref
        device_how = f"policy {gb(policy)} + rollout copy {gb(copy)} + reference {gb(ref)}"
    d = cfg.distributed
    staged = 0
    if n > 1 and d.async_save:  # each worker's shards of the policy, AdamW (and a moving reference), in host memory
        staged = item["parameters"] + item["AdamW state"] + (item["reference"] if cfg.algo.ref_sync_every else 0)
    want_hf = cfg.train.save_hf.as_bool()
    hf = (
        copy if n > 1 and (want_hf if want_hf is not None else N < 3_000_000_000) else 0
    )  # checkpoint.SAVE_HF_BELOW_PARAMS
    checkpoint = f"the shards a background checkpoint stages ({gb(staged)})"
    host_other, other_how = -1, ""
    if est.device == "cpu":  # the device is the host
        if n > 1:  # rank 0 reads a whole model beside its shards; the others hold their shards and the copy
            other, first = device_peak + CPU_RUNTIME_BYTES, shards + read + CPU_RUNTIME_BYTES
            device_peak = max(other, first)
            device_how = (
                f"rank 0: its shards {gb(shards)} + the whole {cfg.model.dtype} model it reads ({gb(read)})"
                if first >= other
                else device_how
            ) + " + runtime"
            host_other = max(est.total, other) + staged
            other_how = "the training peak above (the device is the host)" + (
                f" + {gb(staged)} staged for a background checkpoint" if staged else ""
            )
        else:
            device_peak += CPU_RUNTIME_BYTES
            device_how += " + runtime"
        host_worker = max(est.total, device_peak) + staged
        host_how = "the training peak above (the device is the host)" + (
            f" + {gb(staged)} staged for a background checkpoint" if staged else ""
        )
    else:
        runtime = f"~{gb(GPU_HOST_RUNTIME_BYTES)} runtime (assumed)"
        offload = f" + the offloaded shards ({gb(est.host)})" if est.host else ""
        host_worker = GPU_HOST_RUNTIME_BYTES + est.host + max(read, staged)  # offloaded shards: allocated at load
        whole = f"the whole {cfg.model.dtype} policy" + (" or reference" if ref > policy else "")
        host_how = (
            f"{runtime}{offload} + the larger of {whole} it reads ({gb(read)})"
            + (f" and {checkpoint}" if staged else "")
            + ("" if n > 1 else ", before it moves to the GPU")
        )
        if n > 1:
            host_other = GPU_HOST_RUNTIME_BYTES + est.host + staged
            other_how = f"{runtime}{offload}" + (f" + {checkpoint}" if staged else "") + "; it reads no weights"
    if d.backend == Backend.NONE:
        per_node = 1
    elif d.strategy == Strategy.HSDP:
        per_node = d.workers_per_node  # one shard group per node, as its placement group packs it
    elif d.gpus_per_worker > 0:
        per_node = max(1, min(d.num_workers, int(GPUS_PER_NODE // d.gpus_per_worker)))
    else:
        per_node = d.num_workers  # CPU workers: as `distributed.address=local` places them, on one node
    others = host_worker if host_other < 0 else host_other
    return LoadMemory(
        device_peak, device_how, host_worker, host_how, per_node, host_worker + (per_node - 1) * others + hf,
        est.device, hf, host_other, other_how,
    )  # fmt: skip
