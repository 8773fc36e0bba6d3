"""Where metrics and samples go. Tensors become floats here, once per step.

``metrics.jsonl`` is always written; TensorBoard and Weights & Biases are optional sinks.
Every sink is failure-isolated: the first exception a sink raises prints one warning and
turns that sink off; training never stops because logging broke.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import torch

from rlvr import metric_names as M
from rlvr.jsonl import JsonlWriter, plain
from rlvr.run_dir import RunDir


def peak_memory(device: torch.device | str = "cpu") -> dict[str, float]:
    """Peak memory so far: ``perf/peak_rss_mib`` (this process) and ``perf/cuda_max_allocated_mib`` on a GPU.

    RSS is ``getrusage(RUSAGE_SELF).ru_maxrss``: the true high-water mark of the trainer process
    (KiB on Linux, bytes on macOS), not a sample taken at the end of the step. Reward worker
    processes are not included. MiB = 2**20 bytes.
    """
    out: dict[str, float] = {}
    try:
        import resource
    except ImportError:  # Windows
        pass
    else:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out[M.PEAK_RSS_MIB] = rss / 2**20 if sys.platform == "darwin" else rss / 2**10
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        out[M.CUDA_MAX_ALLOCATED_MIB] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def train_state_bytes(model, optimizer) -> int:
    """Bytes this process holds of ``model``'s parameters and gradients and ``optimizer``'s state:
    the local shards of sharded (FSDP ``DTensor``) tensors, each storage counted once (tied weights)."""
    seen, total = set(), 0
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        key = (local.untyped_storage().data_ptr(), local.dtype)
        if key not in seen:
            seen.add(key)
            total += local.numel() * local.element_size()
    return total


# ---------------------------------------------------------------------------------------------
# sinks: each has `name`, `write(step, row)`, `close()`; `jsonl` is False for side sinks


class JsonlSink:
    name = "metrics.jsonl"
    jsonl = True

    def __init__(self, run_dir: Path) -> None:
        self.writer = JsonlWriter(RunDir(run_dir).metrics_file)

    def write(self, step: int, row: dict) -> None:
        self.writer.write(row)

    def close(self) -> None:
        self.writer.close()


class TensorBoardSink:
    """``RUN/tensorboard`` event files (`tensorboard --logdir RUN`)."""

    name = "TensorBoard"
    jsonl = False

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # ImportError: tensorboard not installed

        self.writer = SummaryWriter(str(RunDir(Path(run_dir)).tensorboard_dir))

    def write(self, step: int, row: dict) -> None:
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Weights & Biases; ``mode=offline`` writes ``RUN/wandb/`` with no network (upload later with `wandb sync`).

    The W&B run id is kept in ``RUN/wandb/run_id`` so a resumed training run continues the same W&B run.
    """

    name = "Weights & Biases"
    jsonl = False

    def __init__(self, run_dir: Path, *, project: str, mode: str) -> None:
        import wandb  # optional dependency, imported only here

        run = RunDir(Path(run_dir))
        run.wandb_dir.mkdir(parents=True, exist_ok=True)
        id_file = run.wandb_dir / "run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        if not run_id:
            run_id = wandb.util.generate_id()
            id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=project,
            name=run.path.name,
            id=run_id,
            resume="allow",
            dir=str(run.path),
            mode=mode,
            config=run.read_config(),
        )

    def write(self, step: int, row: dict) -> None:
        self.run.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self) -> None:
        self.run.finish()


def wandb_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("wandb") is not None
    except ValueError:  # a module object without a spec in sys.modules
        return sys.modules.get("wandb") is not None


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


class MetricsLogger:
    """Fans each step's metrics out to ``RUN/metrics.jsonl`` (always), TensorBoard and W&B.

    Args:
        run_dir: the run directory.
        tensorboard: also write TensorBoard events (skipped with a warning if tensorboard is missing).
        wandb: also log to Weights & Biases. Raises UserError, before anything is written, when
            the ``wandb`` package is not installed: the user asked for it explicitly.
        wandb_project, wandb_mode: ``wandb.init`` project and mode (offline or online).
        warn: called with a one-line message when a sink fails (default: ``warning: ...`` on stderr).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "rlvr",
        wandb_mode: str = "offline",
        warn: Callable[[str], None] = _warn,
    ) -> None:
        from rlvr.errors import UserError

        if wandb and not wandb_available():
            raise UserError(
                "log.wandb=true but the wandb package is not installed; `pip install wandb` or set log.wandb=false"
            )
        self.warn = warn
        self.sinks: list = [JsonlSink(run_dir)]
        factories = []
        if tensorboard:
            factories.append((TensorBoardSink.name, lambda: TensorBoardSink(run_dir)))
        if wandb:
            factories.append((WandbSink.name, lambda: WandbSink(run_dir, project=wandb_project, mode=wandb_mode)))
        for name, make in factories:
            try:
                self.sinks.append(make())
            except Exception as e:  # a sink that cannot start must not stop training
                self.warn(f"{name} logging is off: {type(e).__name__}: {e}")

    @classmethod
    def from_config(cls, run_dir: Path, log_cfg) -> "MetricsLogger":
        """The logger a training run's ``log`` config section asks for."""
        return cls(
            run_dir,
            tensorboard=log_cfg.tensorboard,
            wandb=log_cfg.wandb,
            wandb_project=log_cfg.wandb_project,
            wandb_mode=log_cfg.wandb_mode,
        )

    def _each(self, method: str, *args, jsonl: bool = True) -> None:
        for sink in list(self.sinks):
            if sink.jsonl and not jsonl:
                continue
            try:
                getattr(sink, method)(*args)
            except Exception as e:
                self.sinks.remove(sink)
                if method != "close":
                    self.warn(
                        f"{sink.name} logging failed ({type(e).__name__}: {e}); it is off for the rest of the run, "
                        "training continues"
                    )
                with_close = getattr(sink, "close", None)
                if method != "close" and with_close is not None:
                    try:
                        with_close()
                    except Exception:
                        pass

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Convert to floats once, write to every sink, return the plain row (with ``step``)."""
        row = {"step": step, **{k: plain(v) for k, v in metrics.items()}}
        self._each("write", step, row)
        return row

    def log_aside(self, step: int, metrics: dict[str, Any]) -> None:
        """TensorBoard and W&B only, e.g. the step-0 evaluation (metrics.jsonl rows are training steps 1..N)."""
        row = {"step": step, **{k: plain(v) for k, v in metrics.items()}}
        self._each("write", step, row, jsonl=False)

    @property
    def tb(self):
        """An ``add_scalar(key, value, step)`` handle that writes to the side sinks (TensorBoard, W&B).

        Never None, and failure-isolated like :meth:`log`: a sink that breaks mid-loop is dropped,
        not left for the caller to trip over.
        """
        return _AsideScalars(self)

    def close(self) -> None:
        self._each("close")
        self.sinks = []


class _AsideScalars:
    def __init__(self, logger: MetricsLogger) -> None:
        self.logger = logger

    def add_scalar(self, key: str, value: Any, step: int) -> None:
        self.logger.log_aside(step, {key: value})
