"""`rlvr aha RUN`: find completions that reflect and correct themselves inside <think>."""

from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  rlvr aha runs/quickstart                     # top 5, and RUN/report/plots/aha_curve.png
  rlvr aha runs/quickstart --top 20 --phrase "hold on" --phrase "let me think again"
  rlvr aha runs/quickstart --no-default-phrases --phrase 等一下
"""


def cmd_aha(args) -> int:
    from pathlib import Path

    from rich.text import Text

    from rlvr.analysis import aha
    from rlvr.analysis.plots import save_aha_curve
    from rlvr.analysis.report import accuracy_rule, aha_hits
    from rlvr.analysis.run import load_run
    from rlvr.errors import UserError
    from rlvr.tracking.console import make_console

    if args.top < 0:
        raise UserError(f"--top {args.top}: must be >= 0")
    if args.no_default_phrases and not args.phrase:
        raise UserError("--no-default-phrases needs at least one --phrase")
    run = load_run(args.run)
    if run.samples_path is None:
        raise UserError(f"{run.path} has no samples.jsonl (the run had log.samples_every=0); nothing to scan")
    pattern = aha.compile_phrases([] if args.no_default_phrases else None, args.phrase or [])
    rows = run.samples()
    hits, curve, scanned = aha_hits(run, pattern=pattern, rows=rows)
    out = Path(args.output) if args.output else run.dir.report_dir / "plots"
    try:
        png = save_aha_curve([(run.name, curve)], out / "aha_curve.png")
    except OSError as e:
        raise UserError(f"cannot write {out / 'aha_curve.png'}: {e.strerror}") from None

    console = make_console(highlight=False)
    tty = console.is_terminal
    tiers = {t: sum(h.tier == t for h in hits) for t in (1, 2, 3)}
    console.print(
        f"{len(hits)} of {scanned} completions reflect: {tiers[1]} correct and changed course, "
        f"{tiers[2]} correct, {tiers[3]} other",
        markup=False,
    )
    for rank, hit in enumerate(hits[: args.top], start=1):
        console.print()
        console.print(f"#{rank}  {aha.describe(hit)}", style="bold" if tty else None, markup=False)
        console.print(f"question: {hit.row.get('question', '')}", markup=False)
        if tty:
            text = Text(str(hit.row.get("completion", "")))
            for s, e in hit.spans:
                text.stylize("bold black on yellow", s, e)
            console.print(text)
        else:  # piped: mark the phrases so they survive without colour
            console.print(hit.highlighted(), markup=False)
    if len(hits) < args.top:  # too few reflections to show: the samples that revised a result without one
        revisions = aha.find_revisions(rows, pattern=pattern, accuracy_rule=accuracy_rule(run))
        corrected = sum(r.corrected for r in revisions)
        console.print(
            f"\nwithout a reflection phrase, {len(revisions)} of {scanned} completions state more than one result "
            f"(= N) or one other than their answer; {corrected} end right after first stating another:",
            markup=False,
        )
        for rank, rev in enumerate(revisions[: args.top - len(hits)], start=1):
            console.print()
            console.print(f"r{rank}  {aha.describe_revision(rev)}", style="bold" if tty else None, markup=False)
            console.print(f"question: {rev.row.get('question', '')}", markup=False)
            console.print(str(rev.row.get("completion", "")), markup=False)
    if png:
        console.print(f"\naha curve: {png}", markup=False)
    sys.stdout.flush()
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "aha",
        help="find self-correcting ('aha moment') completions in a run's samples.jsonl",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", metavar="RUN", help="run directory")
    p.add_argument("--top", "-n", type=int, default=5, help="how many samples to print (default 5)")
    p.add_argument(
        "--phrase",
        action="append",
        metavar="TEXT",
        help="another reflection phrase, matched literally and case-insensitively (repeatable)",
    )
    p.add_argument(
        "--no-default-phrases",
        action="store_true",
        help="use only the --phrase phrases (defaults: wait, let me check, let me re-…, verify, "
        "I made a mistake, double-check, on second thought, 等等, 检查, 重新, 验证, …)",
    )
    p.add_argument("--output", "-o", default=None, help="folder for aha_curve.png (default: RUN/report/plots)")
    p.set_defaults(func=cmd_aha)
