"""A run directory: the one place that knows where a run keeps its files.

Layout::

    RUN/config.yaml                    the fully resolved config the run started with (never rewritten)
    RUN/resumes/step_000040.yaml       the config of each resumed segment, by the step it continued from
    RUN/metrics.jsonl                  one row per optimizer step, 1..N
    RUN/samples.jsonl                  prompts, completions and rewards every log.samples_every steps
    RUN/eval/step_000020/              summary.json, predictions.jsonl of one evaluation
    RUN/eval/history.jsonl             one row per evaluation (step 0 = before training)
    RUN/checkpoints/step_000020/       HF model directory (LoRA: the adapter) + trainer_state.pt
    RUN/checkpoints/last -> step_000020
    RUN/tensorboard/, RUN/wandb/       optional sinks
    RUN/report/                        `rlvr report` output
  RUN/.lock                          held (flock) by the process that trains the run, with its pid

A checkpoint is complete once its trainer state is there: :mod:`rlvr.training.checkpoint`
writes it under a temporary name and renames it into place. Reading a run trusts nothing:
a missing file is empty, a line cut by a crash is skipped, a dangling ``last`` falls back to
the newest complete ``step_N``. Imports no torch (reports read runs without it).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from rlvr.errors import UserError
from rlvr.jsonl import read_jsonl

try:
    import fcntl
except ImportError:  # not on Windows: runs are not locked there
    fcntl = None

CONFIG, METRICS, SAMPLES = "config.yaml", "metrics.jsonl", "samples.jsonl"
EVAL, CHECKPOINTS, TENSORBOARD, WANDB, REPORT = "eval", "checkpoints", "tensorboard", "wandb", "report"
RESUMES, LOCK = "resumes", ".lock"
EVAL_HISTORY, LAST = "history.jsonl", "last"
STATE_FILE = "trainer_state.pt"
"""The trainer state (optimizer, RNG, data position) beside a checkpoint's weights."""
OUTPUTS = (METRICS, SAMPLES, CHECKPOINTS, EVAL, TENSORBOARD, REPORT, WANDB, RESUMES)
"""What a run writes into its directory besides config.yaml (a fresh start removes these)."""
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


def step_name(step: int) -> str:
    """``step_000020``: the name of a step's checkpoint and evaluation directories."""
    return f"step_{step:06d}"


def step_of(path: Path) -> int | None:
    """The step of a ``step_N`` directory (None for any other name)."""
    m = _STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def is_checkpoint(path: Path) -> bool:
    """A complete checkpoint: its trainer state was written (the last file before the rename)."""
    return (Path(path) / STATE_FILE).is_file()


def remove_path(path: Path) -> None:
    """Delete a file, a symlink (not what it points at) or a directory tree; nothing if it is gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _try_lock(f) -> bool:
    """Whether this process got the exclusive lock of the open file ``f`` (never waits)."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _step_dirs(root: Path) -> list[Path]:
    """``step_N`` directories under ``root``, by step (none when root is missing)."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if step_of(p) is not None and p.is_dir()), key=step_of)


@dataclass(frozen=True)
class RunDir:
    """The files of one run under ``path``; nothing is read or written until asked."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def of_checkpoint(cls, ckpt: Path) -> RunDir | None:
        """The run a checkpoint directory belongs to (``RUN/checkpoints/step_N``), None for a loose one."""
        ckpt = Path(ckpt)
        return cls(ckpt.parent.parent) if ckpt.parent.name == CHECKPOINTS else None

    # -- layout -----------------------------------------------------------------------------

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG

    @property
    def resumes_root(self) -> Path:
        return self.path / RESUMES

    def resume_config_file(self, step: int) -> Path:
        """The config of the segment that continued the run from the checkpoint of ``step``."""
        return self.resumes_root / f"{step_name(step)}.yaml"

    def resume_config_files(self) -> list[Path]:
        """Every resumed segment's config, by the step it continued from (oldest first)."""
        if not self.resumes_root.is_dir():
            return []
        found = [p for p in self.resumes_root.glob("step_*.yaml") if step_of(p.with_suffix("")) is not None]
        return sorted(found, key=lambda p: step_of(p.with_suffix("")))

    @property
    def current_config_file(self) -> Path:
        """The config the run trains with now: its last resumed segment's, else config.yaml."""
        resumed = self.resume_config_files()
        return resumed[-1] if resumed else self.config_file

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS

    @property
    def samples_file(self) -> Path:
        return self.path / SAMPLES

    @property
    def eval_root(self) -> Path:
        return self.path / EVAL

    @property
    def eval_history_file(self) -> Path:
        return self.eval_root / EVAL_HISTORY

    def eval_dir(self, step: int) -> Path:
        return self.eval_root / step_name(step)

    @property
    def checkpoints_root(self) -> Path:
        return self.path / CHECKPOINTS

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints_root / step_name(step)

    @property
    def last_link(self) -> Path:
        return self.checkpoints_root / LAST

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def wandb_dir(self) -> Path:
        return self.path / WANDB

    @property
    def report_dir(self) -> Path:
        """Where `rlvr report` writes report.md, report.html and plots/ by default."""
        return self.path / REPORT

    # -- what is there ------------------------------------------------------------------------

    def is_run(self) -> bool:
        """A run was started here: it has metrics.jsonl or config.yaml."""
        return self.metrics_file.is_file() or self.config_file.is_file()

    def read_config(self) -> dict | None:
        """The run's current config (:attr:`current_config_file`) as a plain dict; None when it is
        missing or does not parse ({} for an empty file)."""
        path = self.current_config_file
        if not path.is_file():
            return None
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError):
            return None
        return loaded if isinstance(loaded, dict) else {}

    def read_metrics(self) -> list[dict]:
        """metrics.jsonl rows as written ([] when missing); OSError when it cannot be read."""
        return read_jsonl(self.metrics_file) if self.metrics_file.is_file() else []

    def read_samples(self) -> list[dict]:
        return read_jsonl(self.samples_file) if self.samples_file.is_file() else []

    def read_eval_history(self) -> list[dict]:
        return read_jsonl(self.eval_history_file) if self.eval_history_file.is_file() else []

    def eval_dirs(self) -> list[Path]:
        """``eval/step_N`` directories, by step."""
        return _step_dirs(self.eval_root)

    def checkpoints(self) -> list[Path]:
        """Complete step checkpoints, oldest first."""
        return [p for p in _step_dirs(self.checkpoints_root) if is_checkpoint(p)]

    def last_checkpoint(self, *, usable: Callable[[Path], bool] = is_checkpoint) -> Path | None:
        """Where ``last`` points (resolved), or the newest ``step_N`` when ``last`` is missing or
        dangling; None when there is none. ``usable`` decides what counts (default: complete)."""
        if self.last_link.is_dir() and usable(self.last_link):
            return self.last_link.resolve()
        found = [p for p in _step_dirs(self.checkpoints_root) if usable(p)]
        return found[-1] if found else None

    def resume_checkpoint(self) -> Path:
        """The checkpoint ``resume=RUN`` continues from; a UserError naming the run when there is none."""
        if not self.path.is_dir():
            raise UserError(f"resume={self.path}: no such run directory")
        found = self.last_checkpoint()
        if found is None:
            raise UserError(
                f"resume={self.path}: the run has no checkpoint yet (set train.save_every to save during training)"
            )
        return found

    # -- one process trains a run at a time ---------------------------------------------------

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK

    def check_unlocked(self) -> None:
        """A UserError when another process trains this run now; reads the lock, changes nothing."""
        if fcntl is None or not self.lock_file.is_file():
            return
        with open(self.lock_file, "rb") as f:
            if not _try_lock(f):
                raise self._busy(f)
            fcntl.flock(f, fcntl.LOCK_UN)

    def lock(self):
        """Takes the run's lock for this process and writes its pid there; returns the open lock file
        (the lock goes when it is closed or the process ends, however it ends). Creates the run directory.

        Raises:
            UserError: another process holds it (two processes would interleave one run's files).
        """
        self.path.mkdir(parents=True, exist_ok=True)
        f = open(self.lock_file, "a+b")  # noqa: SIM115 - held open for the run's life
        if fcntl is not None and not _try_lock(f):
            f.close()
            with open(self.lock_file, "rb") as held:
                raise self._busy(held)
        f.truncate(0)
        f.write(f"{os.getpid()}\n".encode())
        f.flush()
        return f

    def _busy(self, f) -> UserError:
        f.seek(0)
        pid = f.read().decode(errors="replace").strip() or "unknown"
        return UserError(
            f"{self.path} is being trained by another process (pid {pid}) right now; wait for it to end or "
            f"stop it (Ctrl-C, or kill {pid}: it saves a checkpoint), then resume={self.path}"
        )

    # -- writing -----------------------------------------------------------------------------

    def write_config(self, text: str, *, resumed_from: int | None = None) -> Path:
        """Writes a config atomically (a temporary file renamed into place) and returns its path: a new
        run's ``config.yaml``, or with ``resumed_from`` the config of the segment that continues from
        that step's checkpoint. A segment supersedes those recorded from later steps, whose steps it
        trains again; they are removed. Creates the run directory."""
        path = self.config_file if resumed_from is None else self.resume_config_file(resumed_from)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        if resumed_from is not None:
            for later in self.resume_config_files():
                if step_of(later.with_suffix("")) > resumed_from:
                    later.unlink()
        return path

    # -- starting again ---------------------------------------------------------------------

    def remove_outputs(self, *, keep: tuple[str, ...] = ()) -> None:
        """Delete what an earlier run wrote here (:data:`OUTPUTS` except ``keep``); config.yaml stays."""
        for name in OUTPUTS:
            if name in keep:
                continue
            remove_path(self.path / name)
