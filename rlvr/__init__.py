"""rlvr: reinforcement learning with verifiable rewards (GRPO and relatives) for small LLMs.

From Python (docs/python-api.md)::

    import rlvr

    run = rlvr.train("grpo", train__steps=20)  # as `rlvr train --config grpo train.steps=20`
    run.series("rollout/reward_mean"), run.path
    rlvr.evaluate(run.path, "arithmetic", limit=100)["accuracy"]

Everything is imported on first use, so ``import rlvr`` (and ``import rlvr.algos``) stays light.
"""

__version__ = "0.1.0"
__all__ = ["Run", "UserError", "evaluate", "load_run", "train"]


def __getattr__(name: str):
    if name == "UserError":
        from rlvr.errors import UserError

        return UserError
    if name in ("Run", "evaluate", "load_run", "train"):
        from rlvr import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlvr' has no attribute {name!r}")
