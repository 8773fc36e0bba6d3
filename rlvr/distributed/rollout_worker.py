"""A rollout worker: a Ray actor that only samples and scores whole steps, apart from the trainers.

With ``distributed.rollout_workers=N`` the driver (:class:`rlvr.distributed.driver.RayTrainer`,
through :class:`rlvr.distributed.pipeline.RolloutPipeline`) gives step ``j``'s rollout to worker
``j mod N``. A worker holds the rollout engine (in ``rollout.dtype``), the prompts and the reward
pool, and no optimizer: :meth:`RolloutWorker.collect` samples and scores every group of a step, as
one process samples them (the same prompts, seeds and dynamic-sampling draws), and returns a
:class:`rlvr.training.inflight.Rollout` tagged with its weights' version. :meth:`RolloutWorker.load_weights`
takes the weights rank 0 of the trainers pushed after an update (Ray's object store: on one machine a
shared-memory copy). Ray runs an actor's calls one at a time in the order they were sent, so a push
sent after a ``collect`` never changes the weights of a rollout under way.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from rich.console import Console

from rlvr.distributed.placement import worker_device
from rlvr.distributed.worker import from_bytes
from rlvr.training.inflight import Rollout
from rlvr.training.replicas import OneProcess
from rlvr.training.sampling import collect
from rlvr.training.trainer import Trainer


class RolloutWorker:
    """Rollout worker ``index``: :meth:`setup`, then :meth:`load_weights` and :meth:`collect` as the
    driver sends them."""

    def __init__(self, cfg, index: int, threads: int) -> None:
        self.cfg, self.index = cfg, index
        torch.set_num_threads(max(1, threads))
        self.trainer: Trainer | None = None
        self.version = 0
        self.free_since = time.time()
        self.push_s = 0.0

    def setup(self) -> int:
        """Loads what sampling needs (:meth:`Trainer.setup_rollout`) on the GPU Ray assigned this actor,
        else the CPU; returns the version of its weights (the checkpoint's step when resuming)."""
        import ray

        setting = worker_device(self.cfg.model.device, ray.get_gpu_ids())
        cfg = dataclasses.replace(self.cfg, model=dataclasses.replace(self.cfg.model, device=setting))
        self.trainer = Trainer(cfg, console=Console(quiet=True), group=OneProcess())
        self.version = self.trainer.setup_rollout()
        self.free_since = time.time()
        return self.version

    def load_weights(self, pushed: tuple, version: int) -> None:
        """Loads the weights of ``version`` (the updates they hold) that a trainer pushed:
        ``(object ref of the named tensors, seconds the trainer took to put them)``."""
        import ray

        ref, put_s = pushed
        t0 = time.perf_counter()
        self.trainer.engine.load_weights(from_bytes(ray.get(ref)))
        self.version = version
        self.push_s = put_s + time.perf_counter() - t0

    def collect(self, step: int) -> Rollout:
        """Samples and scores every group of ``step`` with the weights loaded last."""
        t = self.trainer
        began = time.time()
        prompts = t.stream.batch(step)
        got, sampled, info = collect(t.engine, t.scorer, t.train_rows, prompts, step, t.cfg, prefix=t.prefix)
        ended = time.time()
        rollout = Rollout(step, self.version, got, sampled, info, began, ended, began - self.free_since, self.push_s)
        self.free_since, self.push_s = ended, 0.0
        return rollout

    def pid(self) -> int:
        import os

        return os.getpid()
