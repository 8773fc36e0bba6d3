"""Asynchronous rollouts on this machine: one process against a rollout worker apart from the trainer.

Each run is ``rlvr train --config CONFIG seed=N run_dir=... <mode> <extra>`` in a subprocess, as a user
runs it, timed from start to exit. The modes (``--modes``):

- ``one``: one process, every core (today's default);
- ``async1``: ``distributed.backend=ray distributed.rollout_workers=1 rollout.max_staleness=1``: one
  trainer and one rollout worker, a core each, step k+1's rollout made during step k's update;
- ``async0``: the same two actors at staleness 0 (disaggregated, no overlap: what the split alone costs);
- ``dp2``: ``distributed.num_workers=2``: two data-parallel trainers, a core each, each sampling its shard.

Per run: the wall and training time, seconds per step (the first step apart: it warms up), the phase
times (rollout, update), the trainer's wait for the rollout, the rollout worker's idle time, the
overlap fraction and the push time (async modes), the sampled accuracy of the first and last steps,
and the greedy held-out accuracy at the end. Per mode the mean over seeds.

    python benchmarks/async_runs.py --seeds 0 1 2 --tag quickstart-steps10 -- train.steps=10
    python benchmarks/async_runs.py --seeds 0 --modes one async1 --tag long -- train.steps=10 \\
        rollout.max_new_tokens=160 rollout.stop=[]                         # longer answers

Writes benchmarks/results/async_runs-<capability>-<tag>.json and prints a Markdown table. Nothing else
should run on the machine meanwhile: the times are the point (the result records the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from quickstart_runs import cpu_identity  # noqa: E402
from tool_runs import _jsonl, cpu_capability  # noqa: E402

RESULTS = Path(__file__).parent / "results"
MODES = {
    "one": [],
    "async1": ["distributed.backend=ray", "distributed.rollout_workers=1", "rollout.max_staleness=1"],
    "async0": ["distributed.backend=ray", "distributed.rollout_workers=1", "rollout.max_staleness=0"],
    "dp2": ["distributed.backend=ray", "distributed.num_workers=2"],
}
KEYS = (
    "time/step_s",
    "time/rollout_s",
    "time/update_s",
    "time/wait_rollout_s",
    "time/rollout_idle_s",
    "time/weight_push_s",
    "async/overlap_frac",
    "async/staleness",
)


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.fmean(values), 3) if values else None


def summarise(run_dir: Path, *, mode: str, seed: int, wall_s: float) -> dict:
    """One run's summary from its metrics.jsonl and eval/history.jsonl."""
    metrics = _jsonl(run_dir / "metrics.jsonl")
    evals = sorted(_jsonl(run_dir / "eval" / "history.jsonl"), key=lambda e: e["step"])
    warm = metrics[1:] or metrics  # the first step compiles, warms pools and (async) fills the pipeline
    k = max(1, len(metrics) // 3)
    return {
        "mode": mode,
        "seed": seed,
        "steps": len(metrics),
        "wall_min": round(wall_s / 60, 2),
        "train_min": round(sum(m["time/step_s"] for m in metrics) / 60, 2),
        "first_step_s": metrics[0]["time/step_s"] if metrics else None,
        **{f"{key.split('/')[1]}_mean": _mean(warm, key) for key in KEYS},
        "accuracy_first": _mean(metrics[:k], "rollout/accuracy"),
        "accuracy_last": _mean(metrics[-k:], "rollout/accuracy"),
        "accuracy_curve": [m.get("rollout/accuracy") for m in metrics],
        "per_step": [
            {
                "step_s": m["time/step_s"],
                "rollout_s": m.get("time/rollout_s", 0.0),
                "reward_s": m.get("time/reward_s", 0.0),
                "update_s": m.get("time/update_s", 0.0) + m.get("time/reference_s", 0.0),
                "push_s": m.get("time/weight_push_s", 0.0),
            }
            for m in metrics
        ],
        "eval_after": evals[-1].get("eval/accuracy") if evals else None,
    }


def aggregate(rows: list[dict]) -> dict:
    keys = [k for k, v in rows[0].items() if isinstance(v, (int, float)) and k not in ("seed",)]
    out = {"seeds": [r["seed"] for r in rows]}
    for key in keys:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            out[key] = round(statistics.fmean(values), 3)
            if len(values) > 1:
                out[f"{key}_sd"] = round(statistics.stdev(values), 3)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="quickstart")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--tag", default="runs")
    ap.add_argument("--workdir", type=Path, default=Path("runs/async_runs"))
    ap.add_argument("--summarise-only", action="store_true", help="read the runs already in --workdir (no training)")
    ap.add_argument("extra", nargs="*", help="overrides after --, for every run")
    args = ap.parse_args(argv)
    env = dict(os.environ)
    capability = cpu_capability(env)
    out = RESULTS / f"async_runs-{capability}-{args.tag}.json"
    earlier = {}  # --summarise-only keeps the wall times and loads the runs were measured with
    if args.summarise_only and out.is_file():
        earlier = {(r["mode"], r["seed"]): r for r in json.loads(out.read_text())["runs"]}
    rows = []
    for seed in args.seeds:
        for mode in args.modes:
            run_dir = args.workdir / f"{args.tag}-{mode}-s{seed}"
            cmd = [sys.executable, "-m", "rlvr.cli", "train", "--config", args.config, f"seed={seed}",
                   f"run_dir={run_dir}", "overwrite=true", "eval.at_start=false", "log.report=false",
                   *MODES[mode], *args.extra]  # fmt: skip
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            if args.summarise_only:
                before = earlier.get((mode, seed), {})
                wall, load = 60 * before.get("wall_min", 0.0), before.get("load_before", load)
            else:
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                wall = time.monotonic() - t0
                if done.returncode:
                    raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
            row = summarise(run_dir, mode=mode, seed=seed, wall_s=wall)
            row["load_before"] = round(load, 2)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("accuracy_curve", "per_step")}), flush=True)
    by_mode = {m: aggregate([r for r in rows if r["mode"] == m]) for m in args.modes}
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_capability": capability,
        "cpu": cpu_identity(),
        "cores": os.cpu_count(),
        "config": args.config,
        "overrides": args.extra,
        "modes": {m: MODES[m] for m in args.modes},
        "runs": rows,
        "by_mode": by_mode,
    }
    RESULTS.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    cols = ("step_s_mean", "rollout_s_mean", "update_s_mean", "wait_rollout_s_mean", "overlap_frac_mean",
            "weight_push_s_mean", "accuracy_first", "accuracy_last", "eval_after", "wall_min")  # fmt: skip
    print("\n| mode | " + " | ".join(cols) + " |\n|" + " --- |" * (len(cols) + 1))
    for m, agg in by_mode.items():
        print(f"| {m} | " + " | ".join(str(agg.get(c, "")) for c in cols) + " |")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
