"""What ``--model`` may name for eval/chat/generate/export, and the prompt settings it was trained with.

A model spec is a built-in name, an HF directory, a hub id (``org/name[@revision]``), a ``.gguf``
file (see :func:`rlvr.models.resolve_model_path`), a run directory (its ``checkpoints/last``), or a
checkpoint directory. For the last two, the run's ``config.yaml`` supplies the prompt
template, system prompt and assistant prefix, so a trained model is evaluated and chatted
with exactly as it was trained.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.errors import UserError
from rlvr.evaluation.evaluate import PromptStyle
from rlvr.models import BUILTIN_MODELS, hub, load_model, load_tokenizer, lora, resolve_device, resolve_model_path
from rlvr.models.precision import bf16_support, choose_dtype
from rlvr.run_dir import RunDir


@dataclass(frozen=True)
class ResolvedModel:
    spec: str
    """What the user typed."""
    path: Path
    """Local HF directory (or LoRA adapter directory) to load."""
    run_dir: Path | None = None
    """The run this checkpoint belongs to, if any."""
    run_config: dict = field(default_factory=dict)
    """The run's config.yaml as a plain dict ({} outside a run)."""

    @property
    def label(self) -> str:
        """Short name for tables: the spec as given, or run/step for checkpoints."""
        if self.run_dir is not None:
            return f"{self.run_dir.name}/{self.path.name}"
        return Path(self.spec).name or self.spec

    def prompt_defaults(self) -> dict:
        """template, system_prompt, assistant_prefix, max_new_tokens and stop strings of the run (if any)."""
        data = self.run_config.get("data") or {}
        out = {k: data[k] for k in ("template", "system_prompt", "assistant_prefix") if k in data}
        rollout = self.run_config.get("rollout") or {}
        out.update({k: rollout[k] for k in ("max_new_tokens", "stop") if k in rollout})
        return out


OUTPUT_ROOT = Path("runs")
"""Where eval, export and generate write without ``--output``: beside the training runs (``runs/``,
which git ignores, as ``rlvr compare`` writes ``runs/compare``), in a folder named after the command."""


def default_output(command: str, name: str, *, stamp: bool = False, suffix: str = "") -> Path:
    """``runs/COMMAND/NAME[-YYYYmmdd-HHMMSS][SUFFIX]``, ``NAME`` reduced to characters safe in a file name.

    Example: ``default_output("eval", "gsm8k_test", stamp=True)`` -> ``runs/eval/gsm8k_test-20250101-120000``.
    """
    name = slug(name) + (time.strftime("-%Y%m%d-%H%M%S") if stamp else "")
    return OUTPUT_ROOT / command / (name + suffix)


def slug(text: str) -> str:
    """``text`` with every run of characters other than letters, digits, ``._-`` made one ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def resolve(spec: str) -> ResolvedModel:
    """Resolve a model spec; raises UserError naming what was expected."""
    path = Path(spec).expanduser()
    if path.is_dir() and _is_model_dir(path):
        ckpt = path.resolve()
        run = RunDir.of_checkpoint(ckpt)
        if run is not None and run.config_file.is_file():
            return ResolvedModel(spec, ckpt, run.path, run.read_config() or {})
        return ResolvedModel(spec, ckpt)
    run = RunDir(path)
    if path.is_dir() and run.checkpoints_root.is_dir():
        ckpt = run.last_checkpoint(usable=_is_model_dir)  # a model directory is enough to evaluate
        if ckpt is None:
            raise UserError(f"--model {spec}: the run has no checkpoint yet")
        return ResolvedModel(spec, ckpt, path.resolve(), run.read_config() or {})
    if path.is_dir() and run.config_file.is_file():
        raise UserError(f"--model {spec}: the run has no checkpoint yet")
    if not path.exists() and spec not in BUILTIN_MODELS and hub.parse_hub_id(spec) is None:
        raise UserError(
            f"--model {spec}: not found; give a built-in name ({', '.join(BUILTIN_MODELS)}), a Hugging Face "
            "model directory or hub id (org/name), a .gguf file, a run directory or a checkpoint directory"
        )
    return ResolvedModel(spec, resolve_model_path(spec, label=f"--model {spec}"))


def load(resolved: ResolvedModel, *, dtype: str = "float32", device: str = "cpu"):
    """(model in eval mode, tokenizer); a LoRA adapter directory is merged into its base model (the
    one its adapter_config.json records, else the run's model.path)."""
    path = resolved.path
    if lora.is_adapter_dir(path):
        base = lora.adapter_base(path, fallback=(resolved.run_config.get("model") or {}).get("path"))
        model = lora.load_merged(path, base=base, dtype=dtype, device=device)
    else:
        model = load_model(path, dtype=dtype, device=device)
    try:
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as e:
        raise UserError(f"could not load the tokenizer of {path}: {str(e).splitlines()[0]}") from None
    return model.eval(), tokenizer


def generation_dtype(device: str, dtype: str = "auto") -> tuple[str, str]:
    """(dtype to load and generate in, the line that says why) for ``--dtype`` on ``--device``;
    ``auto`` is chosen from the hardware. Callers print the line once the model has loaded, so a
    bad input stays one line."""
    dev = resolve_device(device)
    chosen, warning = choose_dtype(dtype, dev)
    support = bf16_support(dev)
    line = f"generation dtype: {chosen} ({support.hardware or support.why})"
    return chosen, line + (f"\nwarning: --dtype {warning}" if warning else "")


TOOL_KEYS = ("max_tool_calls", "tool_call", "tool_result", "tool_timeout_s", "tool_max_chars")
"""The ``rollout.*`` tool settings a run's config lends to ``--tools`` (the syntax it was trained with)."""


def tool_settings(resolved: list[ResolvedModel], tools: list[str] | None, *, workers: int = 2):
    """The :class:`~rlvr.tools.Toolbox` for ``--tools`` (names; ``["none"]`` = no tools), or None.

    Without ``--tools``, the first run's ``rollout.tools`` (none outside a run): a model trained with
    tools is evaluated with them. The call syntax, call limit and limits are the run's, else the
    defaults. Unknown tools and broken plugins fail here, in one line, before any model loads."""
    from rlvr.config import RolloutConfig
    from rlvr.tools import Toolbox

    rollout = next(((r.run_config.get("rollout") or {}) for r in resolved if r.run_config), {})
    names = list(rollout.get("tools") or []) if tools is None else [n for n in tools if n != "none"]
    if not names:
        return None
    cfg = RolloutConfig(tools=names, **{k: rollout[k] for k in TOOL_KEYS if k in rollout})
    return Toolbox.from_config(cfg, workers)


def prompt_settings(
    resolved: list[ResolvedModel],
    *,
    default_template: str,
    template: str | None = None,
    system: str | None = None,
    prefix: str | None = None,
    max_new_tokens: int | None = None,
    stop: list[str] | None = None,
) -> tuple:
    """(PromptStyle, max_new_tokens, stop strings): what the user gave first, then the first run's
    config, then defaults. One setting for all models, so a before/after comparison asks both the
    same way."""
    run = next((r.prompt_defaults() for r in resolved if r.run_config), {})
    style = PromptStyle(
        template=template or run.get("template", default_template),
        system_prompt=system if system is not None else run.get("system_prompt"),
        assistant_prefix=prefix if prefix is not None else run.get("assistant_prefix"),
    )
    style.resolve()  # an unknown template fails now, before any model is loaded
    max_new = max_new_tokens if max_new_tokens is not None else run.get("max_new_tokens", 256)
    if max_new < 1:
        raise UserError(f"--max-new-tokens {max_new}: must be >= 1")
    stop = stop if stop is not None else run.get("stop", [])
    if not all(stop):
        raise UserError("--stop needs a non-empty string, e.g. --stop '</answer>'")
    return style, max_new, list(stop)
