"""`rlvr data preview | stats | prepare`: see exactly what the model will see, and build the cache."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rlvr.commands.common import add_config_args, load_cli_config, quiet_libraries
from rlvr.errors import UserError

EXAMPLES = """examples:
  rlvr data preview                                    # the quickstart's prompts (built-in arithmetic task)
  rlvr data preview examples/gsm8k_train.jsonl --n 2   # a file: preset detected from its columns
  rlvr data preview examples/my.yaml data.template=r1_base   # a run config, with overrides
  rlvr data preview --config examples/my.yaml examples/gsm8k_test.jsonl   # a run config on another file
  rlvr data stats examples/gsm8k_train.jsonl data.max_prompt_tokens=512
  rlvr data prepare examples/my.yaml                   # tokenise and cache before a run
"""

USAGE_NOTE = """The first argument that is not key=value may be a config (.yaml or preset name, as
with --config) or a data file, folder, glob or Hub data set like openai/gsm8k:main (read as
data.task=files data.path=IT)."""


def _config(args):
    """The Config for ``[--config CONFIG] [CONFIG-or-FILE] [key=value ...]``, read as `rlvr train` reads
    ``--config`` and overrides; a data file, folder or Hub data set becomes data.task=files."""
    from rlvr.data.files import hub_name

    sources = [a for a in args.overrides if "=" not in a]
    overrides = [a for a in args.overrides if "=" in a]
    if len(sources) > 1:
        raise UserError(
            f"give one config or data file, not {len(sources)} ({', '.join(sources)}); overrides look like key=value"
        )
    config = args.config
    if sources:
        src = sources[0]
        path, on_hub = Path(src), hub_name(src) is not None  # org/name[:config]: a Hub data set
        # a bare word that is no file is a preset name, unless --config already named the config
        is_config = path.suffix in (".yaml", ".yml") or (
            config is None and not path.exists() and not path.suffix and not on_hub
        )
        if is_config and config is not None:
            raise UserError(f"two configs: --config {config} and {src}; give one")
        if is_config:
            config = src
        else:
            if not path.exists() and not on_hub and not any(c in src for c in "*?[,"):
                raise UserError(f"{src} not found: give a config (.yaml or preset name) or a data file, folder or glob")
            overrides = ["data.task=files", f"data.path={src}", *overrides]
    return load_cli_config(argparse.Namespace(config=config, overrides=overrides))


def _tokenizer_and_context(cfg) -> tuple:
    """(the model's tokenizer, its context in tokens)."""
    from rlvr.models import context_tokens, load_tokenizer, resolve_model_path

    folder = resolve_model_path(cfg.model.path, weights=False)  # a hub id: no weights fetched
    return load_tokenizer(folder), context_tokens(folder)


def _prepared(cfg, split: str, model: tuple | None = None):
    """``split``'s prepared rows; ``model`` is :func:`_tokenizer_and_context`'s pair (None: loaded here)."""
    from rlvr.data import load_split, prepare_rows

    loaded = load_split(cfg.data, split)
    tokenizer, context = model or _tokenizer_and_context(cfg)
    return prepare_rows(loaded, cfg.data, tokenizer, context=context)


def cmd_preview(args) -> int:
    cfg = _config(args)
    quiet_libraries()
    prepared = _prepared(cfg, args.split)
    for note in prepared.notes:
        print(f"# {note}")
    if not prepared.rows:
        print(f"# no {args.split} rows")
        return 0
    t = prepared.template
    print(
        f"# template {t.name}; system {t.system!r}; assistant prefix {t.assistant_prefix!r}; "
        f"{len(prepared.rows)} {args.split} rows"
    )
    for i, row in enumerate(prepared.rows[: args.n]):
        print(
            f"\n===== {args.split} row {i + 1}: prompt ({row['prompt_tokens']} tokens), "
            "exactly as the model sees it ====="
        )
        print(row["prompt"] + "⟪END⟫")
        print(f"----- gold answer: {row['answer']!r}")
        if row["system"]:
            print(f"----- row system prompt: {row['system']!r}")
        if row["fields"]:
            shown = json.dumps(row["fields"], ensure_ascii=False, default=str)
            print(f"----- fields (for rewards): {shown[:300]}{'…' if len(shown) > 300 else ''}")
    return 0


def cmd_stats(args) -> int:
    from rlvr.data.prepare import summary

    cfg = _config(args)
    quiet_libraries()
    model = _tokenizer_and_context(cfg)
    out = {}
    for split in ("train", "test"):
        prepared = _prepared(cfg, split, model)
        out[split] = {**summary(prepared), "notes": prepared.notes}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for split, s in out.items():
        for note in s["notes"]:
            print(f"# {note}")
        p = s["prompt_tokens"]
        print(
            f"{split}: {s['rows']} rows; prompt tokens min {p['min']} p50 {p['p50']} p90 {p['p90']} "
            f"p99 {p['p99']} max {p['max']}"
        )
        print(f"{split}: left out: {s['dropped_summary']}")
    return 0


def cmd_prepare(args) -> int:
    from rlvr.data.prepare import _cache_root

    cfg = _config(args)
    if not cfg.data.cache:
        raise UserError("data.cache=false: nothing to prepare; drop the override to build the cache")
    quiet_libraries()
    model = _tokenizer_and_context(cfg)
    for split in ("train", "test"):
        t0 = time.perf_counter()
        prepared = _prepared(cfg, split, model)
        for note in prepared.notes:
            print(f"# {note}")
        state = "already cached" if prepared.cached else "prepared"
        print(f"{split}: {len(prepared.rows)} rows {state} in {time.perf_counter() - t0:.1f} s")
    print(f"cache: {_cache_root()}")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "data",
        help="preview, inspect and prepare training data",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dsub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    helps = {
        "preview": (
            "print the first rendered prompts exactly (special tokens visible), token counts, gold answers",
            cmd_preview,
        ),
        "stats": ("row counts, prompt-length percentiles, rows left out and why", cmd_stats),
        "prepare": ("render, tokenise and cache the data ahead of a run", cmd_prepare),
    }
    for name, (text, fn) in helps.items():
        q = dsub.add_parser(
            name,
            help=text,
            description=USAGE_NOTE,
            epilog=EXAMPLES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_config_args(q)
        if name == "preview":
            q.add_argument("--n", type=int, default=3, help="how many prompts to show (default 3)")
            q.add_argument("--split", choices=["train", "test"], default="train")
        if name == "stats":
            q.add_argument("--json", action="store_true", help="print the numbers as JSON")
        q.set_defaults(func=fn)
