"""`rlvr generate`: batch inference over a JSONL file of prompts, K samples each."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlvr.errors import UserError

EXAMPLES = """examples:
  rlvr generate --model runs/quickstart --input prompts.jsonl --samples 4 --temperature 0.8
  rlvr generate --model runs/quickstart --input prompts.jsonl --temperature 0 --output runs/generate/greedy.jsonl
  rlvr generate --model runs/arithmetic_tool --input prompts.jsonl --tools calculator   # calls run, results fed back
  rlvr generate --model runs/code_simple --input code.jsonl --max-turns 3   # rows with "tests": failing tests fed back
  # prompts.jsonl: {"question": "What is 3 + 4?"} or {"prompt": "..."} per line; other keys are copied through
  # without --output the rows go to runs/generate/INPUT-TIME.jsonl
"""

PROMPT_KEYS = ("question", "prompt")


def read_prompts(path: str | Path) -> list[dict]:
    """Rows of a JSONL file, each with a non-empty "question" or "prompt" string (no answer needed)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--input {path}: file not found")
    from rlvr.data.files import read_jsonl_values

    rows = []
    for lineno, obj in read_jsonl_values(path):
        if not isinstance(obj, dict) or not any(isinstance(obj.get(k), str) and obj[k].strip() for k in PROMPT_KEYS):
            raise UserError(f'{path}:{lineno}: each row needs a non-empty "question" or "prompt" string')
        rows.append(obj)
    if not rows:
        raise UserError(f"--input {path} holds no prompts")
    return rows


def cmd_generate(args) -> int:
    from rlvr.commands.common import environment_settings, model_settings, quiet_libraries, tool_settings
    from rlvr.evaluation import loading as eval_models

    if args.samples < 1:
        raise UserError(f"--samples {args.samples}: must be >= 1")
    if args.temperature < 0:
        raise UserError(f"--temperature {args.temperature}: must be >= 0 (0 = greedy)")
    if args.temperature == 0 and args.samples > 1:
        raise UserError("--temperature 0 is greedy and gives one answer; use --samples 1 or a temperature > 0")
    if not 0 < args.top_p <= 1 or args.top_k < 0:
        raise UserError("--top-p must be in (0, 1] and --top-k >= 0")
    if args.batch < 1:
        raise UserError(f"--batch {args.batch}: must be >= 1")
    out = (
        Path(args.output)
        if args.output
        else eval_models.default_output("generate", Path(args.input).stem, stamp=True, suffix=".jsonl")
    )
    if out.is_dir():
        raise UserError(f"--output {out} is a folder; give a .jsonl file path")
    rows = read_prompts(args.input)
    resolved = eval_models.resolve(args.model)
    (style, max_new, stop), (dtype, dtype_line) = model_settings(args, [resolved], template="plain")
    tools = tool_settings(args, [resolved])
    environment, env_line = environment_settings(args, [resolved], tools)  # rows' "tests" for code feedback
    quiet_libraries()
    import torch

    from rlvr.data import render_prompt
    from rlvr.rollout import HFRolloutEngine

    torch.manual_seed(args.seed)
    model, tokenizer = eval_models.load(resolved, dtype=dtype, device=args.device)
    print(dtype_line, file=sys.stderr, flush=True)
    engine = HFRolloutEngine(
        model,
        tokenizer,
        max_new_tokens=max_new,
        temperature=args.temperature or 1.0,
        top_p=args.top_p,
        top_k=args.top_k,
        dtype=dtype,
        batch_seqs=args.batch * args.samples,
        stop=stop,
        tools=tools,
        environment=environment,
    )
    template = style.resolve()
    engine.turn_prefix = "" if args.raw else template.assistant_prefix
    if env_line:
        print(env_line, file=sys.stderr, flush=True)
    if tools is not None:
        print(tools.describe(), file=sys.stderr, flush=True)
        tools.warm()
    prefix = "" if args.raw else template.assistant_prefix  # what the assistant said includes the prefix
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for start in range(0, len(rows), args.batch):
            chunk = rows[start : start + args.batch]
            prompts = []
            for r in chunk:
                text = (
                    r.get("question") if isinstance(r.get("question"), str) and r["question"].strip() else r["prompt"]
                )
                prompts.append(text if args.raw else render_prompt(tokenizer, text, template=template))
            batch = engine.generate(prompts, args.samples, greedy=args.temperature == 0, rows=chunk)
            lengths, calls, turns = batch.response_lengths.tolist(), batch.tool_calls, batch.turns
            for i, r in enumerate(chunk):
                rows_i = range(i * args.samples, (i + 1) * args.samples)
                f.write(
                    json.dumps(
                        {
                            **r,
                            "completions": [prefix + batch.texts[j] for j in rows_i],
                            "lengths": [int(lengths[j]) for j in rows_i],
                            "truncated": [bool(batch.truncated[j]) for j in rows_i],
                            **({} if calls is None else {"tool_calls": [calls[j] for j in rows_i]}),
                            **({} if turns is None or calls is not None else {"turns": [turns[j] for j in rows_i]}),
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
            print(f"{min(start + args.batch, len(rows))}/{len(rows)} prompts", flush=True)
    tmp.replace(out)
    print(f"wrote {len(rows)} rows x {args.samples} completions to {out}")
    return 0


def register(sub) -> None:
    from rlvr.commands.common import add_model_args

    p = sub.add_parser(
        "generate",
        help="batch inference: K completions for every prompt of a JSONL file",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    p.add_argument("--input", "-i", required=True, help='JSONL file with a "question" or "prompt" per line')
    p.add_argument(
        "--output",
        "-o",
        default=None,
        help="JSONL file to write, the input rows + completions (default: runs/generate/INPUT-TIME.jsonl)",
    )
    p.add_argument("--samples", "-k", type=int, default=1, help="completions per prompt (default: %(default)s)")
    p.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy; default: %(default)s)"
    )
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off; default: %(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling (0 = off; default: %(default)s)")
    p.add_argument("--raw", action="store_true", help="feed the prompt text as is, without the chat template")
    p.add_argument("--batch", type=int, default=32, help="prompts generated together (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.set_defaults(func=cmd_generate)
