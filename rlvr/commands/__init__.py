"""CLI subcommands: each module has `register(subparsers)` and its `cmd_*` functions."""
