"""Console output of a training run: one line per step, and a progress bar on a terminal."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rlvr import metric_names as M
from rlvr.analysis.report import first_last
from rlvr.analysis.run import load_run

# (metric key, label, format) shown on every step line
STEP_FIELDS = [
    (M.REWARD_MEAN, "reward", "{:.3f}"),
    (M.ACCURACY, "acc", "{:.3f}"),
    (M.FORMAT_RATE, "fmt", "{:.2f}"),
    (M.KL, "kl", "{:.4f}"),
    (M.RESPONSE_LEN_MEAN, "len", "{:.0f}"),
    (M.TIME_STEP_S, "s/step", "{:.1f}"),
]


def make_console(*, stderr: bool = False, **kwargs) -> Console:
    """A rich Console that never breaks a printed line: rich wraps at the terminal's width, or at 80
    columns into a file or pipe, which split the commands rlvr tells the user to run (``continue with:
    rlvr train resume=...``) across two lines. With ``soft_wrap`` a long line stays one line; a
    terminal folds it on screen and copies it whole."""
    return Console(stderr=stderr, soft_wrap=True, **kwargs)


class StepPrinter:
    def __init__(self, total_steps: int, *, enabled: bool = True, console: Console | None = None) -> None:
        self.console = console or make_console(stderr=True)
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

    def done(self, run_dir, final) -> None:
        """The end-of-training summary (never raises)."""
        self.stop()  # the summary goes below a finished bar
        try:
            lines = summary_lines(run_dir, final)
        except Exception as e:  # a summary is a courtesy; the run itself is complete
            lines = [f"done: {run_dir} (final checkpoint {final}); summary unavailable ({type(e).__name__}: {e})"]
        for line in lines:
            self.note(line)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def summary_lines(run_dir, final) -> list[str]:
    """Steps and time, reward/accuracy first -> last, eval before -> after, final checkpoint."""
    run = load_run(run_dir)
    _, step_s = run.series(M.TIME_STEP_S)
    total = sum(step_s)
    lines = [
        f"done: {run.last_step} steps in {total / 60:.1f} min of training ({total / max(len(step_s), 1):.1f} s/step)"
    ]
    for key, label in [(M.REWARD_MEAN, "reward"), (M.ACCURACY, "accuracy"), (M.FORMAT_RATE, "format rate")]:
        a, b, k = first_last(run, key)
        if a is not None:
            lines.append(f"{label + ':':17s} {a:.3f} -> {b:.3f}  (mean of the first {k} steps -> the last {k})")
    if run.evals:
        first, last = run.evals[0], run.evals[-1]
        shown = (M.EVAL_ACCURACY, M.EVAL_FORMAT_RATE, M.EVAL_PASS_AT, M.EVAL_MAJ_AT)
        for key in [k for k in first if k.startswith(shown) and k != M.EVAL_ACCURACY_LENIENT]:
            if (
                isinstance(first.get(key), (int, float))
                and isinstance(last.get(key), (int, float))
                and last is not first
            ):
                lines.append(
                    f"{key + ':':17s} {first[key]:.3f} (step {first['step']}) -> {last[key]:.3f} (step {last['step']})"
                )
            elif isinstance(first.get(key), (int, float)):
                lines.append(f"{key + ':':17s} {first[key]:.3f} (step {first['step']})")
    _, rss = run.series(M.PEAK_RSS_MIB)
    if rss:
        lines.append(f"{'peak memory:':17s} {max(rss):.0f} MiB RSS")
    lines.append(f"{'checkpoint:':17s} {final}")
    return lines
