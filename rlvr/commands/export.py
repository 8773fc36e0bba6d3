"""`rlvr export`: a checkpoint as a clean Hugging Face directory (+ model card), LoRA merged.

The exported tokenizer's chat template renders the run's prompt (template, system prompt,
assistant prefix), so plain transformers prompts the model as training did.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlvr import metric_names as M
from rlvr.errors import UserError
from rlvr.run_dir import RunDir

if TYPE_CHECKING:  # `rlvr --help` imports every command module: rlvr.data waits for the command
    from rlvr.data.templates import PromptTemplate

EXAMPLES = """examples:
  rlvr export runs/quickstart                          # the run's last checkpoint -> runs/export/quickstart
  rlvr export runs/quickstart/checkpoints/step_000020 --dtype bfloat16   # -> runs/export/quickstart-step_000020
  rlvr export runs/quickstart --output ~/models/smollm2-arith
"""


EXAMPLE_QUESTION = "What is 2 + 3?"


@dataclass(frozen=True)
class TrainingPrompt:
    """How the run prompted the model, as the exported chat template renders it."""

    template: PromptTemplate
    example: str
    """The full prompt text of :data:`EXAMPLE_QUESTION`."""
    max_new_tokens: int
    stop: list[str]


def _fenced(text: str, lang: str = "") -> list[str]:
    """``text`` in a Markdown code fence longer than any run of backticks inside it."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return [fence + lang, *text.split("\n"), fence]


def prompt_section(prompt: TrainingPrompt | None) -> list[str]:
    """The model card's "Prompt format": the exact prompt, rendered, and how to get it with transformers."""
    lines = ["## Prompt format", ""]
    if prompt is None:
        return lines + ["Not from an rlvr run: the tokenizer's own chat template is kept as it was.", ""]
    t = prompt.template
    system = f'"{t.system}"' if t.system else "none of its own (the chat template's default, if any)"
    prefix = f"`{t.assistant_prefix}`" if t.assistant_prefix else "none"
    lines += [
        f"Trained with rlvr's prompt template `{t.name}`: system prompt {system}, assistant prefix {prefix}.",
        "This tokenizer's chat template renders exactly that prompt: give the bare question as the user message, "
        "and `tokenizer.apply_chat_template(messages, add_generation_prompt=True)` returns the tokens the model "
        "was trained on (the system turn is added unless the messages open with one; the assistant prefix ends "
        "the prompt, so the generated text continues it).",
        "",
        f"The prompt for `{EXAMPLE_QUESTION}`:",
        "",
        *_fenced(prompt.example, "text"),
        "",
    ]
    stop = f", stop_strings={prompt.stop!r}, tokenizer=tokenizer" if prompt.stop else ""
    lines += [
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        "model = AutoModelForCausalLM.from_pretrained(PATH)",
        "tokenizer = AutoTokenizer.from_pretrained(PATH)",
        f'messages = [{{"role": "user", "content": "{EXAMPLE_QUESTION}"}}]',
        'inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", '
        "return_dict=True)",
        f"out = model.generate(**inputs, max_new_tokens={prompt.max_new_tokens}{stop})",
        'print(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))',
        "```",
        "",
    ]
    if prompt.stop:
        stops = ", ".join(f"`{s}`" for s in prompt.stop)
        lines += [
            f"Training cut each response right after the first of {stops}. `generate` stops on the token that "
            "completes it, which may carry more text (a BPE token such as `><` can complete `</answer>`): cut "
            "the decoded text after the stop string, as rlvr does.",
            "",
        ]
    return lines


def model_card(resolved, dtype: str, prompt: TrainingPrompt | None = None) -> str:
    """README.md: what the model is, how to prompt it, how it was trained (the run's config) and its eval numbers."""
    import yaml

    cfg = resolved.run_config
    base = (cfg.get("model") or {}).get("path")
    lines = ["---", "library_name: transformers", "tags: [rlvr, grpo, reinforcement-learning]", "---", ""]
    lines += [f"# {resolved.run_dir.name if resolved.run_dir else Path(resolved.spec).name}", ""]
    lines += [f"Exported by `rlvr export` from `{resolved.path}` ({dtype} weights)."]
    if base:
        lines += [f"Trained with GRPO-family RL with verifiable rewards (rlvr), starting from `{base}`."]
    lines += [""] + prompt_section(prompt)
    history = RunDir(resolved.run_dir).read_eval_history() if resolved.run_dir is not None else []
    if history:
        keys = [k for k in history[-1] if k.startswith(M.EVAL) and k != M.EVAL_TIME_S]
        lines += [
            "## Evaluation during training",
            "",
            "| step | " + " | ".join(k.removeprefix(M.EVAL) for k in keys) + " |",
            "| --- |" + " --- |" * len(keys),
        ]
        for row in history:
            lines.append(f"| {row['step']} | " + " | ".join(f"{row.get(k, float('nan')):.3f}" for k in keys) + " |")
        lines.append("")
    if cfg:
        lines += ["## Training config", "", "```yaml", yaml.safe_dump(cfg, sort_keys=False).rstrip(), "```", ""]
    return "\n".join(lines)


def training_prompt(resolved, tokenizer) -> TrainingPrompt | None:
    """Give ``tokenizer`` a chat template that renders the run's prompt (see
    :func:`rlvr.data.templates.chat_template`); None outside a run, where the tokenizer is kept as is.

    Raises:
        UserError: the new template does not give rlvr's own prompt (a chat template it cannot wrap).
    """
    from rlvr.data.templates import chat_template, render
    from rlvr.evaluation import loading as eval_models

    if not resolved.run_config:
        return None
    style, max_new, stop = eval_models.prompt_settings([resolved], default_template="r1")
    template = style.resolve()
    example = render(tokenizer, template, EXAMPLE_QUESTION)
    tokenizer.chat_template = chat_template(template, tokenizer.chat_template or None)
    messages = [{"role": "user", "content": EXAMPLE_QUESTION}]
    exported = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if exported != example:
        raise UserError(
            f"the exported chat template renders {EXAMPLE_QUESTION!r} as {exported!r}, not as training did "
            f"({example!r}); the tokenizer's own chat template could not be wrapped"
        )
    return TrainingPrompt(template, example, max_new, stop)


def default_output(resolved) -> Path:
    """``runs/export/RUN`` for a run's last checkpoint, ``runs/export/RUN-STEP`` for another of its
    checkpoints, else ``runs/export/NAME`` after the model given."""
    from rlvr.evaluation import loading as eval_models

    spec = Path(resolved.spec)
    if resolved.run_dir is None:
        name = spec.stem if spec.suffix == ".gguf" else spec.name
    elif spec.resolve() == resolved.run_dir:
        name = resolved.run_dir.name
    else:
        name = f"{resolved.run_dir.name}-{resolved.path.name}"
    return eval_models.default_output("export", name or resolved.spec)


def cmd_export(args) -> int:
    from rlvr.commands.common import quiet_libraries
    from rlvr.evaluation import loading as eval_models
    from rlvr.models.loading import DTYPES

    resolved = eval_models.resolve(args.checkpoint)
    out = Path(args.output) if args.output else default_output(resolved)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--output {out} exists and is not empty; give a new folder")
    quiet_libraries()
    from rlvr.rollout.hf import eos_token_ids

    model, tokenizer = eval_models.load(resolved, dtype="float32", device="cpu")
    model = model.to(DTYPES[args.dtype])
    gen = model.generation_config
    eos = eos_token_ids(model, tokenizer)
    gen.eos_token_id = eos[0] if len(eos) == 1 else eos
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "left"  # batched generation pads on the left
    prompt = training_prompt(resolved, tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(resolved, args.dtype, prompt), encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(
        f"exported {resolved.path} -> {out} ({args.dtype}, {sum(p.numel() for p in model.parameters()):,} parameters)"
    )
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="export a checkpoint as a clean Hugging Face directory (LoRA merged)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "checkpoint",
        help="run directory (its last checkpoint), checkpoint directory, HF dir, hub id (org/name), .gguf or "
        "built-in name",
    )
    p.add_argument(
        "--output",
        "-o",
        default=None,
        help="new folder to write (default: runs/export/RUN, or runs/export/RUN-STEP for another checkpoint "
        "than the last, or runs/export/NAME for a model outside a run)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="weight dtype (default: %(default)s)",
    )
    p.set_defaults(func=cmd_export)
