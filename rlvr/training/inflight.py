"""Rollouts made ahead of the update that trains on them (asynchronous rollouts), as they travel and rest.

A rollout worker (:mod:`rlvr.distributed.rollout_worker`) returns one :class:`Rollout` per step: the
step's scored groups, what the ``rollout/*`` metrics read, and the version of the weights that
sampled it. The trainers train on it a step or more later (``rollout.max_staleness``), so a
checkpoint holds the ones made but not yet trained (:func:`to_plain`), and a resume trains on them
(:func:`from_plain`) instead of sampling them again from weights it no longer has: the resumed run
takes the uninterrupted run's steps bit for bit.

Why by hand: the trainer state loads with ``torch.load(weights_only=True)`` (a shared run directory
must not run code on resume), which reads tensors and plain containers only. :func:`to_plain` writes
the few dataclasses a rollout is made of as tagged dicts, and :func:`from_plain` rebuilds only those
(:data:`KINDS`); any other leaf (a data row's date, say) is kept as its string.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rlvr.rewards.registry import RewardResult
from rlvr.rollout import RolloutBatch
from rlvr.training.sampling import Sampled, Scored

TAG = "__rlvr_dataclass__"


@dataclass
class Rollout:
    """One step's rollout, made by a rollout worker.

    Attributes:
        step: the step (0-based) it is for: its prompts and sampling seeds.
        version: the weights that sampled it, as the number of updates they hold.
        got: the step's groups to train on (every trainer takes its shard).
        sampled: what the ``rollout/*`` metrics read of everything sampled (dynamic sampling's extras too).
        info: ``collect``'s info: phase times ``rollout_s`` / ``reward_s`` and dynamic sampling's counts.
        began, ended: wall-clock times (``time.time()``) the worker began and ended it.
        idle_s: how long the worker waited before it began (for weights, or for work).
        push_s: the weights' push that preceded it: the trainer's put and this worker's load, seconds
            (0 when it sampled with the weights it already had).
    """

    step: int
    version: int
    got: Scored
    sampled: Sampled
    info: dict
    began: float = 0.0
    ended: float = 0.0
    idle_s: float = 0.0
    push_s: float = 0.0


KINDS = {cls.__name__: cls for cls in (Rollout, Scored, Sampled, RolloutBatch, RewardResult)}
"""The dataclasses :func:`from_plain` rebuilds (nothing else is ever constructed from a checkpoint)."""


def to_plain(obj):
    """``obj`` as tensors, numbers, strings, None and plain lists and dicts (see the module docstring)."""
    if dataclasses.is_dataclass(obj) and type(obj).__name__ in KINDS:
        fields = {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return {TAG: type(obj).__name__, **fields}
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def from_plain(obj):
    """What :func:`to_plain` wrote, with :data:`KINDS` rebuilt."""
    if isinstance(obj, dict):
        kind = obj.get(TAG)
        fields = {k: from_plain(v) for k, v in obj.items() if k != TAG}
        if kind is None:
            return fields
        if kind not in KINDS:
            raise ValueError(f"a saved rollout names {kind!r}, not one of {sorted(KINDS)}")
        return KINDS[kind](**fields)
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    return obj
