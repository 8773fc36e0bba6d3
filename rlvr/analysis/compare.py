"""``rlvr compare RUN1 RUN2 …``: overlaid curves and a results table of several runs.

Writes ``OUTPUT/compare.md``, a self-contained ``OUTPUT/compare.html`` and ``OUTPUT/plots/*.png``.
"""

from __future__ import annotations

from pathlib import Path

from rlvr import metric_names as M
from rlvr.analysis import aha
from rlvr.analysis.document import Doc
from rlvr.analysis.plots import panels_for, save_aha_curve, save_panel
from rlvr.analysis.report import first_last
from rlvr.analysis.run import Run, flatten, load_run
from rlvr.errors import UserError

IGNORED_KEYS = ("run_dir", "resume")


def run_labels(paths: list[Path]) -> list[str]:
    """Short unique labels: the directory names, or paths below the common parent when names repeat."""
    names = [p.name for p in paths]
    if len(set(names)) == len(names):
        return names
    resolved = [p.resolve() for p in paths]
    parts = [r.parts for r in resolved]
    common = 0
    while all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    labels = ["/".join(p[common:]) for p in parts]
    return labels if len(set(labels)) == len(labels) else [str(p) for p in paths]


def config_differences(runs: list[Run]) -> list[tuple[str, list]]:
    """(dotted key, value per run) for every config key whose value is not the same in all runs."""
    flat = [flatten(r.config) for r in runs]
    keys: dict[str, None] = {}
    for f in flat:
        keys.update(dict.fromkeys(f))
    out = []
    for k in keys:
        if k in IGNORED_KEYS:
            continue
        values = [f.get(k) for f in flat]
        if any(v != values[0] for v in values[1:]):
            out.append((k, values))
    return out


def _last(run: Run, key: str):
    _, ys = run.series(key)
    return ys[-1] if ys else None


def summary_row(label: str, run: Run) -> list[str]:
    """Results of one run: steps, final reward/accuracy, eval accuracy, time, throughput, peak memory."""
    _, reward, k = first_last(run, M.REWARD_MEAN)
    _, acc, _ = first_last(run, M.ACCURACY)
    acc_steps, acc_all = run.series(M.ACCURACY)
    first_half = next((st for st, a in zip(acc_steps, acc_all) if a >= 0.5), None)
    _, ev = run.eval_series(M.EVAL_ACCURACY)
    _, step_s = run.series(M.TIME_STEP_S)
    _, eval_s = run.eval_series(M.EVAL_TIME_S)
    _, gen = run.series(M.GEN_TOKENS_PER_S)
    _, e2e = run.series(M.STEP_TOKENS_PER_S)
    _, rss = run.series(M.PEAK_RSS_MIB)
    _, cuda = run.series(M.CUDA_MAX_ALLOCATED_MIB)

    def f(v, spec="{:.3f}"):
        return spec.format(v) if v is not None else "n/a"

    steps = f"{run.last_step}" + (f"/{run.total_steps}" if run.total_steps else "")
    wall = sum(step_s) + sum(eval_s) if step_s else None
    memory = f(max(rss), "{:.0f}") if rss else "n/a"
    if cuda:
        memory += f" (CUDA {max(cuda):.0f})"
    return [
        label,
        steps + ("" if run.complete else " (incomplete)"),
        f(reward),
        f(acc),
        f(sum(acc_all) / len(acc_all) if acc_all else None),
        (str(first_half) if first_half is not None else "never") if acc_all else "n/a",
        (f"{ev[0]:.3f} → {ev[-1]:.3f}" if len(ev) > 1 else f(ev[0])) if ev else "n/a",
        f(wall / 60 if wall is not None else None, "{:.1f}"),
        f(sum(gen) / len(gen) if gen else None, "{:.1f}"),
        f(sum(e2e) / len(e2e) if e2e else None, "{:.1f}"),
        memory,
    ]


SUMMARY_HEADERS = [
    "run",
    "steps",
    "final reward",
    "final accuracy",
    "mean accuracy (all steps)",
    "first step with accuracy ≥ 0.5",
    "eval accuracy (first → last)",
    "wall time (min)",
    "generation tokens/s",
    "end-to-end tokens/s",
    "peak RSS (MiB)",
]


def compare_runs(run_dirs: list[str | Path], output: str | Path, *, title: str = "Run comparison") -> Path:
    """Write the comparison of ``run_dirs`` to ``output``; returns ``output``."""
    if not run_dirs:
        raise UserError("give at least one run directory to compare")
    paths = [Path(p) for p in run_dirs]
    runs = [load_run(p) for p in paths]
    labels = run_labels(paths)
    out = Path(output)
    try:
        (out / "plots").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot write the comparison to {out}: {e.strerror}") from None

    doc = Doc(title)
    doc.p(
        f"{len(runs)} runs. 'final' is the mean of each run's last 10 logged steps (half the steps of a shorter run); "
        "'mean accuracy' the mean of the training accuracy over every logged step (the area under its curve: "
        "how early it learned); wall time is the sum of "
        "step and evaluation times; tokens/s are means over steps; peak RSS is the trainer process's high-water mark."
    )
    doc.table(SUMMARY_HEADERS, [summary_row(label, run) for label, run in zip(labels, runs)])
    diffs = config_differences(runs)
    if diffs:
        doc.h2("Config differences")
        doc.table(["config key", *labels], [[f"`{key}`", *map(str, values)] for key, values in diffs])
    else:
        doc.p("The runs have the same config (apart from the run directory).")

    doc.h2("Curves")
    pairs = list(zip(labels, runs))
    for panel in panels_for(runs):
        path = save_panel(panel, pairs, out / "plots" / f"{panel.name}.png")
        if path:
            doc.image(path, panel.title)
    pattern = aha.compile_phrases()
    curves = [(label, aha.reflection_curve(run.samples(), pattern=pattern)) for label, run in pairs]
    aha_png = save_aha_curve(curves, out / "plots" / "aha_curve.png")
    if aha_png:
        doc.image(aha_png, "share of completions with reflection per step, and mean response length")

    (out / "compare.md").write_text(doc.markdown(out), encoding="utf-8")
    (out / "compare.html").write_text(doc.html(), encoding="utf-8")
    return out


def default_output(paths: list[Path]) -> Path:
    """``PARENT/compare`` when the runs share a parent directory, else ``./compare``."""
    parents = {p.resolve().parent for p in paths}
    return (parents.pop() if len(parents) == 1 else Path.cwd()) / "compare"
