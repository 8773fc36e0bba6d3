"""`rlvr rewards`: shortcut for `rlvr reward list` (the built-in reward rules)."""

from __future__ import annotations


def register(sub) -> None:
    from rlvr.commands.reward import cmd_list

    p = sub.add_parser("rewards", help="list the built-in reward rules (same as `rlvr reward list`)")
    p.set_defaults(func=cmd_list)
