"""`rlvr estimate`: the memory a config needs, from the model's config.json alone (no weights load)."""

from __future__ import annotations

import argparse

from rlvr.commands.common import add_config_args, load_cli_config

EXAMPLES = """examples:
  rlvr estimate                                          # the quickstart on this machine
  rlvr estimate --config grpo model.device=cuda          # the same run on a GPU (reference model included)
  rlvr estimate --config r1_zero_qwen25_7b               # works without the weights: a published shape
"""


def cmd_estimate(args) -> int:
    from rlvr.estimate import estimate_config

    cfg = load_cli_config(args)
    est, source = estimate_config(cfg)
    print(f"model.path={cfg.model.path}; shape from {source}")
    print("\n".join(est.lines()))
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
