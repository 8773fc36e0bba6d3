"""Training-curve PNGs with matplotlib (headless: a bare ``Figure`` + Agg canvas, no pyplot state).

Every panel draws the raw per-step values faintly and a centred moving average over them. The same
panels serve one run (``rlvr report``) and
several overlaid runs (``rlvr compare``): one run colours by series; several runs colour by run
and tell series apart by line style.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlvr import metric_names as M
from rlvr.analysis.run import Run

DPI = 110
PAD_INCHES = 0.08  # blank around what is drawn in a saved PNG
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "v", "D"]
"""The evaluation panel's markers, one per series, each smaller than the last: accuracy and format
rate that both go 0 -> 1 would otherwise draw one line over the other."""


def smoothing_window(n: int) -> int:
    """Window of the centred moving average for a curve of ``n`` points: 1 (none) below 8 points,
    else about n/10, odd, at least 3 (5 for 50 steps, 21 for 200)."""
    if n < 8:
        return 1
    w = max(3, n // 10)
    return w + 1 - w % 2


def smooth(values: list[float], window: int) -> list[float]:
    """Centred moving average; the window shrinks symmetrically at the ends.

    Centred, unlike TensorBoard's EMA, so the smoothed curve does not lag the raw points.
    """
    h = window // 2
    out = []
    for i in range(len(values)):
        r = min(h, i, len(values) - 1 - i)
        part = values[i - r : i + r + 1]
        out.append(sum(part) / len(part))
    return out


@dataclass(frozen=True)
class Panel:
    """One plot: file stem, title, y-axis label, and (metric key, legend label) series."""

    name: str
    title: str
    ylabel: str
    series: tuple[tuple[str, str], ...]
    source: str = "train"  # train: metrics.jsonl per step; eval: RUN/eval (markers, no smoothing)
    ylim01: bool = False  # fractions: y axis 0..1


def panels_for(runs: list[Run]) -> list[Panel]:
    """The panels that have data in at least one of ``runs``, in report order."""
    keys: dict[str, None] = {}
    for run in runs:
        keys.update(dict.fromkeys(run.keys()))
    eval_keys: dict[str, None] = {}
    for run in runs:
        for r in run.evals:
            eval_keys.update({k: None for k, v in r.items() if k.startswith(M.EVAL) and isinstance(v, (int, float))})
    rule_keys = tuple((k, rule) for k in keys if (rule := M.rule_of_mean(k)) is not None)
    fractions = [
        k for k in eval_keys if k.split("/", 1)[1].startswith(("accuracy", "format_rate", "pass@", "maj@", "sample_"))
    ]
    candidates = [
        Panel(
            "reward",
            "Total reward per step",
            "reward (mean over the step's completions)",
            ((M.REWARD_MEAN, "total reward"),),
        ),
        Panel("reward_by_rule", "Reward by rule", "rule score (mean over completions)", rule_keys),
        Panel(
            "accuracy", "Training accuracy", "fraction of completions correct", ((M.ACCURACY, "accuracy"),), ylim01=True
        ),
        Panel(
            "format_rate",
            "Format rate",
            "fraction in the full R1 format",
            ((M.FORMAT_RATE, "format rate"),),
            ylim01=True,
        ),
        Panel(
            "response_length",
            "Response length",
            "response length (tokens)",
            ((M.RESPONSE_LEN_MEAN, "mean"), (M.RESPONSE_LEN_MAX, "max")),
        ),
        Panel(
            "truncated",
            "Truncated responses",
            "fraction cut at max_new_tokens",
            ((M.TRUNCATED_FRAC, "truncated"),),
            ylim01=True,
        ),
        Panel("kl", "KL divergence to the reference model", "KL (nats per token)", ((M.KL, "KL"),)),
        Panel(
            "policy_loss",
            "Policy loss",
            "loss (per token)",
            ((M.PG_LOSS, "policy-gradient loss"), (M.LOSS, "total loss")),
        ),
        Panel("entropy", "Policy entropy", "entropy (nats per token)", ((M.ENTROPY, "entropy"),)),
        Panel("clip_fraction", "PPO clip fraction", "fraction of tokens clipped", ((M.CLIP_FRAC, "clip fraction"),)),
        Panel("grad_norm", "Gradient norm", "global L2 norm before clipping", ((M.GRAD_NORM, "grad norm"),)),
        Panel(
            "code_sandbox",
            "Code in the sandbox per step",
            "completions / tests / seconds",
            (
                (M.CODE + "programs", "completions run"),
                (M.CODE + "timeouts", "tests timed out"),
                (M.CODE + "sandbox_errors", "sandbox errors"),
                (M.CODE + "exec_s", "seconds in the sandbox (summed)"),
            ),
        ),
        Panel(
            "throughput",
            "Throughput",
            "tokens per second",
            ((M.GEN_TOKENS_PER_S, "generation (rollout phase)"), (M.STEP_TOKENS_PER_S, "end to end (whole step)")),
        ),
        Panel(
            "step_time",
            "Time per step by phase",
            "seconds",
            (
                (M.TIME_STEP_S, "whole step"),
                (M.TIME_ROLLOUT_S, "rollout"),
                (M.TIME_UPDATE_S, "update"),
                (M.TIME_REFERENCE_S, "ref/old log-probs"),
                (M.TIME_REWARD_S, "rewards"),
            ),
        ),
        Panel(
            "memory",
            "Peak memory",
            "MiB (high-water mark so far)",
            ((M.PEAK_RSS_MIB, "process RSS"), (M.CUDA_MAX_ALLOCATED_MIB, "CUDA max allocated")),
        ),
        Panel(
            "eval",
            "Evaluation on held-out problems",
            "fraction of problems",
            tuple((k, k.removeprefix(M.EVAL)) for k in fractions),
            source="eval",
            ylim01=True,
        ),
    ]
    out = []
    for p in candidates:
        have = eval_keys if p.source == "eval" else keys
        series = tuple(s for s in p.series if s[0] in have)
        if (
            p.name == "policy_loss"
            and len(series) == 2
            and all(run.series(M.LOSS) == run.series(M.PG_LOSS) for run in runs)
        ):
            series = series[:1]  # no KL or entropy term: the total loss is the policy loss
        if series:
            out.append(Panel(p.name, p.title, p.ylabel, series, p.source, p.ylim01))
    return out


def _figure(width: float = 7.0, height: float = 4.4, **margins):
    """A bare Figure on an Agg canvas with fixed margins (room for the legend under the axes).

    Fixed margins instead of constrained layout: the layout solver doubled the time per PNG. The
    saved PNG is cut to what is drawn (:func:`_save`), so the margins only need to be large enough.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(**{"left": 0.11, "right": 0.97, "top": 0.92, "bottom": 0.28, **margins})
    return fig


def _save(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG cut to what is drawn: no empty band under the legends, and nothing
    cut at an edge (a wide tick label pushes the y label past the fixed left margin)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight", pad_inches=PAD_INCHES)
    return path


def _style_axes(ax, title: str, ylabel: str, xlabel: str = "training step") -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def draw_panel(ax, panel: Panel, runs: list[tuple[str, Run]]) -> int:
    """Draw ``panel`` for each (label, run) on ``ax``; returns the number of lines drawn."""
    from matplotlib.lines import Line2D

    colors = [f"C{i % 10}" for i in range(max(len(runs), len(panel.series)))]
    many = len(runs) > 1
    # several runs of several series: a legend entry per run (its colour) and per series (its line
    # style), not one per pair (3 runs of 5 series drew 15 entries)
    keyed = many and len(panel.series) > 1
    drawn, smoothed_any, w_used = 0, False, 1
    for ri, (label, run) in enumerate(runs):
        for si, (key, name) in enumerate(panel.series):
            xs, ys = run.eval_series(key) if panel.source == "eval" else run.series(key)
            if not xs:
                continue
            color = colors[ri] if many else colors[si]
            style = LINESTYLES[si % len(LINESTYLES)] if many or panel.source == "eval" else "-"
            text = "_nolegend_" if keyed else (label if many else name)
            if panel.source == "eval":
                marker, size = MARKERS[si % len(MARKERS)], max(3.0, 9.0 - 2.0 * si)
                ax.plot(xs, ys, marker=marker, markersize=size, linestyle=style, color=color, label=text)
            else:
                w = smoothing_window(len(xs))
                if w > 1:
                    ax.plot(xs, ys, color=color, alpha=0.3, linewidth=0.8, marker=".", markersize=3)
                    ax.plot(xs, smooth(ys, w), color=color, linestyle=style, linewidth=1.8, label=text)
                    smoothed_any, w_used = True, max(w_used, w)
                else:
                    ax.plot(xs, ys, color=color, linestyle=style, marker=".", label=text)
            drawn += 1
        if panel.name == "accuracy":  # held-out accuracy on the same axes, as markers
            xs, ys = run.eval_series(M.EVAL_ACCURACY)
            if xs:
                color = colors[ri] if many else "black"
                ax.plot(
                    xs,
                    ys,
                    "D",
                    color=color,
                    markersize=6,
                    label=f"{label}: eval accuracy" if many else "held-out eval",
                )
                drawn += 1
    if not drawn:
        return 0
    _style_axes(ax, panel.title, panel.ylabel)
    if panel.ylim01:
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(-0.02, lo), max(1.02, hi))
    if panel.name == "clip_fraction" and (why := _flat_clip_reason(runs)):
        box = {"facecolor": "white", "edgecolor": "none", "alpha": 0.9}
        ax.text(0.5, 0.78, why, transform=ax.transAxes, ha="center", va="center", fontsize=8, bbox=box)
    handles, labels = ax.get_legend_handles_labels()
    if keyed:
        for ri, (label, _) in enumerate(runs):
            handles.append(Line2D([], [], color=colors[ri], linewidth=1.8))
            labels.append(label)
        for si, (_, name) in enumerate(panel.series):
            handles.append(Line2D([], [], color="gray", linestyle=LINESTYLES[si % len(LINESTYLES)], linewidth=1.8))
            labels.append(name)
    if smoothed_any:
        handles.append(Line2D([], [], color="gray", alpha=0.4, marker=".", linewidth=0.8))
        labels.append(f"faint: per step; bold: {w_used}-step mean")
    _legend_below(ax, handles, labels)
    return drawn


def _flat_clip_reason(runs: list[tuple[str, Run]]) -> str | None:
    """Why the clip fraction is 0 at every step of every run, for the panel to say (None if it is not)."""
    values = [v for _, run in runs for v in run.series(M.CLIP_FRAC)[1]]
    if not values or any(v != 0 for v in values):
        return None
    iterations = {run.cfg("algo.num_iterations", 1) for _, run in runs}
    if iterations == {1}:
        return (
            "0 at every step: with algo.num_iterations=1 each update starts from the policy that sampled,\n"
            "so every token's ratio is exactly 1 and nothing is clipped (as expected, not a fault)"
        )
    return "0 at every step: no token's probability ratio left [1 - clip_low, 1 + clip_high]"


def _legend_below(ax, handles, labels) -> None:
    """Legend just under the x axis's label, so it never covers a curve, in as many columns (up to
    3) as fit the axes' width, so it never runs past the figure's edge or under the next panel."""
    renderer = ax.figure.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    below = ax.xaxis.get_tightbbox(renderer)  # tick labels and the axis label, as they will be drawn
    top = ((below.y0 if below is not None else box.y0) - 4 - box.y0) / box.height  # axes fraction, 4 px apart
    for ncol in range(min(3, len(labels)), 0, -1):
        legend = ax.legend(
            handles,
            labels,
            fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, top),
            ncol=ncol,
            frameon=False,
            borderaxespad=0.0,
        )
        if legend.get_window_extent(renderer).width <= box.width:
            return


def save_panel(panel: Panel, runs: list[tuple[str, Run]], path: Path) -> Path | None:
    """One PNG for ``panel``; None when no run has data for it."""
    fig = _figure()
    ax = fig.add_subplot()
    if not draw_panel(ax, panel, runs):
        return None
    return _save(fig, path)


def save_overview(run: Run, path: Path, title: str) -> Path | None:
    """A 2x2 summary: reward, accuracy (+ eval), response length, policy loss / KL."""
    panels = {p.name: p for p in panels_for([run])}
    chosen = [
        panels[n] for n in ("reward", "accuracy", "response_length", "kl", "policy_loss", "format_rate") if n in panels
    ][:4]
    if not chosen:
        return None
    fig = _figure(11, 8, left=0.07, right=0.98, top=0.92, bottom=0.13, hspace=0.45, wspace=0.2)
    axes = fig.subplots(2, 2).flatten()
    for ax, panel in zip(axes, chosen):
        draw_panel(ax, panel, [(run.name, run)])
    for ax in axes[len(chosen) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    return _save(fig, path)


def save_aha_curve(curves: list[tuple[str, list[dict]]], path: Path) -> Path | None:
    """Share of completions that reflect, per step, next to the mean response length (DeepSeek-R1's aha plot)."""
    curves = [(label, c) for label, c in curves if c]
    if not curves:
        return None
    fig = _figure(right=0.89)
    ax = fig.add_subplot()
    ax2 = ax.twinx()
    many = len(curves) > 1
    for i, (label, curve) in enumerate(curves):
        xs = [c["step"] for c in curve]
        color = f"C{i}" if many else "C3"
        frac = [100 * c["reflect_frac"] for c in curve]
        ax.plot(xs, frac, color=color, marker=".", label=(f"{label}: " if many else "") + "completions with reflection")
        lcolor = f"C{i}" if many else "C0"
        ax2.plot(
            xs,
            [c["length_mean"] for c in curve],
            color=lcolor,
            linestyle="--",
            alpha=0.8,
            label=(f"{label}: " if many else "") + "mean response length",
        )
    _style_axes(ax, "Reflection ('aha') rate and response length", "completions with a reflection phrase (%)")
    ax.set_ylim(bottom=0, top=max(5.0, ax.get_ylim()[1]))
    ax2.set_ylabel("mean response length (tokens)")
    ax2.set_ylim(bottom=0)
    ax.set_ylim(bottom=-0.02 * ax.get_ylim()[1])  # a flat 0 % line stays visible above the axis
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    _legend_below(ax, h1 + h2, l1 + l2)
    return _save(fig, path)
