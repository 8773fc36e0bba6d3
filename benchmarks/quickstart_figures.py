"""The docs' quickstart figure and quoted numbers, both from one finished quickstart run.

    python benchmarks/quickstart_figures.py runs/quickstart --time-file /tmp/qs.time \\
        --beside "other engineers' edits and test runs" --other-work-from 09:58

Reads RUN through rlvr's run reader (rlvr.analysis.run) and writes

- docs/images/quickstart_overview.png: the overview the README, docs/usage.md and
  docs/recipes-and-results.md show (the only docs image that comes from the quickstart run);
- benchmarks/results/quickstart_<date>_<cpukind>.json and .md: the numbers those pages quote
  (strict accuracy over steps 1-10 and 31-40, greedy evaluation before and after, minutes of
  training, s/step, minutes in all, peak RSS) with the machine, the torch version, the date and
  what ran beside the run. With --other-work-from, also the steps that ended before that time and
  their s/step (when each step ended is in the run's TensorBoard events).

Run it on the machine that ran the quickstart: the CPU, its PyTorch dispatch level and the torch
version are read here, not from the run. Minutes in all come from --time-file (what `time` or
`/usr/bin/time` wrote about `make quickstart`); without it, from the run's files (config.yaml
written to the last file written), which leaves out the start-up before config.yaml.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import platform
import re
import statistics
from pathlib import Path

from rlvr import metric_names as M
from rlvr.analysis.plots import save_overview
from rlvr.analysis.run import Run, load_run

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / "docs" / "images" / "quickstart_overview.png"
RESULTS = ROOT / "benchmarks" / "results"


def wall_seconds(text: str) -> float | None:
    """Wall seconds from what a timer printed: bash `time` (real 9m12.3s), `time -p` (real 552.3),
    GNU time (0:09:12elapsed, or -v's 'Elapsed (wall clock) time ...: 9:12.30'), or a bare number."""
    if m := re.search(r"real\s+(?:(\d+)m)?([\d.]+)s?", text):
        return 60 * int(m[1] or 0) + float(m[2])
    if m := re.search(r"(?:(\d+):)?(\d+):([\d.]+)\s*elapsed", text) or re.search(
        r"Elapsed \(wall clock\) time.*?\):\s*(?:(\d+):)?(\d+):([\d.]+)", text
    ):
        return 3600 * int(m[1] or 0) + 60 * int(m[2]) + float(m[3])
    if re.fullmatch(r"\s*[\d.]+\s*", text):
        return float(text)
    return None


def files_seconds(run: Run) -> float:
    """config.yaml written (the run's start, after imports and the config) to the last file written."""
    start = run.dir.config_file.stat().st_mtime
    return max(p.stat().st_mtime for p in run.path.rglob("*") if p.is_file()) - start


def step_end_times(run: Run) -> dict[int, float]:
    """When each step was logged (Unix time), from ``RUN/tensorboard``: metrics.jsonl has no clock."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run.dir.tensorboard_dir), size_guidance={"scalars": 0})
    events.Reload()
    if M.TIME_STEP_S not in events.Tags().get("scalars", []):
        return {}
    return {e.step: e.wall_time for e in events.Scalars(M.TIME_STEP_S)}


def before_other_work(run: Run, hhmm: str) -> dict:
    """The steps that ended before ``hhmm`` (UTC, the run's start date) and their mean s/step."""
    start = datetime.datetime.fromtimestamp(run.dir.config_file.stat().st_mtime, datetime.timezone.utc)
    hour, minute = map(int, hhmm.split(":"))
    cut = start.replace(hour=hour, minute=minute, second=0, microsecond=0).timestamp()
    ended = step_end_times(run)
    steps, step_s = run.series(M.TIME_STEP_S)
    quiet = [t for s, t in zip(steps, step_s) if s in ended and ended[s] < cut]
    return {
        "other_work_from_utc": hhmm,
        "steps_before_other_work": len(quiet),
        "s_per_step_before_other_work": round(mean(quiet), 2),
        "s_per_step_after": round(mean(step_s[len(quiet) :]), 2),
    }


def machine() -> dict:
    """The CPU this runs on, as Linux names it and as PyTorch dispatches on it."""
    import torch

    from rlvr.cpu.packed import cpu_flags

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    name = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    flags = cpu_flags()
    return {
        "cpu": name[1].strip() if name else platform.processor(),
        "cores": len(re.findall(r"^processor\s*:", cpuinfo, re.M)),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "amx": "amx_tile" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def greedy(row: dict) -> dict:
    """An evaluation row's ``eval/...`` numbers without the prefix."""
    return {k.removeprefix(M.EVAL): v for k, v in row.items() if k.startswith(M.EVAL)}


def summarise(run: Run, *, wall_s: float, wall_from: str, beside: str, host: dict) -> dict:
    """The numbers the README and the docs quote, from ``run``'s metrics and evaluations.

    Field names follow ``quickstart_runs.py``'s summaries (``accuracy_first10``, ``train_min``, ...).
    """
    steps, acc = run.series(M.ACCURACY)
    fmt = run.series(M.FORMAT_RATE)[1]
    step_s, rollout_s, update_s = (run.series(k)[1] for k in (M.TIME_STEP_S, M.TIME_ROLLOUT_S, M.TIME_UPDATE_S))
    rss = run.series(M.PEAK_RSS_MIB)[1]
    evals = {r["step"]: r for r in run.evals}
    last_eval = max(evals, default=0)
    started = datetime.datetime.fromtimestamp(run.dir.config_file.stat().st_mtime, datetime.timezone.utc)
    return {
        "run": str(run.path),
        "status": run.status(),
        "date": started.strftime("%Y-%m-%d"),
        "started_utc": started.strftime("%Y-%m-%d %H:%M"),
        **host,
        "rollout_dtype": run.cfg("rollout.dtype"),
        "autocast_bf16": run.cfg("model.autocast_bf16"),
        "seed": run.cfg("seed"),
        "beside": beside,
        "steps": len(steps),
        "accuracy_step1": round(acc[0], 3) if acc else None,
        "first_step_accuracy_ge_half": next((s for s, a in zip(steps, acc) if a >= 0.5), None),
        "accuracy_first10": round(mean(acc[:10]), 3),  # strict accuracy, steps 1-10
        "accuracy_last10": round(mean(acc[-10:]), 3),  # steps 31-40 of the quickstart's 40
        "format_first10": round(mean(fmt[:10]), 3),
        "format_last10": round(mean(fmt[-10:]), 3),
        "eval_before": greedy(evals.get(0, {})),
        "eval_after": greedy(evals[last_eval]) if last_eval else {},
        "eval_after_step": last_eval or None,
        "train_min": round(sum(step_s) / 60, 2),
        "s_per_step": round(mean(step_s), 2),
        "rollout_s_per_step_median": round(median(rollout_s), 2),
        "update_s_per_step_median": round(median(update_s), 2),
        "total_min": round(wall_s / 60, 2),
        "total_from": wall_from,
        "peak_rss_gib": round(max(rss) / 1024, 2) if rss else None,
    }


def markdown(r: dict) -> str:
    """The summary as a two-column Markdown table."""

    def ev(e: dict) -> str:
        return f"{e.get('accuracy', float('nan')):.3f} / {e.get('format_rate', float('nan')):.3f}"

    n = r["steps"]
    rows = [
        ("machine", f"{r['cpu']}, {r['cores']} cores, {r['cpu_capability']}, AMX {'yes' if r['amx'] else 'no'}"),
        ("precision", f"rollout {r['rollout_dtype']}, bf16 autocast {r['autocast_bf16']}"),
        ("torch; started", f"{r['torch']}; {r['started_utc']} UTC"),
        ("beside it", r["beside"] or "nothing"),
        *(
            [
                (
                    f"s/step before other work (from {r['other_work_from_utc']} UTC) / after",
                    f"{r['s_per_step_before_other_work']:.1f} (steps 1–{r['steps_before_other_work']}) / "
                    f"{r['s_per_step_after']:.1f}",
                )
            ]
            if "other_work_from_utc" in r
            else []
        ),
        ("strict accuracy at step 1", f"{r['accuracy_step1']:.3f}"),
        ("first step with strict accuracy ≥ 0.5", r["first_step_accuracy_ge_half"]),
        ("strict accuracy, steps 1–10", f"{r['accuracy_first10']:.3f}"),
        (f"strict accuracy, steps {n - 9}–{n}", f"{r['accuracy_last10']:.3f}"),
        (f"format, steps {n - 9}–{n}", f"{r['format_last10']:.3f}"),
        ("greedy eval accuracy / format, before → after", f"{ev(r['eval_before'])} → {ev(r['eval_after'])}"),
        ("training", f"{r['train_min']:.1f} min, {r['s_per_step']:.1f} s/step"),
        (
            "per-step medians: sampling + update",
            f"{r['rollout_s_per_step_median']} + {r['update_s_per_step_median']} s",
        ),
        ("in all", f"{r['total_min']:.1f} min (from {r['total_from']})"),
        ("peak RSS", f"{r['peak_rss_gib']:.2f} GiB"),
    ]
    head = (
        f"# Quickstart, {r['date']}, {r['cpu_capability']}\n\n"
        f"`{r['run']}` ({r['status']}), summarised by `benchmarks/quickstart_figures.py`.\n\n"
    )
    return head + "| | |\n| --- | --- |\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a finished quickstart run directory (runs/quickstart)")
    ap.add_argument("--time-file", type=Path, help="what the timer of `make quickstart` wrote")
    ap.add_argument("--beside", default="", help="what else ran on the machine meanwhile (empty: nothing)")
    ap.add_argument("--other-work-from", metavar="HH:MM", help="when that other work began (UTC)")
    ap.add_argument("--image", type=Path, default=IMAGE)
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    run = load_run(args.run)
    if not run.complete:
        raise SystemExit(f"{args.run}: {run.status()}; wait for the run to finish")
    wall_s = wall_seconds(args.time_file.read_text()) if args.time_file else None
    if args.time_file and wall_s is None:
        raise SystemExit(f"{args.time_file}: no wall time found in it")
    wall_from = f"the timer of `make quickstart`, {args.time_file}" if wall_s is not None else "the run's files"
    if wall_s is None:
        wall_s = files_seconds(run)
    host = machine()
    r = summarise(run, wall_s=wall_s, wall_from=wall_from, beside=args.beside, host=host)
    if args.other_work_from:
        r |= before_other_work(run, args.other_work_from)
    kind = r["cpu_capability"] + ("-AMX" if r["amx"] else "")
    stem = args.results / f"quickstart_{r['date']}_{kind}"
    args.results.mkdir(parents=True, exist_ok=True)
    title = f"make quickstart, {r['date']}, {kind} ({r['rollout_dtype']}): training overview"
    save_overview(run, args.image, title)
    # the figure's digest beside the numbers: tests/test_readme_numbers.py checks that the README's
    # figure and its quoted numbers come from this one run
    r["figure"] = (
        str(args.image.resolve().relative_to(ROOT)) if args.image.resolve().is_relative_to(ROOT) else str(args.image)
    )
    r["figure_sha256"] = hashlib.sha256(args.image.read_bytes()).hexdigest()
    stem.with_suffix(".json").write_text(json.dumps(r, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(r))
    print(markdown(r))
    print(f"wrote {stem}.json, {stem}.md and {args.image}")


if __name__ == "__main__":
    main()
