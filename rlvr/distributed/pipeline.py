"""The driver's side of asynchronous rollouts: which rollout is made when, with which weights, by whom.

Weights have versions: version ``v`` holds ``v`` updates (a run starts at 0; a resume at its
checkpoint's step). Step ``j`` trains on the rollout ``R_j`` sampled with version
``max(start, j - s)``, ``s`` being ``rollout.max_staleness``: with 0 each step samples with the
weights it updates (synchronous, the rollout on its own workers); with 1 ``R_{k+1}`` is sampled with
the weights step ``k`` starts from, while step ``k`` updates them (one-step-off, veRL's order). A
rollout is therefore fixed by its step and its version, whatever the timing, so a run is as
reproducible as a synchronous one, and a checkpoint after ``n`` steps holds exactly the rollouts it
could not make again: those sampled with a version older than ``n`` (:meth:`RolloutPipeline.inflight`;
NeMo-RL keeps its replay buffer the same way; veRL and AReaL lose them).

The pipeline launches ``R_start .. R_{start+s}`` at once, and after each update (version ``v``) the
one that version serves, ``R_{v+s}``: at most ``s + 1`` rollouts are made and not yet trained, the
queue's bound. Rollout worker ``j mod N`` makes ``R_j``; before it, the worker loads the version
``R_j`` needs if it holds another (rank 0 of the trainers pushed it through Ray's object store).
"""

from __future__ import annotations

import dataclasses
import time

import ray

from rlvr import metric_names as M
from rlvr.training.inflight import Rollout


@dataclasses.dataclass
class _Made:
    """A launched rollout: its object ref (or the rollout itself, restored from a checkpoint) and the
    version of the weights it is sampled with."""

    item: object
    version: int


class RolloutPipeline:
    """Launches rollouts on ``actors`` (:class:`rlvr.distributed.rollout_worker.RolloutWorker` handles)
    and hands them to the steps in order.

    Args:
        actors: the rollout workers, set up, each holding version ``start``.
        staleness: ``rollout.max_staleness``.
        steps: ``train.steps`` (nothing is launched for a step past it).
        start: the first step to train, the version the trainers and workers hold.
        restored: rollouts a checkpoint held (made with older versions), trained on instead of made again.
    """

    def __init__(self, actors: list, *, staleness: int, steps: int, start: int, restored: list[Rollout]) -> None:
        self.actors, self.staleness, self.steps = actors, staleness, steps
        self.start = self.version = start
        self.held = [start] * len(actors)  # the version each worker holds once its queued calls have run
        self.made: dict[int, _Made] = {
            r.step: _Made(r, r.version) for r in restored if start <= r.step < min(steps, start + staleness)
        }
        self.pushed = None  # the trainer's push of `version` (object ref of (weights ref, put s)); None at the start
        for j in range(start, min(steps, start + staleness + 1)):
            if j not in self.made:
                self._launch(j)

    def _needs(self, j: int) -> int:
        """The version ``R_j`` is sampled with."""
        return max(self.start, j - self.staleness)

    def _launch(self, j: int) -> None:
        v, a = self._needs(j), j % len(self.actors)
        if self.held[a] != v:
            if v != self.version or self.pushed is None:  # launched only for the newest version, once pushed
                raise RuntimeError(f"rollout {j} needs version {v}, but the last push holds {self.version}")
            self.actors[a].load_weights.remote(self.pushed, v)
            self.held[a] = v
        self.made[j] = _Made(self.actors[a].collect.remote(j), v)

    def wants_push(self) -> bool:
        """Whether the weights the next update makes serve a rollout still to launch."""
        return self.version + 1 + self.staleness < self.steps

    def updated(self, pushed=None) -> None:
        """The trainers made version ``version + 1`` (``pushed``: rank 0's push of it, when
        :meth:`wants_push`); launches the rollout it serves."""
        self.version += 1
        if pushed is None:
            return
        self.pushed = pushed  # every later launch needs this version: older pushes are let go
        j = self.version + self.staleness
        if j < self.steps and j not in self.made:
            self._launch(j)

    def take(self, step: int, timeout: float | None) -> tuple[Rollout, object, dict]:
        """(the rollout of ``step``, what to hand the trainers: its object ref or itself, the step's
        pipeline metrics before the update); waits for it at most ``timeout`` seconds."""
        made = self.made.pop(step)
        depth = len(self.made) + 1
        t0 = time.perf_counter()
        rollout = ray.get(made.item, timeout=timeout) if isinstance(made.item, ray.ObjectRef) else made.item
        waited = time.perf_counter() - t0
        took = max(rollout.ended - rollout.began, 1e-9)
        metrics = {
            M.ASYNC_STALENESS: float(step - rollout.version),
            M.ASYNC_QUEUE_DEPTH: float(depth),
            M.TIME_WAIT_ROLLOUT_S: waited,
            M.TIME_ROLLOUT_IDLE_S: rollout.idle_s,
            M.ASYNC_OVERLAP_FRAC: min(1.0, max(0.0, 1.0 - waited / took)),
            M.TIME_WEIGHT_PUSH_S: rollout.push_s,
        }
        return rollout, made.item, metrics

    def inflight(self) -> list:
        """What a checkpoint after the current version must hold: the launched, untrained rollouts
        sampled with an older version (object refs, or restored rollouts), in step order."""
        return [m.item for j, m in sorted(self.made.items()) if m.version < self.version]
