"""Where metrics and samples go. Tensors become floats here, once per step."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


class JsonlWriter:
    """Appends one JSON object per line and fsyncs it, so a crash loses at most the line being written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self._f.write(json.dumps({k: _plain(v) for k, v in row.items()}, ensure_ascii=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def read_jsonl(path: Path) -> list[dict]:
    """All complete rows of a JSONL file (a line cut by a crash is skipped)."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Drop rows with ``step > max_step`` (rows a resumed run will write again), atomically."""
    path = Path(path)
    if not path.is_file():
        return
    keep = [row for row in read_jsonl(path) if row.get("step", 0) <= max_step]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in keep), encoding="utf-8")
    os.replace(tmp, path)


class MetricsLogger:
    """``RUN/metrics.jsonl`` (always) and TensorBoard events in ``RUN/tensorboard`` (when available)."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.jsonl = JsonlWriter(Path(run_dir) / "metrics.jsonl")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                pass
            else:
                self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """Convert to floats once, write everywhere, return the plain dict."""
        row = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self.jsonl.write(row)
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        return row

    def close(self) -> None:
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
