"""`rlvr estimate`: the memory a config needs, from the model's config.json and the training data's
prompt lengths (no weights load)."""

from __future__ import annotations

import argparse

from rlvr.commands.common import add_config_args, load_cli_config, quiet_libraries

EXAMPLES = """examples:
  rlvr estimate                                          # the quickstart on this machine
  rlvr estimate --config grpo model.device=cuda          # the same run on a GPU (reference model included)
  rlvr estimate --config r1_zero_qwen25_7b               # works without the weights: a published shape
"""


def data_prompt_length(cfg):
    """(longest rendered prompt, why) from the training data and the model's tokenizer, as training
    will see them; (None, why not) where they cannot be read here (no local weights, say)."""
    from rlvr.errors import UserError

    try:
        from rlvr.data import load_split, prepare_rows
        from rlvr.estimate import data_prompt_tokens
        from rlvr.models import context_tokens, hub, load_tokenizer, resolve_model_path

        remote = hub.parse_hub_id(cfg.model.path)
        if remote is None:
            folder = resolve_model_path(cfg.model.path)
        else:  # estimate fetches config.json alone: a hub model's tokenizer only where the cache has it
            folder = hub.cached(remote, weights=False)
            if folder is None:
                return None, f"the tokenizer of {remote.spec} is not in the Hugging Face cache {hub.cache_folder()}"
        tokenizer = load_tokenizer(folder)
        prepared = prepare_rows(load_split(cfg.data, "train"), cfg.data, tokenizer, context=context_tokens(folder))
        return data_prompt_tokens(prepared.rows), None
    except (UserError, OSError, ValueError) as e:
        return None, str(e).splitlines()[0] if str(e) else type(e).__name__


def cmd_estimate(args) -> int:
    from rlvr.estimate import estimate, load_memory, model_shape

    cfg = load_cli_config(args)
    quiet_libraries()
    shape, source = model_shape(cfg.model.path)
    prompt, why_not = data_prompt_length(cfg)
    est = estimate(cfg, shape, prompt=prompt)
    print(f"model.path={cfg.model.path}; shape from {source}")
    if why_not:
        print(f"prompt length not read from the data ({why_not}): assumed")
    print("\n".join(est.lines()))
    print("\n".join(load_memory(cfg, est).lines()))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "estimate",
        help="print the memory a config needs (parameters, AdamW, activations, KV cache) without loading weights",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p)
    p.set_defaults(func=cmd_estimate)
