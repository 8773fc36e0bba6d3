"""benchmarks/results/SUMMARY.md is what benchmarks/summary.py writes from the result files now, and
the script picks the newest result per kind of machine from what each file records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # the benchmarks' own folder
import summary  # noqa: E402


def test_the_committed_summary_is_what_the_script_writes():
    assert summary.SUMMARY.read_text() == summary.render(), "run `python benchmarks/summary.py`"


def test_every_kind_of_the_table_has_a_row_and_the_gpu_comes_last():
    rows = summary.readme_block(summary.render()).splitlines()[3:-1]
    machines = [r.split(" | ")[0].lstrip("| ") for r in rows]
    known = [m for m in machines if m in summary.KINDS.values()]
    assert known == list(summary.KINDS.values()) and machines[-1] == summary.KINDS["GPU"]


def _quickstart(path: Path, tag: str, when: str, cpu: dict, wall: float, dispatch: str = "native") -> None:
    row = {
        "date": when[:10],
        "started_utc": when,
        "cpu": cpu,
        "dispatch": dispatch,
        "cpu_capability": "AVX512",
        "seed": 0,
        "overrides": [],
        "wall_min": wall,
        "train_min": wall - 0.5,
        "s_per_step": 2.0,
        "update_s_per_step": 1.0,
        "peak_rss_gb": 5.0,
        "accuracy_first10": 0.3,
        "accuracy_last10": 0.9,
        "eval_before": {"accuracy": 0.0},
        "eval_after": {"accuracy": 1.0},
    }
    (path / f"quickstart-AVX512-{tag}-seed0.json").write_text(json.dumps(row))


def test_the_newest_run_of_each_kind_wins_and_the_cpu_names_the_kind(tmp_path, monkeypatch):
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    zen5 = {"vendor_id": "AuthenticAMD", "cpu family": "26", "model": "2", "model name": "AMD EPYC"}
    zen4 = {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17", "model name": "AMD EPYC"}
    _quickstart(tmp_path, "old", "2026-12-01 10:00", zen5, 3.0)
    _quickstart(tmp_path, "new", "2026-12-01 11:00", zen5, 1.5)
    _quickstart(tmp_path, "four", "2026-12-02 09:00", zen4, 4.0)
    _quickstart(tmp_path, "avx2", "2026-12-03 09:00", zen5, 6.0, dispatch="avx2")
    results = summary.load()
    picks = {k: summary.quickstart(results, k) for k in ("Zen 5", "Zen 4", "AVX2 dispatch")}
    assert picks["Zen 5"]["total"] == "1.50 min (seed 0)"  # not the older 3.00 of the same day
    assert picks["Zen 4"]["total"] == "4.00 min (seed 0)"
    assert picks["AVX2 dispatch"]["total"] == "6.00 min (seed 0)"
    table = "\n".join(summary.machine_table(results))
    assert "3.00 min" not in table and "1.50 min" in table
