"""`rlvr rewards`: list the built-in reward rules."""

from __future__ import annotations


def cmd_rewards(args) -> int:
    from rlvr.rewards import REWARDS

    for name, fn in REWARDS.items():
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        print(f"{name:18s} {doc}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("rewards", help="list the built-in reward rules")
    p.set_defaults(func=cmd_rewards)
