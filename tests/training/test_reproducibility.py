"""Identical runs and interrupted runs end bit-identical on the paths ``auto`` picks, with every
optional CPU path on: two uninterrupted runs of one config (the second beside a process that keeps a
core busy) give the same weights and metrics, and a run stopped by SIGTERM, resumed, killed by SIGKILL
and resumed again ends with the uninterrupted run's weights and metrics.

Each test names the paths it covers and fails if one of them did not run (the counts come from
fault_driver.py's markers): a tiny model whose head size the kernels refuse would test the fallbacks,
so the model here has heads of 64 (hidden 256), which the compiled update attention takes. On a CPU
without AVX512-BF16 that kernel's C runs on SIMDe's emulation (tests/ua_emulated.py); MKL's AVX-512
preload is required only on an AMD CPU with AVX-512, where ``rlvr train`` applies it.

Every run is a subprocess of ``rlvr train`` at the machine's thread count (2 or more threads: the
order of parallel sums is what these tests are about)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from tiny_run import FORMAT_REWARD, metrics, tiny_args

from rlvr.cpu.runtime_env import _cpuinfo, amd_avx512
from rlvr.models.tiny import save_tiny_model

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("fault_driver.py")
STEPS = 10
RUN = (
    *FORMAT_REWARD,
    "rollout.samples_per_prompt=4",
    "train.prompts_per_step=2",
    "train.micro_batch_seqs=4",
    "train.micro_batch_seqs_bf16=4",
    "train.lr=1e-4",  # slow enough that every segment has groups whose rewards differ (passes to run)
    "train.save_every=1",
    "train.keep_checkpoints=2",
    "eval.limit=4",
    f"train.steps={STEPS}",
)
CONFIGS = {
    # bf16 autocast in the update with the compiled attention (what auto picks on an AVX512-BF16 CPU),
    # fp32 sampling by the compiled decode step on packed weights
    "bf16-update": (
        ["model.autocast_bf16=true", "train.fused_attention=true"],
        ["update_attention", "update_attention_backward", "decode_kernels", "packed_weights", "forward_only_groups"],
    ),
    # float32 throughout (what auto picks on an AVX2 CPU): packed weights in sampling and the update
    "float32": (
        ["model.autocast_bf16=false"],
        ["decode_kernels", "packed_weights", "forward_only_groups"],
    ),
}


@pytest.fixture(scope="module")
def model64(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny64") / "model", hidden=256)


def _run(model, run: Path, extra, counts: Path | None = None, fault=(), busy=False):
    """``rlvr train`` through the fault driver; returns (exit code, stderr)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "RLVR_TEST_EMULATE_UA": "1", "RLVR_CACHE": str(run.parent / "cache")}
    env.pop("RLVR_TEST_PATHS", None)
    if counts is not None:
        env["RLVR_TEST_PATHS"] = str(counts)
    head = [*fault, "--"]
    cmd = [sys.executable, str(DRIVER), *head, *tiny_args(model, run, *RUN, *extra)]
    hog = None
    if busy:  # other work on the cores, as a user's machine has: a busy loop, ended below
        hog = subprocess.Popen(
            [sys.executable, "-c", "import time\nend = time.time() + 300\nwhile time.time() < end: pass"]
        )
    try:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=600)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    return proc.returncode, proc.stderr.decode()


def _ran(counts: Path, paths: list[str]) -> dict:
    got = json.loads(counts.read_text())
    want = [*paths, *(["mkl_avx512_preload"] if amd_avx512(_cpuinfo()) else [])]
    assert all(got[p] > 0 for p in want), f"paths that did not run: {[p for p in want if not got[p]]} ({got})"
    return got


def _same_end(a: Path, b: Path) -> None:
    wa = load_file(a / "checkpoints" / f"step_{STEPS:06d}" / "model.safetensors")
    wb = load_file(b / "checkpoints" / f"step_{STEPS:06d}" / "model.safetensors")
    equal = sum(wa[k].equal(wb[k]) for k in wa)
    assert wa.keys() == wb.keys() and equal == len(wa), f"{equal} of {len(wa)} tensors equal"
    assert metrics(a, timings=False) == metrics(b, timings=False)


@pytest.mark.parametrize(
    "config",
    # float32's paths (decode kernels, packed weights, forward-only groups) run in bf16-update too:
    # the float32 variant is make test-all's, to keep CI short
    [pytest.param("bf16-update"), pytest.param("float32", marks=pytest.mark.extended)],
)
def test_two_runs_then_sigterm_and_sigkill_resumes_are_bit_identical(model64, tmp_path, config):
    extra, paths = CONFIGS[config]
    first, second, run = tmp_path / "first", tmp_path / "second", tmp_path / "interrupted"
    for where, busy in ((first, False), (second, True)):
        code, err = _run(model64, where, extra, counts=tmp_path / f"{where.name}.json", busy=busy)
        assert code == 0, err[-3000:]
        _ran(tmp_path / f"{where.name}.json", paths)
    if "update_attention" in paths:
        assert "update attention: compiled for AVX512-BF16" in err
    _same_end(first, second)

    # SIGTERM mid-update: the step finishes, is saved, and the process exits 0
    marker = tmp_path / "sigterm"
    code, err = _run(model64, run, extra, fault=("update", "3", "SIGTERM", str(marker)))
    assert marker.is_file() and code == 0, err[-3000:]
    done = len(metrics(run))
    assert 0 < done < STEPS
    # resumed, then SIGKILL mid-update
    marker = tmp_path / "sigkill"
    code, err = _run(model64, run, [*extra, f"resume={run}"], fault=("update", "3", "SIGKILL", str(marker)))
    assert marker.is_file() and code == -signal.SIGKILL, err[-3000:]
    # resumed to the end, with every path running
    code, err = _run(model64, run, [*extra, f"resume={run}"], counts=tmp_path / "last.json")
    assert code == 0, err[-3000:]
    _ran(tmp_path / "last.json", [p for p in paths if p != "update_attention_backward"])  # its steps may have no
    # gradient pass (groups that all scored alike run forward only)
    _same_end(first, run)
