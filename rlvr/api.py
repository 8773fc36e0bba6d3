"""rlvr from Python: :func:`train` and :func:`evaluate`, as ``rlvr train`` and ``rlvr eval`` run them.

Each runs the command in a child process started with the environment the command gives itself
(:func:`rlvr.cpu.process_env`: MKL's AVX-512 kernels on AMD, huge pages and the kept heap for
malloc), which a process that is already running, such as a notebook's kernel, cannot give itself.
So a run from Python takes the same fast paths, and is the same run bit for bit, as one from the
shell. The child's lines appear as it prints them. A mistake in the config is found here, before
anything starts, and every mistake the child reports is raised as :class:`rlvr.UserError` with its
one line; nothing here raises ``SystemExit``. Ctrl-C (``KeyboardInterrupt``) is passed on to the
child, which finishes its step and saves a checkpoint, as in a shell, and is then raised here.

Written here rather than calling :func:`rlvr.cli.main` in process: that runs with the notebook's
environment (MKL's slower kernels on AMD CPUs), exits through ``SystemExit`` on a usage error, and
leaves the kernel holding the model's memory.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlvr.analysis.run import Run, load_run
from rlvr.errors import UserError

__all__ = ["Run", "evaluate", "load_run", "train"]


def _value(value: Any) -> str:
    """A Python value as the override text the config reads back as that value (YAML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, os.PathLike)):
        return str(value)
    return json.dumps(value)  # lists and mappings: JSON is YAML's flow style


def _overrides(overrides: Mapping[str, Any] | None, kwargs: dict[str, Any]) -> list[str]:
    """``key.sub=value`` texts: ``overrides`` as given (dotted keys), then ``kwargs`` with ``__`` for dots
    (``train__steps=2`` is ``train.steps=2``)."""
    pairs = [*(overrides or {}).items(), *((k.replace("__", "."), v) for k, v in kwargs.items())]
    return [f"{key}={_value(value)}" for key, value in pairs]


def _child(argv: list[str]) -> None:
    """``rlvr ARGV`` in a child process with the command's environment; its lines pass through.

    Raises:
        UserError: the child's one-line error (exit 2).
        RuntimeError: any other failure, with the last lines it printed.
        KeyboardInterrupt: after the child, sent SIGINT, has saved and stopped.
    """
    from rlvr.cpu import process_env

    env = process_env() or dict(os.environ)
    cmd = [sys.executable, "-m", "rlvr.cli", *argv]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, bufsize=1)
    tail: collections.deque[str] = collections.deque(maxlen=40)

    def relay() -> None:  # the child's stderr (its progress and notes) to ours, keeping the last lines
        for line in proc.stderr:
            tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)  # the child finishes its step and saves, as after Ctrl-C in a shell
        proc.wait()
        reader.join(timeout=5)
        raise
    reader.join(timeout=5)
    if code == 0:
        return
    errors = [line.removeprefix("error: ") for line in tail if line.startswith("error: ")]
    if code == 2 and errors:
        raise UserError(errors[-1])
    last = "\n".join(list(tail)[-10:])
    raise RuntimeError(f"rlvr {argv[0]} exited with status {code}; its last lines:\n{last}")


def train(config: str | os.PathLike | None = None, /, overrides: Mapping[str, Any] | None = None, **kwargs) -> Run:
    """Train as ``rlvr train --config CONFIG key=value ...`` does; returns the finished run.

    Args:
        config: a preset name (``"grpo"``), a YAML file, or None for the quickstart preset.
        overrides: dotted keys to values, ``{"train.steps": 20, "reward.rules": ["accuracy"]}``.
        **kwargs: more overrides, ``__`` for each dot: ``train__steps=20``, ``run_dir="runs/a"``, ``seed=1``.

    Returns:
        The run (:class:`rlvr.analysis.run.Run`): ``path``, ``metrics`` (one dict a step), ``evals``,
        ``checkpoints``, ``config``, ``series(key)``, ``samples()``, ``status()``.

    Raises:
        UserError: a config, data, model or run-directory mistake, with the one line the command
            prints; the config's own mistakes before anything starts.
    """
    from rlvr.commands.common import load_cli_config
    from rlvr.commands.train import own_run_dir

    texts = _overrides(overrides, kwargs)
    args = argparse.Namespace(config=None if config is None else str(config), overrides=texts)
    cfg, _ = own_run_dir(load_cli_config(args), args)  # checks the config here; the child makes the same choice
    _child(["train", *(["--config", str(config)] if config is not None else []), *texts])
    return load_run(Path(cfg.resume or cfg.run_dir).resolve())


def evaluate(
    model: str | os.PathLike,
    data: str | os.PathLike,
    *,
    output: str | os.PathLike | None = None,
    limit: int | None = None,
    samples: int = 1,
    **flags,
) -> dict:
    """Evaluate as ``rlvr eval --model MODEL --data DATA`` does; returns its summary.

    Args:
        model: a built-in name, a run directory, a checkpoint, a model folder, a hub id or a .gguf file.
        data: a built-in task (``"arithmetic"``) or a data file, folder or hub name.
        output: the folder for summary.json and predictions.jsonl (default: a new temporary folder).
        limit: the first N problems (default: all).
        samples: K samples a problem for pass@k and maj@k (1: greedy alone).
        **flags: any other ``rlvr eval`` flag, ``_`` for ``-``: ``preset="gsm8k"``, ``temperature=0.6``,
            ``tools="calculator"``.

    Returns:
        summary.json's content (accuracy, format rate, pass@k, ...), with ``"output"``: the folder.
    """
    out = Path(output) if output is not None else Path(tempfile.mkdtemp(prefix="rlvr-eval-"))
    argv = ["eval", "--model", str(model), "--data", str(data), "--output", str(out), "--samples", str(samples)]
    if limit is not None:
        argv += ["--limit", str(limit)]
    for name, value in flags.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    _child(argv)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return {**summary, "output": str(out)}
