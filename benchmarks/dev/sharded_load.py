"""Sharded loading: each rank's host memory and time while the policy loads, every rank reading the
whole model (the earlier path) against rank 0 reading it and broadcasting into the shards
(``ShardedGroup.shard_loaded``).

2 plain processes over gloo (no Ray), the built-in SmolLM2-135M-Instruct in float32 by default; each
rank reports its resident memory before loading, its peak (``ru_maxrss``) after, and the wall time
of the load and sharding. Results go to ``benchmarks/results/sharded_load-<capability>-<date>.json``.
Run by hand:

    .venv/bin/python benchmarks/dev/sharded_load.py [--model PATH_OR_NAME]
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RESULTS = Path(__file__).resolve().parents[1] / "results"
WORLD = 2
MiB = 2**20


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss() -> int:
    """This process's resident memory now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _load(rank: int, port: int, path: str, way: str, out: str) -> None:
    from rlvr.distributed.fsdp import ShardedGroup
    from rlvr.models.loading import empty_model, load_model

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    group = ShardedGroup(rank, WORLD, "cpu", wait_for_rank0_s=600)
    empty_model(Path(path))  # transformers' model classes imported before the baseline
    group.barrier()
    before, start = _rss(), time.perf_counter()
    if way == "every rank reads":
        group.shard(load_model(Path(path)))
    else:
        group.shard_loaded(empty_model(Path(path)), lambda: load_model(Path(path)))
    group.barrier()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    row = {"rank": rank, "rss_before_mib": before / MiB, "peak_rss_mib": peak / MiB, "seconds": seconds}
    Path(out, f"{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model spec (model.path)")
    args = parser.parse_args()
    from rlvr.models.loading import resolve_model_path

    path = str(resolve_model_path(args.model))
    rows = {}
    for way in ("every rank reads", "rank 0 reads, broadcast"):  # separate processes: separate peaks
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(_load, args=(_port(), path, way, out), nprocs=WORLD)
            rows[way] = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(WORLD)]
    capability = torch.backends.cpu.get_cpu_capability()
    result = {"model": args.model, "world": WORLD, "cpu_capability": capability, "torch": torch.__version__, **rows}
    RESULTS.mkdir(exist_ok=True)
    name = RESULTS / f"sharded_load-{capability}-{datetime.date.today()}.json"
    name.write_text(json.dumps(result, indent=1) + "\n")
    for way, ranks in rows.items():
        for r in ranks:
            grew = r["peak_rss_mib"] - r["rss_before_mib"]
            print(f"{way:26s} rank {r['rank']}: peak - before {grew:8.1f} MiB, {r['seconds']:.2f} s")
    print(f"wrote {name}")


if __name__ == "__main__":
    main()
