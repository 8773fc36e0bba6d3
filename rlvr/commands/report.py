"""`rlvr report RUN`: plots, report.md and a self-contained report.html for one run."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  rlvr report runs/quickstart                  # writes runs/quickstart/report/{report.md,report.html,plots/}
  rlvr report runs/quickstart --output /tmp/qs-report --top 5
"""


def cmd_report(args) -> int:
    from rlvr.analysis.report import build_report
    from rlvr.errors import UserError

    if args.top < 0:
        raise UserError(f"--top {args.top}: must be >= 0")
    out = build_report(args.run, args.output, top=args.top)
    print(f"report: {out / 'report.html'}\n        {out / 'report.md'} (plots in {out / 'plots'})")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "report",
        help="plots + report.md/report.html of a run (finished, running or crashed)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", metavar="RUN", help="run directory")
    p.add_argument("--output", "-o", default=None, help="output directory (default: RUN/report)")
    p.add_argument("--top", type=int, default=3, help="aha-moment samples to include (default 3)")
    p.set_defaults(func=cmd_report)
