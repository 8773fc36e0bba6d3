"""benchmarks/gpu_check.py --dry-run: the first GPU's one command runs its plumbing on a CPU with tiny models
(versions, the static and the dynamic decode through benchmarks/decode.py, their float32 agreement, a training
run, pytest's collection), skips what needs a GPU and says why, and writes the JSON and Markdown summaries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_dry_run_passes_and_writes_both_summaries(tmp_path):
    env = {"RLVR_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run", "--out-dir", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (summary,) = tmp_path.glob("gpu_check-*-dry-run.json")
    report = json.loads(summary.read_text())
    status = {r["stage"]: r["status"] for r in report["stages"]}
    assert status == {
        "versions": "ok", "decode-tiny-static": "ok", "decode-tiny-dynamic": "ok", "agreement": "ok",
        "vs_trl": "skipped", "train": "ok", "fsdp": "skipped", "fsdp-offload": "skipped", "pytest": "ok",
    }  # fmt: skip
    stages = {r["stage"]: r.get("result") for r in report["stages"]}
    assert stages["decode-tiny-static"]["engine"]["static"] and not stages["decode-tiny-dynamic"]["engine"]["static"]
    assert stages["agreement"]["float32_exact"] and stages["train"]["steps"] == 2
    traffic = stages["decode-tiny-static"]["attention_traffic"]  # the step's attention copies no keys or values
    assert traffic["folded"]["kv_copies"] == 0 < traffic["repeated"]["kv_copies"]
    assert stages["decode-tiny-dynamic"]["attention_traffic"] is None
    assert summary.with_suffix(".md").read_text().startswith("# GPU check: CPU")
