"""Tool use on a CPU: the arithmetic_tool preset (a calculator) and its control (no tools), N seeds each.

Each run is `rlvr train --config PRESET seed=N run_dir=...` in a subprocess, as a user runs it, timed
from start to exit, evaluated greedily on held-out problems before and after training (and every
``--eval-every`` steps). The summary of a run holds the CPU capability, the wall and training time,
seconds per step, the sampled accuracy, tool calls per completion and tool error rate over the first
and last 10 steps, and the held-out evaluation (accuracy, tool use, accuracy with and without a call)
before and after. The issue's target: the tool run's greedy held-out accuracy from <= 0.1 to >= 0.7
within 30 minutes of training on an AVX2 CPU, while the control stays <= 0.2.

    python benchmarks/tool_runs.py --seeds 0 1 2                      # both presets, 3 seeds each
    python benchmarks/tool_runs.py --seeds 0 --avx2                   # dispatch as on an AVX2-only CPU
    python benchmarks/tool_runs.py --seeds 0 --presets arithmetic_tool -- train.steps=80

Writes benchmarks/results/tool_runs-<capability>-<tag>.json (every run, and per preset the mean over
seeds) and prints a Markdown table. Nothing else should run on the machine meanwhile: the times matter.
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

RESULTS = Path(__file__).parent / "results"
PRESETS = ("arithmetic_tool", "arithmetic_tool_control")
"""The default pair; ``--presets arithmetic_tool_choice arithmetic_tool`` compares a chosen call with a forced
one (the result then holds, per kind of problem, the held-out accuracy and tool-use rate)."""
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
EVAL_KEYS = (
    "accuracy",
    "format_rate",
    "tool_calls_mean",
    "tool_error_rate",
    "accuracy_with_tool",
    "accuracy_without_tool",
)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.fmean(values), 3) if values else None


def cpu_capability(env: dict) -> str:
    """``torch.backends.cpu.get_cpu_capability()`` as the runs see it (``env`` may force AVX2 dispatch)."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def by_kind(predictions: list[dict]) -> dict:
    """Held-out greedy accuracy and tool-use rate per kind of problem: ``needs_tool`` (a product, which a
    135M model cannot do in its head) and ``no_tool`` (a sum, ``arithmetic_tool_choice``'s other half)."""
    out = {}
    for kind in ("needs_tool", "no_tool"):
        mine = [p for p in predictions if ("*" in p["question"]) == (kind == "needs_tool")]
        if mine:
            out[kind] = {
                "n": len(mine),
                "accuracy": round(statistics.fmean(p["correct"] for p in mine), 3),
                "tool_use_rate": round(statistics.fmean(p.get("tool_calls", 0) > 0 for p in mine), 3),
            }
    return out


def summarise(run_dir: Path, *, preset: str, seed: int, wall_s: float, capability: str, overrides: list[str]) -> dict:
    """One run's summary from its metrics.jsonl and eval/history.jsonl."""
    metrics = _jsonl(run_dir / "metrics.jsonl")
    evals = sorted(_jsonl(run_dir / "eval" / "history.jsonl"), key=lambda e: e["step"])
    first, last = metrics[:10], metrics[-10:]
    train_s = sum(m["time/step_s"] for m in metrics)
    pick = lambda e: {k: e.get(f"eval/{k}") for k in EVAL_KEYS if f"eval/{k}" in e}  # noqa: E731
    elapsed, curve = 0.0, []
    times = {m["step"]: m["time/step_s"] for m in metrics}
    for e in evals:  # held-out accuracy against training minutes (step times up to the evaluated step)
        elapsed = sum(t for s, t in times.items() if s <= e["step"])
        curve.append({"step": e["step"], "train_min": round(elapsed / 60, 2), **pick(e)})
    return {
        "preset": preset,
        "seed": seed,
        "cpu_capability": capability,
        "overrides": overrides,
        "steps": len(metrics),
        "wall_min": round(wall_s / 60, 2),
        "train_min": round(train_s / 60, 2),
        "s_per_step": round(train_s / max(len(metrics), 1), 1),
        "accuracy_first10": _mean(first, "rollout/accuracy"),
        "accuracy_last10": _mean(last, "rollout/accuracy"),
        "tool_calls_first10": _mean(first, "rollout/tool_calls_mean"),
        "tool_calls_last10": _mean(last, "rollout/tool_calls_mean"),
        "tool_error_rate_last10": _mean(last, "rollout/tool_error_rate"),
        "eval_before": pick(evals[0]) if evals else {},
        "eval_after": pick(evals[-1]) if evals else {},
        "eval_curve": curve,
        "eval_by_kind_before": by_kind(_jsonl(run_dir / "eval" / f"step_{evals[0]['step']:06d}" / "predictions.jsonl"))
        if evals
        else {},
        "eval_by_kind_after": by_kind(_jsonl(run_dir / "eval" / f"step_{evals[-1]['step']:06d}" / "predictions.jsonl"))
        if evals
        else {},
    }


def aggregate(rows: list[dict]) -> dict:
    """Per preset: the mean over seeds of the wall time and of the held-out accuracy before and after."""
    out = {}
    for preset in dict.fromkeys(r["preset"] for r in rows):
        mine = [r for r in rows if r["preset"] == preset]
        out[preset] = {
            "seeds": [r["seed"] for r in mine],
            "train_min": _mean(mine, "train_min"),
            "eval_accuracy_before": _mean([r["eval_before"] for r in mine], "accuracy"),
            "eval_accuracy_after": _mean([r["eval_after"] for r in mine], "accuracy"),
            "eval_tool_calls_after": _mean([r["eval_after"] for r in mine], "tool_calls_mean"),
        }
        for when in ("before", "after"):
            for kind in ("needs_tool", "no_tool"):
                parts = [r[f"eval_by_kind_{when}"][kind] for r in mine if kind in r[f"eval_by_kind_{when}"]]
                for key in ("accuracy", "tool_use_rate"):
                    if parts:
                        out[preset][f"eval_{kind}_{key}_{when}"] = _mean(parts, key)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), help="presets to run (default: %(default)s)")
    ap.add_argument("--eval-every", type=int, default=20, help="held-out evaluation every N steps (0 = start/end)")
    ap.add_argument("--avx2", action="store_true", help="dispatch as on an AVX2-only CPU (emulation)")
    ap.add_argument("--tag", default="default", help="name part of the result file")
    ap.add_argument("--runs", default="/tmp/rlvr-tool-runs", help="where the run directories go")
    ap.add_argument("--results", default=str(RESULTS), help="where the result file goes (default: %(default)s)")
    ap.add_argument("overrides", nargs="*", help="extra config overrides for every run, after --")
    args = ap.parse_args(argv)
    env = {**os.environ, **(AVX2_ENV if args.avx2 else {})}
    capability = cpu_capability(env)
    rows = []
    for preset in args.presets:
        for seed in args.seeds:
            run_dir = Path(args.runs) / f"{preset}-{args.tag}-{capability}-seed{seed}"
            if run_dir.exists():
                sys.exit(f"{run_dir} exists; remove it or pass --runs elsewhere")
            cmd = [
                sys.executable, "-m", "rlvr.cli", "train", "--config", preset, f"seed={seed}", f"run_dir={run_dir}",
                f"eval.every_steps={args.eval_every}", "log.progress=false", *args.overrides,
            ]  # fmt: skip
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
            row = summarise(
                run_dir, preset=preset, seed=seed, wall_s=time.perf_counter() - t0, capability=capability,
                overrides=args.overrides,
            )  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.results) / f"tool_runs-{capability}-{args.tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": rows, "mean": aggregate(rows)}, indent=2) + "\n")
    cols = ["preset", "seed", "steps", "train_min", "s_per_step", "accuracy_last10", "tool_calls_last10"]
    print(f"\n{capability}, {args.tag} -> {out}\n| " + " | ".join(cols + ["eval acc before", "eval acc after"]) + " |")
    print("|" + " --- |" * (len(cols) + 2))
    for r in rows:
        before, after = r["eval_before"].get("accuracy"), r["eval_after"].get("accuracy")
        print("| " + " | ".join(str(r[c]) for c in cols) + f" | {before} | {after} |")


if __name__ == "__main__":
    main()
