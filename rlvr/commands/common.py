"""Helpers shared by the CLI commands."""

from __future__ import annotations

import os

from rlvr.config import load_config, parse_override
from rlvr.errors import UserError
from rlvr.run_dir import RunDir

# The epilog of `rlvr --help` and `rlvr train --help`.
EXAMPLES = """examples:
  rlvr train                                   # the CPU quickstart (configs/quickstart.yaml)
  rlvr train --config configs/quickstart.yaml train.steps=10 rollout.samples_per_prompt=4
  rlvr train resume=runs/quickstart train.steps=120   # continue a run, optionally for longer
  rlvr config --docs                           # every config key with its default and meaning
"""


def quiet_libraries() -> None:
    """Silence transformers/hub warnings and progress bars; rlvr prints its own progress."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers  # here: seconds to import, and `rlvr --help` loads every command module

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass


def add_config_args(p) -> None:
    """``--config FILE`` plus ``key.sub=value`` overrides."""
    p.add_argument("--config", "-c", help="YAML preset file or built-in preset name (default: quickstart)")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")


def load_cli_config(args):
    """The Config for ``--config`` + overrides; ``resume=RUN`` without --config starts from RUN/config.yaml."""
    config = args.config
    resumes = [parse_override(o)[1] for o in args.overrides if o.split("=", 1)[0].strip() == "resume"]
    if resumes and resumes[-1]:  # checked with --config too: train() would create the missing directory
        saved = RunDir(str(resumes[-1])).config_file
        if not saved.is_file():
            raise UserError(f"resume={resumes[-1]}: {saved} not found; is this a run directory?")
        if config is None:
            config = saved
    return load_config(config, args.overrides)
