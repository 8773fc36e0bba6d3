"""``rlvr`` command line: argv -> Config -> the function that does the work. No logic here."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rlvr import cpu
from rlvr.commands.common import EXAMPLES
from rlvr.errors import UserError

# Modules under rlvr/commands/, each with `register(subparsers)`; one line per command family.
COMMANDS = [
    "train",
    "estimate",
    "reward",
    "eval",
    "chat",
    "generate",
    "export",
    "data",
    "report",
    "aha",
    "sweep",
    "compare",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlvr",
        description="RL with verifiable rewards (GRPO and relatives) for small LLMs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:  # each module adds its subcommand(s); imports stay light until run
        importlib.import_module(f"rlvr.commands.{module}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a process of its own (not a call from Python): huge pages for malloc first
        cpu.reexec_with_huge_pages()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rlvr ... | head`: the reader left; Python's exit flush must not fail too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
