"""``rlvr`` command line: argv -> Config -> the function that does the work. No logic here."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rlvr.errors import UserError

EXAMPLES = """examples:
  rlvr train                                   # the CPU quickstart (configs/quickstart.yaml)
  rlvr train --config configs/quickstart.yaml train.steps=10 rollout.samples_per_prompt=4
  rlvr train resume=runs/quickstart train.steps=120   # continue a run, optionally for longer
  rlvr config --docs                           # every config key with its default and meaning
"""


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass


def _load(args):
    from rlvr.config import load_config, parse_override

    config = args.config
    resumes = [parse_override(o)[1] for o in args.overrides if o.split("=", 1)[0].strip() == "resume"]
    if resumes and resumes[-1]:  # checked with --config too: train() would create the missing directory
        saved = Path(str(resumes[-1])) / "config.yaml"
        if not saved.is_file():
            raise UserError(f"resume={resumes[-1]}: {saved} not found; is this a run directory?")
        if config is None:
            config = saved
    return load_config(config, args.overrides)


def cmd_train(args) -> int:
    from rich.console import Console

    from rlvr.config import to_yaml

    cfg = _load(args)
    console = Console(stderr=True)
    # plain print to stdout: stderr carries progress and the one-line error, and config values
    # may hold '[...]' that rich would parse as markup
    print("resolved config\n" + to_yaml(cfg), flush=True)
    _quiet_libraries()
    from rlvr.training import train

    train(cfg, console=console)
    return 0


def cmd_config(args) -> int:
    from rlvr.config import config_markdown, field_docs, to_yaml

    if args.docs and args.markdown:
        print(config_markdown(), end="")
        return 0
    if args.docs:
        for key, default, doc in field_docs():
            print(f"{key} = {default!r}\n    {doc}")
        return 0
    print(to_yaml(_load(args)), end="")
    return 0


def cmd_rewards(args) -> int:
    from rlvr.rewards import REWARDS

    for name, fn in REWARDS.items():
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        print(f"{name:18s} {doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlvr",
        description="RL with verifiable rewards (GRPO and relatives) for small LLMs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def with_config(p):
        p.add_argument("--config", "-c", help="YAML preset file or built-in preset name (default: quickstart)")
        p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")

    p = sub.add_parser("train", help="run GRPO training", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    with_config(p)
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("config", help="print the resolved config, or every key with --docs")
    with_config(p)
    p.add_argument("--docs", action="store_true", help="list every key, its default and its meaning")
    p.add_argument("--markdown", action="store_true", help="with --docs: as the Markdown table of docs/config.md")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("rewards", help="list the built-in reward rules")
    p.set_defaults(func=cmd_rewards)
    return parser


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
