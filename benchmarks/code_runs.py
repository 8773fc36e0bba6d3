"""Code on a CPU: the code_simple preset (the built-in model writes Python functions against hidden tests
in the bubblewrap sandbox), single-turn and with execution feedback (``rollout.max_turns=3``), N seeds each.

Each run is `rlvr train --config code_simple seed=N rollout.max_turns=T run_dir=...` in a subprocess, as a
user runs it. Its greedy held-out pass@1 is measured before and after training in *both* modes, with
`rlvr eval --max-turns 1` (the first attempt) and `--max-turns 3` (a failing attempt gets the first failing
test back, up to three attempts; ``accuracy_first_turn`` is then the first attempt's), on the same held-out
problems. The summary of a run holds the CPU capability, the training time, seconds per step and its
phases (rollout, reward, update), the reward's share of the step, the sandbox's programs and seconds per
step, the sampled pass rate over the first and last 5 steps, turns per episode, and the evaluations.

    python benchmarks/code_runs.py --seeds 0 1 2 -- train.steps=20
    python benchmarks/code_runs.py --seeds 0 --variants feedback --limit 20 -- train.steps=2   # a smoke run

Writes benchmarks/results/code_runs-<capability>-<tag>.json (every run, and per variant the mean over
seeds) and prints a Markdown table. Nothing else should run on the machine meanwhile: the times matter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tool_runs import _jsonl, _mean, cpu_capability  # the same run files, the same means

RESULTS = Path(__file__).parent / "results"
VARIANTS = {"single": 1, "feedback": 3}
"""Variant -> rollout.max_turns of its training."""


def evaluate(model: str, out: Path, *, turns: int, limit: int, env: dict, extra: list[str]) -> dict:
    """Greedy held-out pass@1 of ``model`` on the built-in code task with up to ``turns`` attempts."""
    cmd = [
        sys.executable, "-m", "rlvr.cli", "eval", "--model", model, "--data", "code", "--limit", str(limit),
        "--max-turns", str(turns), "--template", "r1_code", "--max-new-tokens", "128", "-o", str(out), *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        sys.exit(f"`{' '.join(cmd)}` failed:\n{done.stderr[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    keep = ("accuracy", "accuracy_first_turn", "turns_mean", "format_rate", "truncated_frac", "time_s")
    return {k: s[k] for k in keep if k in s}


def summarise(run_dir: Path, *, variant: str, seed: int, wall_s: float, capability: str, overrides: list[str]) -> dict:
    """One run's training summary from its metrics.jsonl."""
    metrics = _jsonl(run_dir / "metrics.jsonl")
    first, last = metrics[:5], metrics[-5:]
    steps = len(metrics)
    total = lambda k: sum(m.get(k, 0.0) for m in metrics)  # noqa: E731
    train_s = total("time/step_s")
    return {
        "variant": variant,
        "seed": seed,
        "cpu_capability": capability,
        "overrides": overrides,
        "steps": steps,
        "wall_min": round(wall_s / 60, 2),
        "train_min": round(train_s / 60, 2),
        "s_per_step": round(train_s / max(steps, 1), 1),
        "rollout_s_per_step": round(total("time/rollout_s") / max(steps, 1), 2),
        "reward_s_per_step": round(total("time/reward_s") / max(steps, 1), 2),
        "update_s_per_step": round(total("time/update_s") / max(steps, 1), 2),
        "reward_share_of_step": round(total("time/reward_s") / train_s, 3) if train_s else None,
        "programs_per_step": round(total("code/programs") / max(steps, 1), 1),
        "sandbox_exec_s_per_step": round(total("code/exec_s") / max(steps, 1), 2),
        "timeouts": int(total("code/timeouts")),
        "sandbox_errors": int(total("code/sandbox_errors")),
        "pass_rate_first5": _mean(first, "rollout/accuracy"),
        "pass_rate_last5": _mean(last, "rollout/accuracy"),
        "tests_passed_first5": _mean(first, "reward/code_tests_frac_mean"),
        "tests_passed_last5": _mean(last, "reward/code_tests_frac_mean"),
        "turns_mean": _mean(metrics, "rollout/turns_mean"),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--limit", type=int, default=50, help="held-out problems evaluated (default: %(default)s)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the model trained (default: %(default)s)")
    ap.add_argument("--tag", default="default", help="name part of the result file")
    ap.add_argument("--runs", default="/tmp/rlvr-code-runs", help="where the run directories go")
    ap.add_argument("--results", default=str(RESULTS), help="where the result file goes (default: %(default)s)")
    ap.add_argument("--eval-args", default="", help="extra `rlvr eval` flags, e.g. '--device cpu'")
    ap.add_argument("overrides", nargs="*", help="extra config overrides for every run, after --")
    args = ap.parse_args(argv)
    env = dict(os.environ)
    capability = cpu_capability(env)
    runs = Path(args.runs)
    extra = args.eval_args.split()
    base = {
        f"turns{t}": evaluate(args.model, runs / f"base-{args.tag}-turns{t}", turns=t, limit=args.limit, env=env,
                              extra=extra)
        for t in sorted(set(VARIANTS.values()))
    }  # fmt: skip
    print(json.dumps({"base": base}), flush=True)
    rows = []
    for variant in args.variants:
        for seed in args.seeds:
            run_dir = runs / f"{variant}-{args.tag}-{capability}-seed{seed}"
            if run_dir.exists():
                sys.exit(f"{run_dir} exists; remove it or pass --runs elsewhere")
            cmd = [
                sys.executable, "-m", "rlvr.cli", "train", "--config", "code_simple", f"model.path={args.model}",
                f"seed={seed}", f"run_dir={run_dir}", f"rollout.max_turns={VARIANTS[variant]}",
                "eval.every_steps=0", "log.progress=false", *args.overrides,
            ]  # fmt: skip
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
            row = summarise(
                run_dir, variant=variant, seed=seed, wall_s=time.perf_counter() - t0, capability=capability,
                overrides=args.overrides,
            )  # fmt: skip
            row["eval_after"] = {
                f"turns{t}": evaluate(str(run_dir), run_dir / f"eval-turns{t}", turns=t, limit=args.limit, env=env,
                                      extra=extra)
                for t in sorted(set(VARIANTS.values()))
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    mean = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        mean[variant] = {"seeds": [r["seed"] for r in mine], "train_min": _mean(mine, "train_min")}
        for mode in base:
            for key in ("accuracy", "accuracy_first_turn"):
                got = _mean([r["eval_after"][mode] for r in mine], key)
                if got is not None:
                    mean[variant][f"eval_{mode}_{key}_after"] = got
    out = Path(args.results) / f"code_runs-{capability}-{args.tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"base": base, "runs": rows, "mean": mean}, indent=2) + "\n")
    print(f"\n{capability}, {args.tag} -> {out}")
    print("| variant | seed | steps | train min | s/step | reward share | pass rate first 5 -> last 5 | "
          "eval 1 turn before -> after | eval 3 turns before -> after |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        b1, b3 = base["turns1"]["accuracy"], base["turns3"]["accuracy"]
        a1, a3 = r["eval_after"]["turns1"]["accuracy"], r["eval_after"]["turns3"]["accuracy"]
        print(f"| {r['variant']} | {r['seed']} | {r['steps']} | {r['train_min']} | {r['s_per_step']} | "
              f"{r['reward_share_of_step']} | {r['pass_rate_first5']} -> {r['pass_rate_last5']} | {b1} -> {a1} | "
              f"{b3} -> {a3} |")  # fmt: skip


if __name__ == "__main__":
    main()
