"""`rlvr export`: a checkpoint as a clean Hugging Face directory (+ model card), LoRA merged."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from rlvr import metric_names as M
from rlvr.errors import UserError
from rlvr.run_dir import RunDir

EXAMPLES = """examples:
  rlvr export runs/quickstart --output exported/smollm2-arith                 # the run's last checkpoint
  rlvr export runs/quickstart/checkpoints/step_000020 --output out --dtype bfloat16
"""


def model_card(resolved, dtype: str) -> str:
    """README.md: what the model is, how it was trained (the run's config) and its eval numbers."""
    import yaml

    cfg = resolved.run_config
    base = (cfg.get("model") or {}).get("path")
    lines = ["---", "library_name: transformers", "tags: [rlvr, grpo, reinforcement-learning]", "---", ""]
    lines += [f"# {resolved.run_dir.name if resolved.run_dir else Path(resolved.spec).name}", ""]
    lines += [f"Exported by `rlvr export` from `{resolved.path}` ({dtype} weights)."]
    if base:
        lines += [f"Trained with GRPO-family RL with verifiable rewards (rlvr), starting from `{base}`."]
    lines += [
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "model = AutoModelForCausalLM.from_pretrained(PATH)",
        "tokenizer = AutoTokenizer.from_pretrained(PATH)",
        "```",
        "",
    ]
    data = cfg.get("data") or {}
    if data:
        lines += [
            "## Prompt format",
            "",
            f"template `{data.get('template')}`, system prompt `{data.get('system_prompt')}`, "
            f"assistant prefix `{data.get('assistant_prefix')}` (see rlvr.data.templates).",
            "",
        ]
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


def cmd_export(args) -> int:
    from rlvr.commands.common import quiet_libraries
    from rlvr.evaluation import loading as eval_models
    from rlvr.models.loading import DTYPES

    out = Path(args.output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--output {out} exists and is not empty; give a new folder")
    resolved = eval_models.resolve(args.checkpoint)
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
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(model_card(resolved, args.dtype), encoding="utf-8")
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
        "checkpoint", help="run directory (its last checkpoint), checkpoint directory, HF dir, .gguf or built-in name"
    )
    p.add_argument("--output", "-o", required=True, help="new folder to write")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32", help="weight dtype")
    p.set_defaults(func=cmd_export)
