"""`rlvr eval`: accuracy / pass@k / maj@k of one or more models on a test set, side by side."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlvr.errors import UserError

EXAMPLES = """examples:
  rlvr eval --model smollm2-135m-instruct --model runs/quickstart --data arithmetic --limit 200
  rlvr eval --model runs/quickstart/checkpoints/step_000020 --data gsm8k_test.jsonl --preset gsm8k --samples 8
  rlvr eval --model smollm2-135m-instruct --data arithmetic_tool --tools calculator --limit 50
results: summary.json and predictions.jsonl in runs/eval/DATA-TIME/ (one folder per model when comparing)
"""


def _progress(console, label: str):
    """(context manager, on_batch callback) showing a bar with the running accuracy on a terminal."""
    import contextlib

    if not console.is_terminal:
        return contextlib.nullcontext(), None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    task = progress.add_task("", total=None)

    def on_batch(done: int, total: int, acc: float) -> None:
        progress.update(task, completed=done, total=total, description=f"acc {acc:.3f}")

    return progress, on_batch


def comparison_table(labels: list[str], summaries: list[dict]):
    """A rich Table: one row per metric, one column per model."""
    from rich.table import Table

    from rlvr.evaluation.evaluate import metric_keys

    table = Table(show_header=True, header_style="bold")
    table.add_column("metric")
    for label in labels:
        table.add_column(label, justify="right")
    keys = []
    for s in summaries:
        keys += [k for k in ["n", *metric_keys(s), "time_s"] if k not in keys]
    for k in keys:
        cells = []
        for s in summaries:
            v = s.get(k)
            cells.append(
                "-"
                if v is None
                else f"{v:d}"
                if isinstance(v, int)
                else f"{v:.1f}"
                if k in ("response_len_mean", "time_s", "tool_calls_mean", "turns_mean")
                else f"{v:.3f}"
            )
        table.add_row(k, *cells)
    return table


def cmd_eval(args) -> int:
    from rlvr.commands.common import environment_settings, model_settings, quiet_libraries, tool_settings
    from rlvr.data.files import pin
    from rlvr.evaluation import evaluate, load_eval_rows, write_result
    from rlvr.evaluation import loading as eval_models
    from rlvr.tracking.console import make_console

    if args.samples < 1:
        raise UserError(f"--samples {args.samples}: must be >= 1 (1 = greedy accuracy only)")
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit {args.limit}: must be >= 1")
    if args.temperature <= 0:
        raise UserError(f"--temperature {args.temperature}: must be > 0 (greedy accuracy is always reported)")
    if args.batch < 1:
        raise UserError(f"--batch {args.batch}: must be >= 1")
    resolved = [eval_models.resolve(m) for m in args.model]  # every model checked before any work
    data = pin(args.data, key="--data")  # a Hub data set at the commit it resolves to: summary.json names it
    rows = load_eval_rows(data, preset=args.preset, limit=args.limit, difficulty=args.difficulty)
    (style, max_new, stop), (dtype, dtype_line) = model_settings(args, resolved, template="r1")
    tools = tool_settings(args, resolved)  # the same loop as training: calls paused, results appended
    environment, env_line = environment_settings(args, resolved, tools)  # and training's episodes
    out = Path(args.output) if args.output else eval_models.default_output("eval", Path(args.data).stem, stamp=True)
    quiet_libraries()
    from rlvr.rollout import HFRolloutEngine

    console, err = make_console(), make_console(stderr=True)
    labels, summaries = [], []
    for r in resolved:
        model, tokenizer = eval_models.load(r, dtype=dtype, device=args.device)
        if not labels:
            err.print(dtype_line, highlight=False, markup=False)
        engine = HFRolloutEngine(
            model, tokenizer, max_new_tokens=max_new, dtype=dtype, batch_seqs=args.batch * args.samples, stop=stop,
            tools=tools, environment=environment,
        )  # fmt: skip
        engine.turn_prefix = style.resolve().assistant_prefix  # it opens every turn, as it opens the first
        if env_line and not labels:
            err.print(env_line, highlight=False, markup=False)
        if tools is not None and not labels:
            err.print(tools.describe(), highlight=False, markup=False)
            tools.warm()
        progress, on_batch = _progress(err, r.label)
        with progress:
            result = evaluate(
                engine,
                tokenizer,
                rows,
                style=style,
                samples=args.samples,
                temperature=args.temperature,
                max_new_tokens=max_new,
                batch_prompts=args.batch,
                on_batch=on_batch,
            )
        sub = eval_models.slug(r.label) + ("" if r.label not in labels else f"-{len(labels) + 1}")  # two runs' 'last'
        where = out / sub if len(resolved) > 1 else out
        write_result(
            result,
            where,
            model=r.spec,
            checkpoint=str(r.path),
            data=data,
            template=style.template,
            system_prompt=style.system_prompt,
            assistant_prefix=style.assistant_prefix,
        )
        err.print(
            f"{r.label}: accuracy {result.summary['accuracy']:.3f} on {len(rows)} problems "
            f"in {result.summary['time_s']:.1f} s -> {where}",
            highlight=False,
            markup=False,
        )
        labels.append(r.label if r.label not in labels else f"{r.label} ({len(labels) + 1})")
        summaries.append(result.summary)
        del model, engine
    console.print(comparison_table(labels, summaries))
    return 0


def register(sub) -> None:
    from rlvr.commands.common import add_model_args

    p = sub.add_parser(
        "eval",
        help="evaluate models on a test set (accuracy, pass@k, maj@k)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p, many=True)
    p.add_argument(
        "--data", "-d", required=True, help="built-in task (arithmetic: its test split) or a data file/folder"
    )
    p.add_argument(
        "--preset",
        default=None,
        help="dataset preset of the data file, e.g. gsm8k (default: detected from its columns)",
    )
    p.add_argument("--difficulty", type=int, default=1, help="arithmetic difficulty 1..4 (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N problems (default: all)")
    p.add_argument(
        "--samples",
        "-k",
        type=int,
        default=1,
        help="K samples per problem for pass@k and maj@K (1 = greedy only; default: %(default)s)",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="temperature of the K samples (default: %(default)s)")
    p.add_argument("--batch", type=int, default=64, help="problems generated together (default: %(default)s)")
    p.add_argument(
        "--output", "-o", default=None, help="output folder (default: runs/eval/DATA-TIME, DATA the data's name)"
    )
    p.set_defaults(func=cmd_eval)
