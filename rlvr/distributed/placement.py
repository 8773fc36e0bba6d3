"""Where a Ray worker runs and what it reads: its device from the GPU Ray assigned it, paths that mean
the same on every node, and the check that every rank sees the one run directory.

Pure functions and small file operations, so that they are tested without a GPU or a second node."""

from __future__ import annotations

import dataclasses
import secrets
import socket
from pathlib import Path

from rlvr.errors import UserError

MARKER_PREFIX = ".rlvr-shared-"


def worker_device(setting: str, gpu_ids: list) -> str:
    """The device a Ray worker trains on, from ``model.device`` and the GPUs Ray assigned it
    (``ray.get_gpu_ids()``). Ray sets ``CUDA_VISIBLE_DEVICES`` to the assigned GPUs, so a worker's
    own GPU is always ``cuda:0`` there, whatever index ``model.device`` names on the driver."""
    if gpu_ids:
        if setting == "cpu":
            raise UserError(
                "model.device=cpu, but distributed.gpus_per_worker reserves GPUs for the workers; "
                "set model.device=auto (or cuda), or distributed.gpus_per_worker=0"
            )
        return "cuda:0"
    if setting.startswith("cuda"):
        raise UserError(
            f"model.device={setting} on Ray workers needs a GPU each: set distributed.gpus_per_worker=1 "
            "(Ray then assigns every worker its own GPU)"
        )
    return "cpu"


def process_group_backend(device_type: str, *, offload: bool = False) -> str:
    """torch.distributed's backend for a worker on ``device_type``: nccl on CUDA, gloo on a CPU; with
    offloaded FSDP shards (``offload.params`` or ``offload.reference``) both, by device
    (``cuda:nccl,cpu:gloo``, as torchtitan does), since some collectives then run on host tensors (the
    gradient norm over CPU gradients)."""
    if device_type != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if offload else "nccl"


def _absolute(value: str | None, cwd: Path, *, must_exist: bool = True) -> str | None:
    if not value:
        return value
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    if must_exist and not (cwd / path).exists():
        return value  # a built-in name, a task name or a published model name: not a path here
    return str((cwd / path).resolve())


def _absolute_rule(rule: str, cwd: Path) -> str:
    """``file.py:function`` with the file made absolute; other rule names unchanged."""
    file, sep, fn = rule.rpartition(":")
    if not sep or not file.endswith(".py"):
        return rule
    return f"{_absolute(file, cwd)}:{fn}"


def absolute_paths(cfg, cwd: Path):
    """``cfg`` with every relative path made absolute against ``cwd`` (the driver's directory), before
    it leaves for the workers: a worker on another node starts elsewhere, and the presets use relative
    paths. Names that are not paths here (built-in models and tasks, published model names) stay."""
    data = cfg.data

    def parts(text: str | None) -> str | None:  # comma-separated files, folders or globs
        if not text:
            return text
        return ",".join(_absolute(p.strip(), cwd, must_exist=not any(c in p for c in "*?[")) for p in text.split(","))

    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, path=_absolute(cfg.model.path, cwd)),
        data=dataclasses.replace(data, path=parts(data.path), test_path=parts(data.test_path)),
        eval=dataclasses.replace(cfg.eval, data=_absolute(cfg.eval.data, cwd)),
        reward=dataclasses.replace(cfg.reward, rules=[_absolute_rule(r, cwd) for r in cfg.reward.rules]),
        run_dir=_absolute(cfg.run_dir, cwd, must_exist=False),
        resume=_absolute(cfg.resume, cwd, must_exist=False),
    )


def placement(num_workers: int, workers_per_node: int = 0) -> tuple[str, list[int], list[tuple[int, int]]]:
    """Where each rank goes: (Ray placement strategy, the size of each placement group, each rank's
    (group, bundle)).

    One group of every worker, packed onto as few nodes as fit (``PACK``); or, for HSDP
    (``workers_per_node`` > 0), one group per node of ``workers_per_node`` workers that must all fit
    on one node (``STRICT_PACK``), ranks contiguous per node: ranks ``[i * k, (i + 1) * k)`` are
    node ``i``'s, the shard group that :class:`rlvr.distributed.fsdp.ShardedGroup` builds from them.
    (Two groups may still share a node that has room for both: HSDP is then correct, only slower.)"""
    k = workers_per_node or num_workers
    if num_workers % k:
        raise ValueError(f"workers_per_node={k} does not divide num_workers={num_workers}")
    strategy = "STRICT_PACK" if workers_per_node else "PACK"
    return strategy, [k] * (num_workers // k), [divmod(rank, k) for rank in range(num_workers)]


def mark_shared(run_dir: Path) -> str:
    """Rank 0: writes a marker file with a fresh name into ``run_dir``; returns its name."""
    name = MARKER_PREFIX + secrets.token_hex(8)
    (Path(run_dir) / name).write_text(socket.gethostname(), encoding="utf-8")
    return name


def check_shared(run_dir: Path, name: str, rank: int) -> None:
    """Every other rank: UserError unless rank 0's marker ``name`` is visible in ``run_dir`` from here."""
    marker = Path(run_dir) / name
    if not marker.is_file():
        raise UserError(
            f"run_dir={run_dir} is not shared: rank {rank} on {socket.gethostname()} cannot see what rank 0 wrote "
            "there; put run_dir on a filesystem every node mounts (NFS, a cluster filesystem) or run on one node"
        )


def unmark(run_dir: Path, name: str) -> None:
    (Path(run_dir) / name).unlink(missing_ok=True)
