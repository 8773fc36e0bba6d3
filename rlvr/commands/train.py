"""`rlvr train` and `rlvr config`."""

from __future__ import annotations

import argparse

from rlvr.commands.common import EXAMPLES, add_config_args, load_cli_config, quiet_libraries
from rlvr.config import config_markdown, field_docs, to_yaml


def cmd_train(args) -> int:
    # torch, transformers and rich load only when training starts: `rlvr --help` imports this module
    from rich.console import Console

    from rlvr.config import Backend
    from rlvr.models import resolve_device
    from rlvr.models.precision import resolve_precision

    cfg = load_cli_config(args)
    console = Console(stderr=True)
    if cfg.distributed.backend == Backend.RAY:  # each worker resolves it for the device Ray gives it
        precision_lines = ["precision: resolved by each Ray worker for its own device (its first lines below)"]
    else:
        cfg, precision_lines = resolve_precision(cfg, resolve_device(cfg.model.device))
    for line in precision_lines:  # first: it decides the run's speed (and is saved in config.yaml)
        print(line, flush=True)
    # plain print to stdout: stderr carries progress and the one-line error, and config values
    # may hold '[...]' that rich would parse as markup
    print("resolved config\n" + to_yaml(cfg), flush=True)
    quiet_libraries()  # before the trainer loads, so that nothing it loads logs unsilenced
    run_training(cfg, console=console)
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
        "train", help="run GRPO training", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_args(p)
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("config", help="print the resolved config, or every key with --docs")
    add_config_args(p)
    p.add_argument("--docs", action="store_true", help="list every key, its default and its meaning")
    p.add_argument("--markdown", action="store_true", help="with --docs: as the Markdown table of docs/config.md")
    p.set_defaults(func=cmd_config)
