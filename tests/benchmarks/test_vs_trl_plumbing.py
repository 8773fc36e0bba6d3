"""benchmarks/vs_trl.py runs end to end on a random model of a published shape (rlvr's side; TRL needs its own
venv), with the reward that varies by completion and the roofline fields its GPU run reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.extended  # the whole benchmark, run by hand too; the test below still runs its entry point
@pytest.mark.parametrize("eos_every", [None, 2], ids=["fixed-lengths", "eos-every-2"])
def test_the_benchmark_runs_on_a_random_model(tmp_path, eos_every):
    out = tmp_path / "result.json"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "vs_trl.py"),
        "--only",
        "rlvr",
        "--model",
        "random:tiny",
        "--steps",
        "2",
        "--prompts-per-step",
        "1",
        "--group-size",
        "2",
        "--max-new-tokens",
        "4",
        "--micro-batch-seqs",
        "2",
        "--prompts",
        "4",
        "--workdir",
        str(tmp_path / "work"),
        "--out",
        str(out),
        *(["--eos-every", str(eos_every)] if eos_every else []),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    rlvr = report["rlvr"]
    assert rlvr["optimizer_steps"] == 2 and rlvr["s_per_step"] > 0
    assert 0 < rlvr["rollout_fraction_of_floor"] and report["machine"]["rates"]["bytes_per_s"] > 0
    assert list(report["settings"]["rewards"]) == [f"{REPO / 'benchmarks' / 'spread_reward.py'}:spread"]
    assert any(s["reward_mean"] > 0 for s in rlvr["steps"])  # the spread reward pays a random model
    assert 1 <= rlvr["response_len_mean"] <= 4 and rlvr["response_len_max"] <= 4
    if eos_every is None:  # a random model never samples EOS: every response runs to the limit
        assert rlvr["response_len_mean"] == 4 and report["eos_calibration"] is None
    else:  # EOS about every 2 tokens, the row calibrated before rlvr loaded the model
        assert 0.25 < report["eos_calibration"]["eos_probability"] < 0.75
        assert report["eos_calibration"]["expected_len_mean"] < 4


def test_an_unknown_random_shape_is_one_line(tmp_path):
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "vs_trl.py"),
        "--only",
        "rlvr",
        "--model",
        "random:gpt5",
        "--workdir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode != 0 and "--model random:gpt5: unknown shape" in proc.stderr
