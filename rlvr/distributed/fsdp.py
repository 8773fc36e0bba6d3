"""``distributed.strategy=fsdp``: the Trainer's group when each worker holds a shard, not a replica.

PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) shards each decoder layer and then the
whole model over the workers, as veRL and torchtitan do: parameters, gradients and AdamW state
are 1/N per worker, gathered one layer at a time for a forward or backward pass. The policy's
gradients are reduce-scattered as *sums* during backward (every loss already divides by the
step's global token count, so FSDP's default average would shrink them N times). Checkpoints are
``torch.distributed.checkpoint`` directories that every rank writes its shard into.

Every method here is a collective: all ranks call it at the same point of the same step.
"""

from __future__ import annotations

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
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from rlvr.distributed.group import TorchGroup
from rlvr.distributed.placement import check_shared, mark_shared, unmark


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

    def __init__(self, rank: int, world_size: int, device: torch.device | str, *, wait_for_rank0_s: float = 0) -> None:
        super().__init__(rank, world_size, device)
        self.mesh = init_device_mesh(self.device.type, (world_size,))
        # The other ranks wait for rank 0 alone at a few points (it evaluates, writes a checkpoint's
        # Hugging Face weights): longer than the collective timeout allows, so they wait in a group of
        # their own, on the host (gloo), bounded by the driver's step timeout (0 = no limit: a week).
        wait = timedelta(seconds=wait_for_rank0_s or 7 * 24 * 3600)
        self.host = dist.new_group(backend="gloo", timeout=wait)

    def shard(self, model, *, bf16_compute: bool = False):
        """Shards ``model`` in place (each decoder layer, then the rest) and returns it.

        Args:
            bf16_compute: gather the fp32 shards as bf16 for the passes and reduce gradients in
                fp32 (FSDP2's mixed precision; the master weights and AdamW stay fp32).
        """
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16_compute else None
        kw = {"mesh": self.mesh, **({"mp_policy": mp} if mp else {})}
        for layer in decoder_layers(model):
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        for m in model.modules():
            if isinstance(m, FSDPModule):  # sums, not means (see the module docstring); gloo has no premul-sum
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)
        return model

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
        """Nothing to do: FSDP reduce-scattered (summed) each gradient during backward."""

    def broadcast(self, obj):
        """Rank 0's ``obj`` (picklable), on every rank; the others wait for rank 0 as long as the
        driver's step timeout allows (rank 0 may be evaluating or writing a checkpoint)."""
        out = [obj]
        dist.broadcast_object_list(out, src=0, group=self.host)
        return out[0]

    def barrier(self) -> None:
        dist.barrier(group=self.host)

    def save(self, path: Path, policy, optimizer, ref=None) -> None:
        """Every rank writes its shard of the policy, AdamW state (and a moved reference) to ``path``."""
        model_sd, optim_sd = get_state_dict(policy, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        if ref is not None:
            state["ref"] = get_model_state_dict(ref)
        dcp.save(state, checkpoint_id=str(path))

    def load(self, path: Path, policy, optimizer, ref=None) -> None:
        """Loads what :meth:`save` wrote into the sharded policy, optimizer (and reference): exact,
        on the same number of workers."""
        model_sd, optim_sd = get_state_dict(policy, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        if ref is not None:
            state["ref"] = get_model_state_dict(ref)
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(policy, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if ref is not None:
            set_model_state_dict(ref, state["ref"])

    def full_state_dict(self, model) -> dict:
        """The whole model's state dict on rank 0's CPU, gathered from the shards ({} on other ranks);
        a tied weight under its first name only, as ``save_pretrained`` writes a plain model's."""
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        first: dict[int, str] = {}
        tied = [n for n, p in model.named_parameters(remove_duplicate=False) if first.setdefault(id(p), n) != n]
        return {k: v for k, v in full.items() if k not in tied}
