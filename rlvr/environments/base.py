"""The environment interface: what answers a model's turn during a rollout.

An :class:`Environment` is one episode's state. The rollout (:func:`rlvr.rollout.episodes.run_episodes`)
makes one per sampled sequence, calls :meth:`~Environment.reset` with the data row, decodes a turn,
hands it to :meth:`~Environment.step`, appends the observation (masked out of the loss, KL and
entropy) and decodes again, until the environment says the episode is done, the turn limit of the
environment ends it, or the token budget runs out. A tool loop and code with execution feedback are
both environments (:mod:`rlvr.environments.tools`, :mod:`rlvr.environments.code`).

Standard library only: environments are built and stepped in the trainer's process and in the
scoring pool's threads, never touch tensors, and see text.
"""

from __future__ import annotations

import abc
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


@dataclass(frozen=True)
class Turn:
    """One finished model turn, as :meth:`Environment.step` gets it.

    Attributes:
        text: the turn's text as decoded (special tokens dropped).
        index: 0 for the episode's first turn, then 1, 2, ...
        ended_on_eos: the turn ended with the end-of-sequence token (else with a stop string).
        lead: the first turn only: the prompt's last tokens and the turn decoded together, for an
            environment that reads something the prompt opened (a tool call opened by
            ``data.assistant_prefix``); "" for later turns.
        room: tokens of the episode's budget (``rollout.max_new_tokens``) left after this turn; at 0 an
            observation cannot be appended (a tool call need not run), but a reward still counts.
    """

    text: str
    index: int
    ended_on_eos: bool
    lead: str = ""
    room: int = 0


@dataclass(frozen=True)
class Step:
    """What an environment answers a turn with.

    Attributes:
        observation: ``str``: text appended inside the assistant's turn, as a tool result is; a list of
            chat messages (``{"role": "user", "content": ...}``): new turns in the model's chat
            template, after which the assistant's next turn opens (with ``data.assistant_prefix``);
            None with ``done`` False is not allowed.
        reward: the episode's reward so far, or None (the reward rules alone score it). The last
            non-None reward of an episode is its environment reward (``reward.env_weight``).
        done: the episode ends here.
    """

    observation: str | list[dict] | None = None
    reward: float | None = None
    done: bool = True

    def __post_init__(self) -> None:
        if not self.done and not self.observation:
            raise ValueError("an environment's Step that does not end the episode needs an observation")


class Environment(abc.ABC):
    """Base class of environments (subclass it; a plugin is ``package.module:Class`` or
    ``path/to/file.py:Class`` in ``rollout.environment``, built with no arguments for each episode).

    ``reset(row) -> first messages`` and ``step(turn) -> Step`` follow OpenRLHF's and veRL's
    interactions (docs/code-and-environments.md maps them).
    """

    max_turns: int = 1
    """Model turns an episode may take (the rollout stops asking :meth:`step` after this many)."""

    def reset(self, row: dict) -> list[dict] | None:
        """Prepares the episode from its data row (``question``, ``answer``, ``fields``, ...).

        Returns the episode's first messages (they replace the row's templated prompt; every sample of
        a prompt gets the same), or None to keep the data pipeline's prompt."""
        return None

    def stop(self) -> tuple[str, ...]:
        """Stop strings, besides the run's, that end the model's next turn here (a tool call's
        closing text). May depend on the episode's state (none once the call limit is reached)."""
        return ()

    @abc.abstractmethod
    def step(self, turn: Turn) -> Step:
        """Answers a finished turn (:class:`Step`); every environment defines it."""

    @classmethod
    def step_all(cls, pairs: list[tuple[Environment, Turn]]) -> list[Step]:
        """Steps many episodes of this class at once: by default side by side in threads (an environment
        that runs a subprocess, as the code sandbox does, waits without holding the interpreter). A
        class whose steps share a pool (the tool loop's scoring pool) overrides this."""
        if len(pairs) == 1:
            return [pairs[0][0].step(pairs[0][1])]
        with ThreadPoolExecutor(max_workers=min(len(pairs), _workers())) as pool:
            return list(pool.map(lambda p: p[0].step(p[1]), pairs))


def _workers() -> int:
    import os

    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def step_all(pairs: list[tuple[Environment, Turn]]) -> list[Step]:
    """Steps episodes of any classes, each class's together (:meth:`Environment.step_all`); the answers
    in the order of ``pairs``. A step that does not return a :class:`Step` fails here, naming the class."""
    out: list[Step | None] = [None] * len(pairs)
    by_class: dict[type, list[int]] = {}
    for i, (env, _) in enumerate(pairs):
        by_class.setdefault(type(env), []).append(i)
    for cls, idx in by_class.items():
        for i, answer in zip(idx, cls.step_all([pairs[i] for i in idx])):
            if not isinstance(answer, Step):
                raise TypeError(f"{cls.__name__}.step returned {type(answer).__name__}, not rlvr.environments.Step")
            out[i] = answer
    return out  # type: ignore[return-value]
