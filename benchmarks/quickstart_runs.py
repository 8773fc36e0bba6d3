"""Run the quickstart as a user does and summarise what it took and what it learned.

Each run is `rlvr train seed=N run_dir=...` in a subprocess (the quickstart preset, plus any
overrides), timed from start to exit. The summary holds the CPU capability it ran on, the wall
time, seconds per step split into sampling and update, strict accuracy and R1-format rate over
the first and last 10 steps, and the greedy evaluation before and after.

    python benchmarks/quickstart_runs.py --seeds 0 1 2
    python benchmarks/quickstart_runs.py --seeds 0 --avx2        # PyTorch/oneDNN dispatch as on an AVX2-only CPU
    python benchmarks/quickstart_runs.py --seeds 0 --tag old -- rollout.stop=[] train.steps=40

Writes benchmarks/results/quickstart-<capability>-<tag>-seed<N>.json (one per run, with the date, the
start time, the CPU and the dispatch, from which benchmarks/summary.py tells the kind of machine) and
prints a Markdown table. Nothing else should run on the machine meanwhile: the times are the point.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def cpu_identity() -> dict:
    """The first processor's vendor, family, model and name in /proc/cpuinfo ({} where there is none)."""
    from rlvr.models.precision import cpu_identity as identity

    keys = ("vendor_id", "cpu family", "model", "model name")
    return {k: v for k, v in identity().items() if k in keys}


def summarise(run_dir: Path, *, wall_s: float, capability: str, seed: int, overrides: list[str]) -> dict:
    metrics = _jsonl(run_dir / "metrics.jsonl")
    evals = {e["step"]: e for e in _jsonl(run_dir / "eval" / "history.jsonl")}
    first, last = metrics[:10], metrics[-10:]
    before, after = evals.get(0, {}), evals.get(max(evals) if evals else -1, {})
    return {
        "cpu_capability": capability,
        "seed": seed,
        "overrides": overrides,
        "steps": len(metrics),
        "wall_min": round(wall_s / 60, 2),
        "train_min": round(sum(m["time/step_s"] for m in metrics) / 60, 2),
        "s_per_step": round(_mean(metrics, "time/step_s"), 1),
        "rollout_s_per_step": round(_mean(metrics, "time/rollout_s"), 1),
        "update_s_per_step": round(_mean(metrics, "time/update_s"), 1),
        "gen_tokens_per_s": round(_mean(metrics, "perf/gen_tokens_per_s"), 1),
        "peak_rss_gb": round(max(m.get("perf/peak_rss_mib", 0) for m in metrics) / 1024, 2),
        "accuracy_first10": round(_mean(first, "rollout/accuracy"), 3),
        "accuracy_last10": round(_mean(last, "rollout/accuracy"), 3),
        "format_first10": round(_mean(first, "rollout/format_rate"), 3),
        "format_last10": round(_mean(last, "rollout/format_rate"), 3),
        "eval_before": {k.removeprefix("eval/"): v for k, v in before.items() if k.startswith("eval/")},
        "eval_after": {k.removeprefix("eval/"): v for k, v in after.items() if k.startswith("eval/")},
        "eval_after_step": after.get("step"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--avx2", action="store_true", help="dispatch as on an AVX2-only CPU (emulation)")
    ap.add_argument("--tag", default="quickstart", help="name part of the result files")
    ap.add_argument("--runs", default="/tmp/rlvr-bench-runs", help="where the run directories go")
    ap.add_argument("overrides", nargs="*", help="extra config overrides, after --")
    args = ap.parse_args()
    env = {**os.environ, **(AVX2_ENV if args.avx2 else {})}
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    capability = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds:
        run_dir = Path(args.runs) / f"{args.tag}-{capability}-seed{seed}"
        if run_dir.exists():
            sys.exit(f"{run_dir} exists; remove it or pass --runs elsewhere")
        cmd = [
            sys.executable,
            "-m",
            "rlvr.cli",
            "train",
            f"seed={seed}",
            f"run_dir={run_dir}",
            "log.progress=false",
            *args.overrides,
        ]
        started, t0 = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        row = {
            "date": started.date().isoformat(),
            "started_utc": started.strftime("%Y-%m-%d %H:%M"),
            "cpu": cpu_identity(),
            "dispatch": "avx2" if args.avx2 else "native",
            **summarise(
                run_dir, wall_s=time.perf_counter() - t0, capability=capability, seed=seed, overrides=args.overrides
            ),
        }
        out = RESULTS / f"quickstart-{capability}-{args.tag}-seed{seed}.json"
        out.write_text(json.dumps(row, indent=2) + "\n")
        rows.append(row)
        print(json.dumps(row), flush=True)
    cols = [
        "seed",
        "steps",
        "wall_min",
        "s_per_step",
        "rollout_s_per_step",
        "update_s_per_step",
        "accuracy_first10",
        "accuracy_last10",
        "format_last10",
    ]
    print(f"\n{capability}, {args.tag}\n| " + " | ".join(cols + ["eval format after", "eval accuracy after"]) + " |")
    print("|" + " --- |" * (len(cols) + 2))
    for r in rows:
        ev = r["eval_after"]
        print("| " + " | ".join(str(r[c]) for c in cols) + f" | {ev.get('format_rate')} | {ev.get('accuracy')} |")


if __name__ == "__main__":
    main()
