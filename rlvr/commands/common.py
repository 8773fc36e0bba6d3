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


def add_model_args(p, *, many: bool = False) -> None:
    """--model and the prompt/generation flags shared by eval, chat and generate."""
    if many:
        p.add_argument(
            "--model",
            "-m",
            action="append",
            required=True,
            metavar="M",
            help="built-in name, HF directory, .gguf file, run directory or checkpoint (repeat to compare)",
        )
    else:
        p.add_argument(
            "--model",
            "-m",
            required=True,
            metavar="M",
            help="built-in name, HF directory, .gguf file, run directory or checkpoint",
        )
    p.add_argument(
        "--template",
        default=None,
        help=(
            "prompt template: r1, r1_base, cot, plain or a template file "
            "(default: the run's, else r1; plain for generate)"
        ),
    )
    p.add_argument(
        "--system", default=None, help="system prompt ('' for none; default: the run's, else the template's)"
    )
    p.add_argument(
        "--prefix",
        default=None,
        help="text that opens the assistant turn, e.g. '<think>' (default: the run's, else the template's)",
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=None, help="response length limit (default: the run's, else 256)"
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="dtype to generate in (auto: bfloat16 only where the device runs it natively, else float32)",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop string: a response ends after it (repeat for several; default: the run's rollout.stop, else none)",
    )


def model_settings(args, resolved: list, *, template: str) -> tuple:
    """The flags of :func:`add_model_args` -> ((PromptStyle, max_new_tokens, stop), (dtype, why line))."""
    from rlvr.evaluation.loading import generation_dtype, prompt_settings

    prompt = prompt_settings(
        resolved,
        default_template=template,
        template=args.template,
        system=args.system,
        prefix=args.prefix,
        max_new_tokens=args.max_new_tokens,
        stop=args.stop,
    )
    return prompt, generation_dtype(args.device, args.dtype)
