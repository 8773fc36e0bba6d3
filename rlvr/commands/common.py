"""Helpers shared by the CLI commands."""

from __future__ import annotations

import os
from pathlib import Path

from rlvr.config import build_config, load_tree, parse_override
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
    """The Config for ``--config`` + overrides.

    ``resume=RUN`` continues RUN in place: without ``--config`` it starts from the run's current
    config (``RUN/config.yaml``, or its last resumed segment's), its ``run_dir`` is RUN, and a
    ``run_dir=`` that names another directory is an error. Built-in reward names are checked
    before the rest of the config, so a misspelt rule is the error a user sees first."""
    config, overrides = args.config, list(args.overrides)
    given = {}  # key -> its last value on the command line
    for text in overrides:
        key, value = parse_override(text)
        given[key] = value
    if given.get("resume"):  # checked with --config too: train() would create the missing directory
        run = RunDir(str(given["resume"]))
        saved = run.current_config_file
        if not saved.is_file():
            raise UserError(f"resume={run.path}: {saved} not found; is this a run directory?")
        other = given.get("run_dir")
        if other is not None and Path(str(other)).resolve() != run.path.resolve():
            raise UserError(
                f"resume={run.path} continues that run in its own directory, so run_dir={other} would be "
                f"ignored; drop run_dir=, or start a new run in {other} with --config {saved} run_dir={other}"
            )
        if config is None:
            config = saved
        overrides.append(f"run_dir={run.path}")
    tree = load_tree(config, overrides)
    check_reward_names(tree)
    return build_config(tree)


def check_reward_names(tree: dict) -> None:
    """Raises the registry's one-line error (with close matches) for an unknown built-in rule name in
    ``reward.rules`` or ``reward.accuracy_rule``; plugins (``module:function``) load when training starts."""
    from rlvr.rewards.registry import get  # the registry imports no torch or math-verify

    reward = tree.get("reward")
    if not isinstance(reward, dict):
        return
    rules = reward.get("rules")
    names = [*(rules if isinstance(rules, list) else []), reward.get("accuracy_rule")]
    for name in names:
        if isinstance(name, str) and name and ":" not in name:
            get(name)


BUILTIN_DEFAULT = "smollm2-135m-instruct"
"""The model ``rlvr chat`` talks to without ``--model``."""


def add_model_args(p, *, many: bool = False, optional: bool = False) -> None:
    """--model and the prompt/generation flags shared by eval, chat and generate; ``optional``: --model
    may be left out (``rlvr chat`` then offers the built-in model, :data:`BUILTIN_DEFAULT`)."""
    if many:
        p.add_argument(
            "--model",
            "-m",
            action="append",
            required=True,
            metavar="M",
            help="built-in name, HF directory, hub id (org/name[@rev]), .gguf file, run directory or checkpoint "
            "(repeat to compare)",
        )
    else:
        p.add_argument(
            "--model",
            "-m",
            required=not optional,
            default=None,
            metavar="M",
            help="built-in name, HF directory, hub id (org/name[@rev]), .gguf file, run directory or checkpoint"
            + (f" (default: the built-in {BUILTIN_DEFAULT})" if optional else ""),
        )
    p.add_argument(
        "--template",
        default=None,
        help=(
            "prompt template: r1, r1_base, r1_tool, r1_code, cot, plain or a template file "
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
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: %(default)s)")
    p.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="dtype to generate in (default: %(default)s: bfloat16 where the device runs it natively, else float32)",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop string: a response ends after it (repeat for several; default: the run's rollout.stop, else none)",
    )
    p.add_argument(
        "--tools",
        default=None,
        metavar="NAMES",
        help="tools the model may call, comma-separated: calculator, python, or plugins module:function / "
        "file.py:function; 'none' for none (default: the run's rollout.tools, else none; docs/tools.md)",
    )
    p.add_argument(
        "--max-turns",
        type=int,
        default=None,
        metavar="N",
        help="code with execution feedback: after a failing attempt the first failing test comes back and the "
        "model tries again, up to N turns (rows with tests; default: the run's rollout.max_turns, else 1)",
    )
    p.add_argument(
        "--environment",
        default=None,
        metavar="NAME",
        help="the environment each answer is an episode of: code_feedback, or a plugin module:Class / "
        "file.py:Class (default: the run's rollout.environment; docs/code-and-environments.md)",
    )


def tool_settings(args, resolved: list):
    """The Toolbox of ``--tools`` (or the run's ``rollout.tools``), None for none; see
    :func:`rlvr.evaluation.loading.tool_settings`."""
    from rlvr.evaluation.loading import tool_settings as settings

    names = None if args.tools is None else [n.strip() for n in args.tools.split(",") if n.strip()]
    if names is not None and not names:
        raise UserError("--tools needs a name, e.g. --tools calculator (or --tools none)")
    return settings(resolved, names)


def environment_settings(args, resolved: list, tools):
    """(what makes each answer's environment, or None; a line saying which, or None) for ``--tools``,
    ``--max-turns`` and ``--environment``, else the run's ``rollout.*``: the episodes training ran.
    Code feedback checks the sandbox here (one line naming the package where bubblewrap is missing)."""
    import os

    from rlvr.environments import from_settings

    run = next(((r.run_config or {}) for r in resolved if getattr(r, "run_config", None)), {})
    rollout, reward = run.get("rollout") or {}, run.get("reward") or {}
    max_turns = args.max_turns if args.max_turns is not None else int(rollout.get("max_turns", 1))
    name = args.environment if args.environment is not None else rollout.get("environment", "") or ""
    if max_turns < 1:
        raise UserError(f"--max-turns {max_turns}: must be >= 1 (1 = single-turn)")
    if tools is not None and (max_turns > 1 and not name or name not in ("", "tools")):
        raise UserError(
            f"--max-turns {max_turns} / --environment {name or 'code_feedback'} and --tools {','.join(tools.names)}: "
            "one rollout runs one environment; pass --tools none, or --max-turns 1"
        )
    make = from_settings(name, toolbox=tools, max_turns=max_turns)
    if make is None or tools is not None:
        return make, None
    from rlvr.environments import CodeFeedback

    if isinstance(make(), CodeFeedback):
        from rlvr.rewards.code import SANDBOX_ENV
        from rlvr.sandbox import check_isolation

        isolation = reward.get("sandbox", "bwrap")
        line = check_isolation(isolation)
        os.environ[SANDBOX_ENV] = isolation
        return make, f"code episodes with execution feedback, up to {make().max_turns} turns; {line}"
    return make, f"environment {name}"


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
