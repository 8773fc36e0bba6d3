"""`rlvr train` and `rlvr config`."""

from __future__ import annotations

import argparse
import textwrap

from rlvr.commands.common import EXAMPLES, add_config_args, load_cli_config, quiet_libraries
from rlvr.config import config_markdown, field_docs, to_yaml


def cmd_train(args) -> int:
    # torch, transformers and rich load only when training starts: `rlvr --help` imports this module
    from rlvr.tracking.console import make_console

    if args.print_config:
        args.overrides = [*args.overrides, "log.print_config=true"]
    cfg = load_cli_config(args)
    # the trainer checks everything that can fail before it prints the run's summary (the full
    # config goes to RUN/config.yaml, and to the screen with --print-config)
    quiet_libraries()  # before the trainer loads, so that nothing it loads logs unsilenced
    run_training(cfg, console=make_console(stderr=True))
    return 0


def run_training(cfg, *, console=None):
    """Trains as configured, in this process or on Ray workers (``distributed.backend``); returns the
    run directory. The one place that picks, so ``training`` never imports ``distributed``."""
    from rlvr.config import Backend

    if cfg.distributed.backend == Backend.RAY:
        from rlvr.distributed import train  # Ray is imported only when a run asks for it
    else:
        from rlvr.training import train
    return train(cfg, console=console)


def _train_help() -> str:
    from rlvr.config import PRESETS_DIR

    names = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")))
    presets = textwrap.fill(names, width=96, subsequent_indent="  ")
    return f"""Run GRPO-family training as configured: a preset (--config) plus key.sub=value overrides.

presets (--config NAME, or a YAML file with defaults: [NAME]):
  {presets}

run keys (overrides like any other; `rlvr config --docs` lists every key):
  run_dir=DIR      where the run writes (default: the preset's, runs/quickstart)
  resume=RUN       continue RUN in place from its last checkpoint, optionally with train.steps=N
  overwrite=true   start a new run in run_dir, deleting the run that is there
  seed=N           seed of sampling, data order and model init noise (default 0)"""


TRAIN_HELP = _train_help()


def cmd_config(args) -> int:
    if args.docs and args.markdown:
        print(config_markdown(), end="")
        return 0
    if args.docs:
        for key, default, doc in field_docs():
            print(f"{key} = {default!r}\n    {doc}")
        return 0
    print(to_yaml(load_cli_config(args)), end="")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "train",
        help="run GRPO training",
        description=TRAIN_HELP,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p)
    p.add_argument(
        "--print-config", action="store_true", help="also print the full resolved config (always in RUN/config.yaml)"
    )
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("config", help="print the resolved config, or every key with --docs")
    add_config_args(p)
    p.add_argument("--docs", action="store_true", help="list every key, its default and its meaning")
    p.add_argument("--markdown", action="store_true", help="with --docs: as the Markdown table of docs/config.md")
    p.set_defaults(func=cmd_config)
