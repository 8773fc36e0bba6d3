"""Console output of a training run: one line per step, and a progress bar on a terminal."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

# (metric key, label, format) shown on every step line
STEP_FIELDS = [
    ("rollout/reward_mean", "reward", "{:.3f}"),
    ("rollout/accuracy", "acc", "{:.3f}"),
    ("rollout/format_rate", "fmt", "{:.2f}"),
    ("train/kl", "kl", "{:.4f}"),
    ("rollout/response_len_mean", "len", "{:.0f}"),
    ("time/step_s", "s/step", "{:.1f}"),
]


class StepPrinter:
    def __init__(self, total_steps: int, *, enabled: bool = True, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.total = total_steps
        self.progress = None
        if enabled and self.console.is_terminal:
            self.progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )

    def start(self, done: int) -> None:
        if self.progress is not None:
            self.task = self.progress.add_task("", total=self.total, completed=done)
            self.progress.start()

    def step(self, step: int, m: dict) -> None:
        parts = [f"{label} {fmt.format(m[k])}" for k, label, fmt in STEP_FIELDS if k in m]
        line = "  ".join(parts)
        self.console.print(f"step {step:>4}/{self.total}  {line}", highlight=False, markup=False)
        if self.progress is not None:
            self.progress.update(self.task, completed=step, description=line)

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def done(self, run_dir, final, history: list[dict]) -> None:
        acc = [m["rollout/accuracy"] for m in history if "rollout/accuracy" in m]
        if len(acc) >= 2:
            k = min(10, len(acc) // 2)
            first, last = sum(acc[:k]) / k, sum(acc[-k:]) / k
            self.note(f"accuracy: mean of the first {k} steps {first:.3f} -> last {k} steps {last:.3f}")
        self.note(f"done: {run_dir} (final checkpoint {final})")

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
