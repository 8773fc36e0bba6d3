"""``rlvr`` command line: argv -> Config -> the function that does the work. No logic here."""

from __future__ import annotations

import argparse
import difflib
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


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands by name; {} when it has none."""
    for action in parser._actions:  # argparse has no public way to reach its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def unknown_command(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """One line naming the nearest command when a command word of ``argv`` is not one, else None.

    Argparse would print its usage and every choice; this names the closest (difflib), as
    config keys do: ``rlvr trian`` -> 'train', ``rlvr data previw`` -> 'data preview', and a
    subcommand after a command that takes none: ``rlvr rewards list`` -> 'reward list'.
    """
    said: list[str] = []
    siblings: dict[str, argparse.ArgumentParser] = {}
    for word in argv:
        if word.startswith("-"):
            return None
        choices = _subcommands(parser)
        if not choices:  # a leaf; a word after one that takes no positionals may name a sibling's subcommand
            if any(not a.option_strings for a in parser._actions):
                return None
            near = difflib.get_close_matches(said[-1], [n for n, p in siblings.items() if word in _subcommands(p)], 1)
            if not near:
                return None
            return (
                f"unknown command '{' '.join([*said, word])}'; did you mean '{' '.join([*said[:-1], near[0], word])}'?"
            )
        if word not in choices:
            near = difflib.get_close_matches(word, choices, 1)
            hint = f"did you mean '{' '.join([*said, near[0]])}'?" if near else f"use one of {', '.join(choices)}"
            return f"unknown command '{' '.join([*said, word])}'; {hint}"
        said.append(word)
        siblings, parser = choices, choices[word]
    return None


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed, with ``key.sub=value`` overrides accepted before and after the options in any mix
    (``rlvr train a=1 --config grpo b=2``, as Hydra and TRL users type them), in the order given.

    argparse fills a ``nargs="*"`` positional once, so the overrides after an option come back as
    unrecognised; they join the command's overrides here (``parse_intermixed_args`` does not support
    subcommands). Anything else unrecognised is a usage error from the subcommand's own parser, whose
    usage it prints."""
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in a and not a.startswith("-") for a in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        leaf = parser
        for word in argv:  # the deepest subcommand named: its usage, not the top level's
            choices = _subcommands(leaf)
            if word.startswith("-") or word not in choices:
                break
            leaf = choices[word]
        leaf.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a process of its own (not a call from Python): huge pages for malloc first
        cpu.reexec_with_runtime_env()
    parser = build_parser()
    if message := unknown_command(parser, sys.argv[1:] if argv is None else argv):
        print(f"error: {message}", file=sys.stderr)
        return 2
    args = parse(parser, sys.argv[1:] if argv is None else argv)
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
