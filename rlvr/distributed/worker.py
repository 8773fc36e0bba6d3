"""One data-parallel worker: a :class:`rlvr.training.trainer.Trainer` with a rank, run as a Ray actor.

The worker joins the torch.distributed process group, then does what the single-process
:func:`rlvr.training.trainer.train` does, on its shard: ``trainer.step`` on whole groups of the
step's prompts and a share of each evaluation's rows; rank 0 also runs the logging process's
methods (the evaluation's result, metrics, samples, checkpoints). What rank 0 prints goes to a
buffer that the driver prints on its own console.
"""

from __future__ import annotations

import dataclasses
import io
import os
import socket
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from rich.console import Console

from rlvr.choices import Strategy
from rlvr.distributed.group import TorchGroup
from rlvr.distributed.placement import check_shared, mark_shared, process_group_backend, unmark, worker_device
from rlvr.distributed.versions import require_fsdp
from rlvr.errors import UserError
from rlvr.models import resolve_device
from rlvr.training.trainer import Trainer


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def shard(prompts: list[int], rank: int, world_size: int) -> tuple[list[int], int]:
    """(this rank's prompts, the index of its first one): contiguous whole groups, rank 0 first."""
    k = len(prompts) // world_size
    return prompts[rank * k : (rank + 1) * k], rank * k


def as_bytes(named: dict) -> dict:
    """Tensors as (dtype name, shape, their bytes as a NumPy array): Ray writes NumPy arrays into its
    object store with one copy and reads them back without one, where a pickled tensor is copied on
    both sides (bfloat16, which NumPy lacks, travels as bytes too)."""
    flat = {n: t.detach().contiguous().reshape(-1) for n, t in named.items()}
    return {
        n: (str(t.dtype).removeprefix("torch."), tuple(named[n].shape), t.view(torch.uint8).numpy())
        for n, t in flat.items()
    }


def from_bytes(packed: dict) -> dict:
    """:func:`as_bytes`' tensors back (views of the arrays: read-only memory, to copy from)."""
    import warnings

    with warnings.catch_warnings():  # the object store's arrays are read-only; they are only copied from
        warnings.simplefilter("ignore", UserWarning)
        return {n: torch.from_numpy(a).view(getattr(torch, d)).view(shape) for n, (d, shape, a) in packed.items()}


class Worker:
    """Rank ``rank`` of ``world_size``: :meth:`connect`, :meth:`setup`, then :meth:`step` per step.

    Methods that print return ``(value, text)``: ``text`` is what rank 0 printed (empty elsewhere).
    """

    def __init__(self, cfg, rank: int, world_size: int, threads: int) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        torch.set_num_threads(max(1, threads))
        self.out = io.StringIO()
        # rank 0's notes and step lines, as the single process prints them (no progress bar: not a terminal)
        self.console = Console(file=self.out, width=200, soft_wrap=True) if rank == 0 else Console(quiet=True)
        self.trainer: Trainer | None = None

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group: (this node's IP, a free port)."""
        import ray  # the actor runs under Ray

        return ray.util.get_node_ip_address(), free_port()

    def connect(self, host: str, port: int) -> None:
        """Joins the process group (gloo on CPU, nccl on CUDA) and builds this rank's Trainer, on the
        GPU Ray assigned this worker (else the CPU); ``auto`` precision is resolved here, for that device."""
        import ray

        setting = worker_device(self.cfg.model.device, ray.get_gpu_ids())
        self.cfg = dataclasses.replace(self.cfg, model=dataclasses.replace(self.cfg.model, device=setting))
        device = resolve_device(setting)
        backend = process_group_backend(device.type, offload=self.cfg.offload.params or self.cfg.offload.reference)
        d = self.cfg.distributed
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=d.collective_timeout_s),  # a hung peer shows as a timeout, its rank named
        )
        if d.strategy.shards:
            require_fsdp()  # a node with an older torch than the driver's: one line, not an ImportError
            from rlvr.distributed.fsdp import ShardedGroup

            group = ShardedGroup(
                self.rank,
                self.world_size,
                device,
                wait_for_rank0_s=d.step_timeout_s,
                workers_per_node=d.workers_per_node if d.strategy == Strategy.HSDP else 0,
            )
        else:
            group = TorchGroup(self.rank, self.world_size, device)
        self.trainer = Trainer(self.cfg, console=self.console, group=group)

    def _printed(self, value=None):
        text = self.out.getvalue()
        self.out.seek(0)
        self.out.truncate()
        return value, text

    def setup(self):
        """``Trainer.setup`` (rank 0 first: it prepares the run directory); returns
        (not finished yet, (run_dir, start_step))."""
        ok = self.trainer.setup()
        return self._printed((ok, str(self.trainer.run_dir), self.trainer.start_step))

    def mark_shared(self) -> str:
        """Rank 0: a marker in the run directory that every other rank must see (:meth:`check_shared`)."""
        return mark_shared(self.trainer.run_dir)

    def check_shared(self, run_dir: str, name: str) -> None:
        check_shared(Path(run_dir), name, self.rank)

    def unmark(self, name: str) -> None:
        unmark(self.trainer.run_dir, name)

    def evaluate_start(self):
        self.trainer.evaluate_start()
        return self._printed()

    def step(self, step: int):
        """This rank's shard of ``step``; returns the step's metrics (of the whole global batch)."""
        prompts, first = shard(self.trainer.stream.batch(step), self.rank, self.world_size)
        metrics = self.trainer.step(step, prompts, first_group=first)
        return self._printed(metrics if self.rank == 0 else None)  # the same on every rank

    def step_rollout(self, step: int, rollout):
        """This rank's shard of ``step``, trained on the step's rollout that a rollout worker made
        (:class:`rlvr.training.inflight.Rollout`): the same groups every rank would have sampled."""
        P = len(rollout.got.rows)
        groups, _ = shard(list(range(P)), self.rank, self.world_size)
        got = rollout.got if self.world_size == 1 else rollout.got.select(groups)
        metrics = self.trainer.step(step, collected=(got, rollout.sampled, dict(rollout.info)))
        return self._printed(metrics if self.rank == 0 else None)

    def push_weights(self) -> tuple:
        """Rank 0: the rollout weights after the last update into Ray's object store; returns (their
        object ref, the seconds the put took)."""
        import time

        import ray

        t0 = time.perf_counter()
        ref = ray.put(as_bytes(self.trainer.pushed_weights()))
        return ref, time.perf_counter() - t0

    def hold_inflight(self, items: list) -> None:
        """Rank 0: the rollouts made but not yet trained (object refs, or rollouts a resume restored),
        which a checkpoint written now holds; fetched only when one is written."""
        import ray

        def fetch() -> list:
            try:
                return [ray.get(x) if isinstance(x, ray.ObjectRef) else x for x in items]
            except ray.exceptions.RayError as e:  # its rollout worker died or failed: this checkpoint cannot be whole
                saved = self.trainer.run.checkpoints()
                where = (
                    f"the last checkpoint {saved[-1]} is intact: continue with resume={self.trainer.run_dir}"
                    if saved
                    else "no checkpoint was saved yet"
                )
                raise UserError(
                    f"a Ray rollout worker was lost before a checkpoint could keep the rollouts it made ahead "
                    f"({type(e).__name__}); {where}"
                ) from None

        self.trainer.inflight = fetch

    def resumed_inflight(self) -> list:
        """Rank 0: the rollouts the resumed checkpoint held."""
        return self.trainer.resumed_inflight

    def record(self, step: int, metrics: dict):
        """``Trainer.record`` (evaluation when due, metrics, samples, periodic checkpoint) on every rank:
        each evaluates a share of the rows; rank 0 alone logs; under FSDP the checkpoint is a collective."""
        self.trainer.record(step, metrics)
        return self._printed()

    def stop(self, step: int, signal_name: str):
        return self._printed(str(self.trainer.stop(step, signal_name)))

    def interrupted(self, step: int):
        self.trainer.interrupted(step)
        return self._printed()

    def finish(self):
        self.trainer.finish()
        return self._printed()

    def close(self):
        """Closes the sinks and leaves the process group."""
        if self.trainer is not None and hasattr(self.trainer, "metrics_log"):
            self.trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        return self._printed()

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        """The Ray node this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()
