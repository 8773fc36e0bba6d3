"""`rlvr compare RUN1 RUN2 …`: overlay the curves of several runs and tabulate their results."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  rlvr compare runs/g4 runs/g8                 # writes runs/compare/{compare.md,compare.html,plots/}
  rlvr compare runs/sweep/* --output /tmp/cmp
"""


def cmd_compare(args) -> int:
    from pathlib import Path

    from rlvr.analysis.compare import compare_runs, default_output
    from rlvr.errors import UserError
    from rlvr.run_dir import RunDir

    paths = []
    for p in map(Path, args.runs):
        # a glob like runs/* also catches an earlier comparison and the eval/export/generate outputs
        if (p / "compare.md").is_file():
            print(f"skipping {p}: a comparison, not a run")
            continue
        if p.is_dir() and not RunDir(p).is_run():
            print(f"skipping {p}: not a run (no metrics.jsonl or config.yaml)")
            continue
        paths.append(p)
    if not paths:
        raise UserError("give at least one run directory to compare")
    out = compare_runs(paths, Path(args.output) if args.output else default_output(paths), title=args.title)
    print(f"comparison: {out / 'compare.html'}\n            {out / 'compare.md'} (plots in {out / 'plots'})")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="overlay the curves of several runs; table of reward, accuracy, time, tokens/s, memory",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    p.add_argument(
        "--output",
        "-o",
        default=None,
        help="output directory (default: PARENT/compare when the runs share a parent, else ./compare)",
    )
    p.add_argument("--title", default="Run comparison", help="title of compare.md / compare.html")
    p.set_defaults(func=cmd_compare)
