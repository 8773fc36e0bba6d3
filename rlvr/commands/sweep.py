"""`rlvr sweep`: a grid of training runs, one after another, resumable; then a comparison."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  rlvr sweep --grid rollout.samples_per_prompt=4,8 --sweep-dir runs/g_ablation train.steps=20
  rlvr sweep --config configs/quickstart.yaml --grid train.lr=5e-6,1e-5 --repeat 2
  rlvr sweep --spec format_weight              # configs/ablations/format_weight.yaml
  rlvr sweep --spec group_size --dry-run       # list the runs and whether each is done
Run the same command again to finish an interrupted sweep: finished runs are skipped and a
stopped run resumes from its last checkpoint.
"""


def cmd_sweep(args) -> int:
    from pathlib import Path

    from rlvr.commands.common import quiet_libraries
    from rlvr.reporting.compare import compare_runs
    from rlvr.reporting.sweep import Sweep, load_spec, parse_grid, run_state, run_sweep
    from rlvr.run_dir import RunDir

    spec = load_spec(args.spec) if args.spec else {}
    grid = list(spec.get("grid", []))
    for text in args.grid or []:
        key, values = parse_grid(text)
        grid = [(k, v) for k, v in grid if k != key] + [(key, values)]  # the command line wins
    sweep_dir = args.sweep_dir or spec.get("sweep_dir") or "runs/sweep"
    sweep = Sweep(
        base=args.config or spec.get("base"),
        grid=grid,
        repeat=args.repeat if args.repeat is not None else int(spec.get("repeat", 1)),
        sweep_dir=Path(sweep_dir),
        overrides=[*spec.get("overrides", []), *args.overrides],
    )
    if args.dry_run:
        from rlvr.config import load_config

        for r in sweep.plan():
            state = run_state(r, load_config(sweep.base, r.overrides).train.steps)
            print(f"{state:8s} {r.run_dir}   {' '.join(o for o in r.overrides if not o.startswith('run_dir='))}")
        return 0
    quiet_libraries()
    runs, failed = run_sweep(sweep)
    have = [r.run_dir for r in runs if RunDir(r.run_dir).metrics_file.is_file()]
    if have:
        title = f"Sweep {sweep.sweep_dir.name}: " + ", ".join(k for k, _ in sweep.grid)
        out = compare_runs(have, sweep.sweep_dir / "compare", title=title)
        print(f"comparison: {out / 'compare.html'}")
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}; run the same command again to retry them")
        return 1
    return 0


def register(sub) -> None:
    from rlvr.commands.common import add_config_args

    p = sub.add_parser(
        "sweep", help="run a grid of configs one after another (resumable), then compare them",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p)
    p.add_argument("--grid", "-g", action="append", metavar="KEY=V1,V2",
                   help="a config key and its values (repeat for a cartesian product); lists: key=[1,0],[1,1]")
    p.add_argument("--repeat", type=int, default=None, help="seeds per combination: seed, seed+1, … (default 1)")
    p.add_argument("--sweep-dir", default=None, help="parent of the run directories (default runs/sweep)")
    p.add_argument("--spec", default=None,
                   help="sweep spec YAML (config, grid, repeat, sweep_dir, overrides), or a name in configs/ablations/")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their state; train nothing")
    p.set_defaults(func=cmd_sweep)
