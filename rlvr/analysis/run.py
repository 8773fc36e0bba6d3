"""Read a run directory as it is on disk: finished, still going, or crashed.

Nothing here imports torch or the trainer, and nothing trusts the files: a line cut by a crash
is skipped, a missing file is an empty list, and a step logged twice (a resume that crashed
before truncating) keeps its last row.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlvr import metric_names as M
from rlvr.errors import UserError
from rlvr.jsonl import read_jsonl
from rlvr.run_dir import RunDir, step_of


def _by_step(rows: list[dict]) -> list[dict]:
    last: dict[int, dict] = {}
    for r in rows:
        if isinstance(r.get("step"), int) and not isinstance(r.get("step"), bool):
            last[r["step"]] = r
    return [last[s] for s in sorted(last)]


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """``{"train": {"lr": 1e-5}}`` -> ``{"train.lr": 1e-5}`` (lists stay values)."""
    out: dict[str, object] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and k != "rules":
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


@dataclass
class Run:
    """Everything a report needs from ``RUN/``."""

    path: Path
    config: dict = field(default_factory=dict)
    metrics: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)  # {"step", "eval/<metric>"...}, step 0 = before training
    checkpoints: list[int] = field(default_factory=list)
    samples_path: Path | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def dir(self) -> RunDir:
        """Where the run's files are."""
        return RunDir(self.path)

    def cfg(self, dotted: str, default=None):
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def total_steps(self) -> int | None:
        steps = self.cfg("train.steps")
        return steps if isinstance(steps, int) else None

    @property
    def last_step(self) -> int:
        return self.metrics[-1]["step"] if self.metrics else 0

    @property
    def complete(self) -> bool:
        """The final checkpoint of ``train.steps`` exists (train() saves it last)."""
        return self.total_steps is not None and self.total_steps in self.checkpoints

    def status(self) -> str:
        """'complete (50 steps)' or 'incomplete: step 12 of 50, last write 3 min ago (still running, or stopped)'."""
        if self.complete:
            return f"complete ({self.total_steps} steps)"
        of = f" of {self.total_steps}" if self.total_steps else ""
        metrics_file = self.dir.metrics_file
        mtime = metrics_file.stat().st_mtime if metrics_file.is_file() else None
        ago = f", last write {_ago(time.time() - mtime)} ago" if mtime else ""
        return f"incomplete: step {self.last_step}{of}{ago} (still running, or stopped)"

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a numeric metric; rows without it are left out."""
        xs, ys = [], []
        for r in self.metrics:
            v = r.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:  # drops NaN
                xs.append(r["step"])
                ys.append(float(v))
        return xs, ys

    def eval_series(self, key: str) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for r in self.evals:
            v = r.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                xs.append(r["step"])
                ys.append(float(v))
        return xs, ys

    def keys(self) -> list[str]:
        """Every numeric metric key, in first-seen order."""
        seen: dict[str, None] = {}
        for r in self.metrics:
            for k, v in r.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    seen.setdefault(k, None)
        return list(seen)

    def samples(self) -> list[dict]:
        return read_jsonl(self.samples_path) if self.samples_path else []

    def seqs_per_step(self) -> int | None:
        p, g = self.cfg("train.prompts_per_step"), self.cfg("rollout.samples_per_prompt")
        return p * g if isinstance(p, int) and isinstance(g, int) else None

    def reward_rules(self) -> list[tuple[str, float]]:
        """(rule, weight) pairs from the config (``rules`` as a list + ``weights``, or as a mapping)."""
        rules, weights = self.cfg("reward.rules"), self.cfg("reward.weights")
        if isinstance(rules, dict):
            return [(str(k), v) for k, v in rules.items()]
        if isinstance(rules, list):
            weights = weights if isinstance(weights, list) and len(weights) == len(rules) else [None] * len(rules)
            return list(zip(map(str, rules), weights))
        return []


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _read_evals(run: RunDir) -> list[dict]:
    """Evaluations: ``RUN/eval/history.jsonl``, plus any ``RUN/eval/step_N/summary.json`` it lacks."""
    rows = run.read_eval_history()
    have = {r.get("step") for r in rows}
    for d in run.eval_dirs():
        step = step_of(d)
        if step in have or not (d / "summary.json").is_file():
            continue
        try:
            summary = json.loads((d / "summary.json").read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            continue
        if isinstance(summary, dict):
            row = {M.eval_key(k): v for k, v in summary.items() if isinstance(v, (int, float)) and k != "step"}
            rows.append({"step": step, **row})
    return _by_step(rows)


def load_run(path: str | Path) -> Run:
    """Read ``RUN/`` (config.yaml, metrics.jsonl, samples.jsonl, eval/, checkpoints/; see :mod:`rlvr.run_dir`).

    Raises:
        UserError: not a directory, or neither metrics.jsonl nor config.yaml is there.
    """
    run_dir = RunDir(path)
    if not run_dir.path.is_dir():
        raise UserError(f"{run_dir.path}: no such run directory")
    if not run_dir.is_run():
        raise UserError(
            f"{run_dir.path} is not a run directory (no metrics.jsonl or config.yaml); "
            "give the directory `rlvr train` wrote"
        )
    config = run_dir.read_config() or {}  # a broken config.yaml still leaves the curves worth plotting
    try:
        metrics = _by_step(run_dir.read_metrics())
    except OSError as e:
        raise UserError(f"cannot read {run_dir.metrics_file}: {e.strerror}") from None
    run = Run(
        path=run_dir.path,
        config=config,
        metrics=metrics,
        evals=_read_evals(run_dir),
        checkpoints=[step_of(d) for d in run_dir.checkpoints()],
        samples_path=run_dir.samples_file if run_dir.samples_file.is_file() else None,
    )
    _add_derived(run)
    return run


def _add_derived(run: Run) -> None:
    """``perf/step_tokens_per_s``: response tokens of the step / its wall time (end-to-end throughput)."""
    seqs = run.seqs_per_step()
    if not seqs:
        return
    for r in run.metrics:
        n, t = r.get(M.RESPONSE_LEN_MEAN), r.get(M.TIME_STEP_S)
        if isinstance(n, (int, float)) and isinstance(t, (int, float)) and t > 0 and M.STEP_TOKENS_PER_S not in r:
            r[M.STEP_TOKENS_PER_S] = n * seqs / t
