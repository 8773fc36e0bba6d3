"""benchmarks/decode.py and the random model's EOS calibration (benchmarks/workload.py): the solve and the
floor counted by hand, and the benchmark run end to end on a random model (slow)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvr.estimate import ModelShape

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # the benchmarks' own folder

from decode import floor_of_call  # noqa: E402
from workload import eos_shift, expected_len_mean  # noqa: E402

# the shape of tests/benchmarks/test_roofline_model.py: layer projections 18432 params, LM head 4096,
# 22688 streamed (tied), KV 256 B per token in fp32, attention 256 FLOPs per (query, key) pair
TINY = ModelShape(2, 32, 64, 4, 2, 128, tie_word_embeddings=True)
RATES = {"matmul_flops_per_s": 1e6, "bytes_per_s": 1e5}


def test_eos_shift_solves_a_constant_direction_by_hand():
    # every state: EOS logit 0 + a * 1 against logsumexp(others) = 10; sigmoid(a - 10) = 0.01
    # -> a = 10 + ln(0.01 / 0.99) = 10 - 4.59512 = 5.40488
    n = 6
    a = eos_shift(torch.zeros(n), torch.ones(n), torch.full((n,), 10.0), 0.01)
    assert a == pytest.approx(10 + math.log(0.01 / 0.99), abs=1e-9)


def test_eos_shift_hits_the_mean_probability_on_varied_states():
    g = torch.Generator().manual_seed(0)
    base, proj = torch.randn(500, generator=g), 20 + torch.randn(500, generator=g)
    other = 12 + 0.1 * torch.randn(500, generator=g)
    a = eos_shift(base, proj, other, 1 / 300)
    assert torch.sigmoid(base.double() + a * proj.double() - other.double()).mean().item() == pytest.approx(1 / 300)
    assert eos_shift(base, proj, other - 100, 1 / 300) == 0.0  # already above the target: no change
    with pytest.raises(ValueError, match="no multiple"):
        eos_shift(base, -proj.abs(), other, 1 / 300)  # the states point away from the direction


def test_expected_len_mean_by_hand():
    # p = 0.5, limit 2: L = 1 with probability 0.5, else 2 -> 1.5 = (1 - 0.25) / 0.5
    assert expected_len_mean(0.5, 2) == pytest.approx(1.5)
    assert expected_len_mean(0.0, 7) == 7.0  # no EOS: every row runs to the limit


def test_floor_of_call_by_hand():
    # one chunk of G=2 rows of lengths 3 and 1 after one 4-token prompt
    # prefill, the prompt once for both: 158208 FLOPs, 91776 B (test_roofline_model) -> memory 0.91776 s
    # decode: passes 2 and 0; pairs 2*4 + (1+2) = 11 -> 2816 FLOPs and 2816 B of KV
    #   FLOPs 2 * (18432 + 4096) * 2 + 2816 = 92928; bytes 2 steps * 90752 + 2816 = 184320 -> 1.8432 s
    f = floor_of_call(TINY, RATES, [3, 1], [4, 4], G=2, chunk_rows=2, dtype_bytes=4)
    assert f["seconds"] == pytest.approx(0.91776 + 1.8432) and f["bound"] == "memory"
    assert f["bytes"] == pytest.approx(91776 + 184320) and f["compute_s"] == pytest.approx(0.158208 + 0.092928)
    assert f["roofline_s"] == pytest.approx(f["seconds"])  # memory-bound in every phase at these rates
    slow_matmul = floor_of_call(
        TINY, {**RATES, "matmul_flops_per_s": 1e4}, [3, 1], [4, 4], G=2, chunk_rows=2, dtype_bytes=4
    )
    # compute 15.8208 s and 9.2928 s per phase at 1e4 FLOP/s: the roofline takes them, the bytes' floor not
    assert slow_matmul["seconds"] == pytest.approx(f["seconds"]) and slow_matmul["roofline_s"] == pytest.approx(
        15.8208 + 9.2928
    )
    # a second chunk streams the weights again: lengths 2 and 2 -> passes 1, 1; pairs 2 * 5 = 10 -> 2560
    #   FLOPs 2 * 22528 * 2 + 2560 = 92672; bytes 1 step * 90752 + 2560 = 93312
    f2 = floor_of_call(TINY, RATES, [3, 1, 2, 2], [4, 4, 4, 4], G=2, chunk_rows=2, dtype_bytes=4)
    assert f2["seconds"] == pytest.approx(2 * 0.91776 + 1.8432 + 0.93312)
    assert f2["compute_s"] == pytest.approx(2 * 0.158208 + 0.092928 + 0.092672)


def _decode(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "benchmarks" / "decode.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.slow
@pytest.mark.extended  # CI: gpu_check's dry run runs decode.py end to end; this adds the EOS calibration's run
def test_decode_runs_on_a_random_model_with_eos(tmp_path, device):
    out = tmp_path / "decode.json"
    proc = _decode(
        *("--device", str(device), "--model", "random:tiny", "--eos-every", "4", "--rows", "4"),
        *("--group-size", "2", "--max-new-tokens", "8", "--repeats", "1", "--static"),
        *("--workdir", str(tmp_path / "work"), "--out", str(out), "--no-traffic"),  # traffic: test_gpu_check's
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    call = report["calls"][0]
    assert report["engine"]["static"] and call["rows"] == 4 and call["decode_steps"] <= 7
    assert call["tokens"] == sum(call["lengths"]) and 0 < call["useful_row_step_frac"] <= 1
    assert 0 < call["fraction_of_floor"] and report["rates"]["bytes_per_s"] > 0
    calibration = report["eos_calibration"]
    assert 0.1 < calibration["eos_probability"] < 0.5  # about 1/4, measured on other prompts' states
    assert call["len_mean"] < 8  # EOS comes: not every row runs to the limit
    assert report["machine"]["cpu_capability"] and report["warmup_s"] > 0


def test_eos_every_needs_a_random_model(tmp_path):
    proc = _decode("--model", "builtin", "--eos-every", "10", "--workdir", str(tmp_path), timeout=300)
    assert proc.returncode != 0 and "--eos-every applies to a random model" in proc.stderr
