"""``distributed.strategy=fsdp``: the Trainer's group when each worker holds a shard, not a replica.

PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) shards each decoder layer and then the
whole model over the workers, as veRL and torchtitan do: parameters, gradients and AdamW state
are 1/N per worker, gathered one layer at a time for a forward or backward pass. The policy's
gradients are reduce-scattered as *sums* during backward (every loss already divides by the
step's global token count, so FSDP's default average would shrink them N times). Checkpoints are
``torch.distributed.checkpoint`` directories that every rank writes its shard into.

``distributed.strategy=hsdp`` (hybrid sharding) splits the workers into nodes of
``distributed.workers_per_node`` on a 2-D device mesh (replicate × shard): FSDP2 shards over the
``shard`` dimension, so every pass's all-gathers and reduce-scatters stay inside a node, and the
node-sharded gradients are all-reduced across nodes once per optimizer step, in :meth:`reduce_grads`.
Why there and not in FSDP2's own HSDP (``fully_shard`` over the 2-D mesh): FSDP2 writes the
gradients it accumulates without an all-reduce (``set_requires_all_reduce(False)``) only on a backward
that all-reduces, so it must know which micro-batch is a step's last; the update loop does not tell
the group that, but it calls :meth:`reduce_grads` once after the last one, as it does for DDP. The
cost: the all-reduce of the last micro-batch does not overlap its backward.

Every method here is a collective: all ranks call it at the same point of the same step.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlvr.distributed.group import _BUCKET_ELEMENTS, TorchGroup
from rlvr.distributed.placement import check_shared, mark_shared, unmark
from rlvr.errors import UserError
from rlvr.models.loading import gather_parameters


def decoder_layers(model) -> list[torch.nn.Module]:
    """The blocks FSDP shards one by one: the classes the model names in ``_no_split_modules``
    (``LlamaDecoderLayer``, ``Qwen2DecoderLayer``...), as accelerate's and veRL's wrap policies do."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules) to shard")
    return layers


class ShardedGroup(TorchGroup):
    """The data-parallel group of FSDP workers: :class:`TorchGroup`'s collectives, plus sharding,
    sharded checkpoints and the full weights for the rollout copy."""

    shards = True

    def __init__(
        self,
        rank: int,
        world_size: int,
        device: torch.device | str,
        *,
        wait_for_rank0_s: float = 0,
        workers_per_node: int = 0,
    ) -> None:
        super().__init__(rank, world_size, device)
        per_node = workers_per_node or world_size
        if world_size % per_node:
            raise ValueError(f"workers_per_node={per_node} does not divide world_size={world_size}")
        self.replicate = None
        """HSDP: the process group of this rank and its peers on the other nodes (the same shard of
        everything each), over which :meth:`reduce_grads` sums; None when one group shards over all."""
        if per_node < world_size:  # ranks [node * per_node, (node + 1) * per_node) are one node
            hybrid = init_device_mesh(
                self.device.type, (world_size // per_node, per_node), mesh_dim_names=("replicate", "shard")
            )
            self.mesh, self.replicate = hybrid["shard"], hybrid.get_group("replicate")
        else:
            self.mesh = init_device_mesh(self.device.type, (world_size,))
        # The other ranks wait for rank 0 alone at a few points (it writes a checkpoint's
        # Hugging Face weights): longer than the collective timeout allows, so they wait in a group of
        # their own, on the host (gloo), bounded by the driver's step timeout (0 = no limit: a week).
        wait = timedelta(seconds=wait_for_rank0_s or 7 * 24 * 3600)
        self.host = dist.new_group(backend="gloo", timeout=wait)
        self.checkpoints = dist.new_group(backend="gloo", timeout=wait)
        """DCP's collectives, in the step or in the background writer's thread (never beside ``host``'s)."""
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlvr-checkpoint")
        self.pending = None
        """(checkpoint folder, future) of the save being written in the background, or None."""

    def shard(self, model, *, bf16_compute: bool = False, offload: bool = False):
        """Shards ``model`` in place (each decoder layer, then the rest) and returns it.

        Args:
            bf16_compute: gather the fp32 shards as bf16 for the passes and reduce gradients in
                fp32 (FSDP2's mixed precision; the master weights and AdamW stay fp32).
            offload: keep the parameter and gradient shards in host memory (FSDP2's
                ``CPUOffloadPolicy``, pinned on a GPU): each layer's shards are copied to the device
                for its all-gather, gradients copied back after the reduce-scatter, and an optimizer
                built over the parameters afterwards keeps its state and steps on the CPU. A model
                that runs no backward (the reference, ``offload.reference``) may come in on the CPU:
                FSDP2 moves each layer to the device only to shard it, then its shard back.
        """
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16_compute else None
        kw = {"mesh": self.mesh, **({"mp_policy": mp} if mp else {})}
        if offload:  # pinned host memory needs a GPU; on a CPU the shards already live in host memory
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=self.device.type == "cuda")
        for layer in decoder_layers(model):
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        for m in model.modules():
            if isinstance(m, FSDPModule):  # sums, not means (see the module docstring); gloo has no premul-sum
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)
        return model

    def shard_loaded(self, model, load, *, bf16_compute: bool = False, offload: bool = False):
        """Shards ``model``, built on the meta device (:func:`~rlvr.models.loading.empty_model`), and
        fills its shards with the weights of ``load()``, a whole model that rank 0 alone calls (it reads
        the checkpoint into its host memory); returns ``model``. The weights are read once, not once
        per worker: the other ranks never hold more than their shards and the one tensor being
        broadcast (``set_model_state_dict`` with ``broadcast_from_rank0``, one tensor at a time, as
        torchtitan and veRL load). Tied parameters stay one parameter (tied on the meta device, sharded
        once). Buffers, which no state dict of the model may carry (rotary ``inv_freq`` is
        non-persistent), are broadcast from rank 0's model too, onto the device the passes run on.

        Args:
            load: () -> the whole unsharded model (in host memory), called on rank 0 only.
            bf16_compute, offload: as :meth:`shard`; offloaded shards are allocated in host memory.
        """
        self.shard(model, bf16_compute=bf16_compute, offload=offload)
        model.to_empty(device="cpu" if offload else self.device)  # every shard allocated, still unfilled
        whole = load() if self.rank == 0 else None
        full = whole.state_dict() if whole is not None else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, full, options=options)
        self._broadcast_buffers(model, whole)
        return model

    def _broadcast_buffers(self, model, whole) -> None:
        """Every buffer of ``model`` set to rank 0's ``whole``'s (the others pass None), on :attr:`device`."""
        ours = dict(model.named_buffers())
        if self.rank == 0 and ours.keys() != dict(whole.named_buffers()).keys():
            raise ValueError(f"{type(whole).__name__}: the loaded model's buffers are not the built model's")
        for name, buf in ours.items():
            value = (
                whole.get_buffer(name).to(self.device, copy=True)
                if self.rank == 0
                else torch.empty(buf.shape, dtype=buf.dtype, device=self.device)
            )
            dist.broadcast(value, src=0)
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner)._buffers[leaf] = value  # its persistence flag stays the module's

    @torch.no_grad()
    def fill_copy(self, copy, model):
        """Allocates ``copy`` -- a whole model on the meta device, of ``model``'s architecture before it
        was sharded (the rollout copy: ``cast_copy`` of the meta policy) -- on :attr:`device` in its own
        dtypes and fills it from the sharded ``model``: its buffers from ``model``'s, each parameter
        all-gathered one at a time (``DTensor.full_tensor``); returns ``copy``. A collective."""
        made: dict[int, tuple] = {}  # id of a meta tensor -> (it, its allocation): a tied one allocated once
        for module in copy.modules():  # not to_empty, which unties a tied head from the embeddings
            for table in (module._parameters, module._buffers):
                for name, t in table.items():
                    if t is not None and id(t) not in made:
                        data = torch.empty_like(t, device=self.device)
                        isparam = isinstance(t, torch.nn.Parameter)
                        made[id(t)] = (t, torch.nn.Parameter(data, requires_grad=t.requires_grad) if isparam else data)
                    if t is not None:
                        table[name] = made[id(t)][1]
        theirs = dict(model.named_buffers())
        for name, buf in copy.named_buffers():
            buf.copy_(theirs[name])
        gather_parameters(copy, model)
        return copy

    def reshard(self, model) -> None:
        """Frees the whole weights a sharded ``model``'s root still holds after a forward (embeddings,
        LM head, final norm: FSDP2 leaves a root gathered for the backward that follows in training);
        its layers reshard themselves after their own forward. For a model that runs no backward, after
        its passes (the reference), rather than ``reshard_after_forward=True`` on the root, which would
        gather the root again for every micro-batch."""
        model.reshard()

    def share_run_dir(self, run_dir: Path) -> None:
        """Every rank sets up at once under FSDP (sharding is a collective): the others wait here until
        rank 0 has prepared ``run_dir``, and check that they see what it wrote there (a shared filesystem)."""
        name = self.broadcast(mark_shared(run_dir) if self.rank == 0 else None)
        try:
            if self.rank != 0:
                check_shared(run_dir, name, self.rank)
            self.barrier()
        finally:
            if self.rank == 0:
                unmark(run_dir, name)

    def reduce_grads(self, model) -> None:
        """FSDP reduce-scattered (summed) each gradient over its shard group during backward; under
        HSDP the node-sharded gradients are then summed across nodes here, once per optimizer step
        (the local shards, in buckets, over :attr:`replicate`)."""
        if self.replicate is None:
            return
        grads = []
        for p in model.parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:  # a parameter no pass reached: zeros, as another node's may not be None
                p.grad = torch.zeros_like(p)
            grads.append(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad)
        bucket, size = [], 0
        for g in grads:
            bucket.append(g)
            size += g.numel()
            if size >= _BUCKET_ELEMENTS:
                self._all_reduce(bucket, self.replicate)
                bucket, size = [], 0
        if bucket:
            self._all_reduce(bucket, self.replicate)

    def broadcast(self, obj):
        """Rank 0's ``obj`` (picklable), on every rank; the others wait for rank 0 as long as the
        driver's step timeout allows (rank 0 may be writing a checkpoint)."""
        out = [obj]
        dist.broadcast_object_list(out, src=0, group=self.host)
        return out[0]

    def barrier(self) -> None:
        dist.barrier(group=self.host)

    def save(self, path: Path, policy, optimizer, ref=None, *, background: bool = False, then=None) -> None:
        """Every rank writes its shard of the policy, AdamW state (and a moved reference) to ``path``,
        then rank 0 runs ``then`` (it renames the checkpoint into place: every rank's shards and the
        metadata are written by then, as DCP's coordinator gathers the others' results first).

        With ``background``, ``dcp.async_save``: each rank copies its shards to host memory here and
        writes them in a thread while training goes on; :meth:`wait_saved` waits for it (the next save
        and the end of the run do). Its collectives run in a gloo group of their own, so they never
        interleave with the step's. One save at a time: a pending one is waited for first."""
        self.wait_saved()
        model_sd, optim_sd = get_state_dict(policy, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        if ref is not None:
            state["ref"] = get_model_state_dict(ref)
        if not background:  # the others wait in it while rank 0 writes its files: the long-timeout group
            dcp.save(state, checkpoint_id=str(path), process_group=self.checkpoints)
            if then is not None:
                then()
            return
        written = dcp.async_save(state, checkpoint_id=str(path), process_group=self.checkpoints)
        self.pending = (path, self._writer.submit(_finish, written, then))

    def wait_saved(self) -> None:
        """Waits until the background save (if any) is written and in place; a failed one is a UserError."""
        if self.pending is None:
            return
        (path, done), self.pending = self.pending, None
        try:
            done.result()
        except Exception as e:  # noqa: BLE001 - a failed write, a lost peer: the previous checkpoint stays
            named = re.search(r"step_\d+", path.parent.name)  # its staging folder: .step_N.tmp-PID
            what = str(e).strip().splitlines()[0] if str(e).strip() else "no detail"
            raise UserError(
                f"writing the checkpoint {named[0] if named else path.parent.name} in the background failed "
                f"({type(e).__name__}: {what}); the previous checkpoint is intact "
                "(distributed.async_save=false writes them in the step)"
            ) from e

    def load(self, path: Path, policy, optimizer, ref=None) -> None:
        """Loads what :meth:`save` wrote into the sharded policy, optimizer (and reference): exact, on
        any number of workers (DCP reshards: each rank reads the parts of the saved shards it now holds)."""
        model_sd, optim_sd = get_state_dict(policy, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        if ref is not None:
            state["ref"] = get_model_state_dict(ref)
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(policy, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if ref is not None:
            set_model_state_dict(ref, state["ref"])


def _finish(written, then) -> None:
    """The background half of :meth:`ShardedGroup.save`: the shards written, then ``then`` (rank 0's rename)."""
    written.result()
    if then is not None:
        then()
