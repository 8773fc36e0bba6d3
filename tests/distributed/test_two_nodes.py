"""Two Ray nodes on one machine: a head and a second node started with `ray start`, each with
one `rlvr_node` custom resource, so that each of the two workers lands on its own node. The run joins the
cluster with `distributed.address=auto`, trains 2 steps, resumes for a third, and both nodes are stopped
by their PIDs (never `ray stop`, which would stop every Ray cluster on the machine). `extended`: HSDP on
the two nodes, 2 workers each, trains like one process."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import assert_same_metrics, metrics

from rlvr.commands.train import run_training as train
from rlvr.config import load_config

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], env: dict) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stdout[-1500:]} {proc.stderr[-1500:]}"


def _train(args: list[str], env: dict) -> str:
    """`rlvr train ARGS` in a subprocess; its stderr (the driver's console)."""
    cmd = [sys.executable, "-m", "rlvr.cli", "train", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def _stop(temp_dir: Path) -> None:
    """Terminates every process of this test's cluster: the ones whose command line names its temp dir
    (the head's and the second node's processes all run in its session directory)."""
    import psutil

    procs = [p for p in psutil.process_iter(["cmdline"]) if str(temp_dir) in " ".join(p.info["cmdline"] or [])]
    for p in procs:
        p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=20)
    for p in alive:
        p.kill()


@contextmanager
def _two_nodes(workers_per_node: int = 1):
    """A head and a second Ray node on this machine, each with ``workers_per_node`` CPUs and
    ``rlvr_node`` slots; yields the environment whose ``RAY_ADDRESS`` joins them."""
    pytest.importorskip("ray")
    from ray.util import get_node_ip_address as ray_ip

    ray = str(Path(sys.executable).with_name("ray"))
    # short: Ray's AF_UNIX socket paths under it must stay within 107 bytes (pytest's tmp_path is too deep)
    temp_dir, port = Path(tempfile.mkdtemp(prefix="rlvr-ray-", dir="/tmp")), _free_port()
    slot = json.dumps({"rlvr_node": workers_per_node})
    common = [f"--num-cpus={workers_per_node}", f"--resources={slot}", "--disable-usage-stats"]
    # a test cluster on loopback: no token authentication (Ray >= 2.5x turns it on for `ray start`)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    try:
        head = [ray, "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}", "--include-dashboard=false",
                *common]  # fmt: skip
        _run(head, env)
        # every process on the address Ray itself picks for this host (mixing it with 127.0.0.1 left the
        # driver without a local raylet now and then)
        address = f"{ray_ip()}:{port}"
        _run([ray, "start", f"--address={address}", *common], env)
        env["RAY_ADDRESS"] = address  # what distributed.address=auto joins
        yield env
    finally:
        _stop(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.extended  # CI: Ray placement and resumes run in test_ray_dp, test_ray_signals and test_async_rollouts
def test_two_nodes_on_one_machine_train_resume_and_stop(dp_args, tmp_path):
    with _two_nodes() as env:
        run = tmp_path / "run"
        nodes = ("distributed.backend=ray", "distributed.num_workers=2", "distributed.address=auto",
                 "distributed.resources_per_worker={rlvr_node: 1}")  # fmt: skip
        # the driver is `rlvr train` in a process of its own, as on a cluster (and free of the Ray state
        # earlier tests leave in this one)
        first = _train(dp_args(run, *nodes, "train.steps=2"), env)
        assert "2 Ray workers on 2 nodes" in first
        _train(dp_args(run, *nodes, "train.steps=3", f"resume={run}"), env)
        assert [m["step"] for m in metrics(run)] == [1, 2, 3]


@pytest.mark.extended
def test_hsdp_on_two_nodes_of_two_workers_trains_like_one_process(dp_args, tmp_path):
    """distributed.strategy=hsdp, 2 nodes x 2 workers: each node's placement group packed on it, the
    policy sharded within a node and replicated across; the metrics and weights of one process."""
    one, hsdp = tmp_path / "one", tmp_path / "hsdp"
    train(load_config(None, dp_args(one, "train.steps=2")))
    with _two_nodes(workers_per_node=2) as env:
        nodes = ("distributed.backend=ray", "distributed.num_workers=4", "distributed.address=auto",
                 "distributed.strategy=hsdp", "distributed.workers_per_node=2",
                 "distributed.resources_per_worker={rlvr_node: 1}")  # fmt: skip
        out = _train(dp_args(hsdp, *nodes, "train.steps=2"), env)
        assert "4 Ray workers on 2 nodes, HSDP: 2 shard groups of 2" in out
    assert_same_metrics(one, hsdp, 2)
    wa = load_file(one / "checkpoints" / "last" / "model.safetensors")
    wb = load_file(hsdp / "checkpoints" / "last" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-5)
