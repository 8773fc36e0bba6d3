"""`rlvr train` and `rlvr config`."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from rlvr.commands.common import EXAMPLES, add_config_args, load_cli_config, quiet_libraries
from rlvr.config import config_markdown, field_docs, to_yaml


def cmd_train(args) -> int:
    # torch, transformers and rich load only when training starts: `rlvr --help` imports this module
    from rlvr.tracking.console import make_console

    if args.print_config:
        args.overrides = [*args.overrides, "log.print_config=true"]
    cfg = load_cli_config(args)
    cfg, note = own_run_dir(cfg, args)
    console = make_console(stderr=True)
    # the trainer checks everything that can fail before it prints the run's summary (the full
    # config goes to RUN/config.yaml, and to the screen with --print-config)
    quiet_libraries()  # before the trainer loads, so that nothing it loads logs unsilenced
    run_training(cfg, console=console, notes=(note,) if note else ())
    return 0


def _run_dir_chosen(args) -> bool:
    """Whether the user named the run directory: ``run_dir=``/``resume=`` on the command line, or a
    ``run_dir`` key in a config file of their own (a built-in preset's is a default)."""
    import yaml

    from rlvr.config import PRESETS_DIR, parse_override

    if any(parse_override(o)[0] in ("run_dir", "resume") for o in args.overrides):
        return True
    path = Path(args.config) if args.config else None
    if path is None or (not path.is_file() and (PRESETS_DIR / f"{args.config}.yaml").is_file()):
        return False
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return True  # load_cli_config read it already; leave what it says alone
    return isinstance(tree, dict) and "run_dir" in tree


def own_run_dir(cfg, args):
    """(``cfg`` with a run directory of its own, the line that says so or None) for a new run whose run
    directory the user did not name (:func:`_run_dir_chosen`): the preset's (``runs/quickstart``), or
    ``runs/<data file's stem>`` when ``data.path`` was given on the command line; with ``-2``, ``-3``, ...
    added where that folder exists already, so that a second run never stops on the first one's folder.
    ``overwrite=true`` keeps the preset's folder, as it says."""
    import dataclasses
    import re

    from rlvr.config import parse_override

    if cfg.resume or cfg.overwrite or _run_dir_chosen(args):
        return cfg, None
    base = Path(cfg.run_dir)
    data_given = any(parse_override(o)[0] == "data.path" for o in args.overrides)
    if data_given and cfg.data.path:
        stem = Path(str(cfg.data.path).split(":")[0].rstrip("/")).name.split(".")[0]
        base = base.parent / (re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("._") or base.name)
    run_dir, n = base, 1
    while run_dir.exists():
        n += 1
        run_dir = base.with_name(f"{base.name}-{n}")
    if str(run_dir) == cfg.run_dir:
        return cfg, None
    if n > 1:
        note = f"  run dir    {run_dir}, as {base} holds an earlier run (resume={base} continues that one)"
    else:
        note = f"  run dir    {run_dir}, named after data.path"
    return dataclasses.replace(cfg, run_dir=str(run_dir)), note + "; run_dir=DIR picks another"


def run_training(cfg, *, console=None, notes: tuple[str, ...] = ()):
    """Trains as configured, in this process or on Ray workers (``distributed.backend``); returns the
    run directory. The one place that picks, so ``training`` never imports ``distributed``."""
    from rlvr.choices import Backend

    if cfg.distributed.backend == Backend.RAY:
        from rlvr.distributed import train  # Ray is imported only when a run asks for it
    else:
        from rlvr.training import train
    return train(cfg, console=console, notes=notes)


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
