"""The report's PNGs fit their content: every legend inside the figure, nothing cut at an edge,
no empty band under the last row. Rendered from a 40-step run written by the test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlvr import metric_names as M
from rlvr.analysis.plots import DPI, panels_for, save_aha_curve, save_overview, save_panel
from rlvr.analysis.run import load_run

STEPS = 40  # the quickstart's length: smoothing window 5, the longest legend label


def write_run(root: Path) -> Path:
    """metrics.jsonl with every key a panel plots, and evaluations before and after."""
    run = root / "run"
    (run / "eval").mkdir(parents=True)
    rows = []
    for s in range(1, STEPS + 1):
        learnt = 1 / (1 + math.exp(-(s - 12) / 2))  # a sigmoid: learns around step 12
        rows.append(
            {
                "step": s,
                M.REWARD_MEAN: 0.3 + 1.5 * learnt,
                M.ACCURACY: learnt,
                M.FORMAT_RATE: learnt,
                M.RESPONSE_LEN_MEAN: 27 - 8 * learnt,
                M.RESPONSE_LEN_MAX: 48 - 28 * learnt,
                M.TRUNCATED_FRAC: 0.1 * (1 - learnt),
                M.reward_mean("accuracy"): learnt,
                M.reward_mean("format_partial"): 0.2 + 0.8 * learnt,
                M.PG_LOSS: 0.05 * math.sin(s),
                M.LOSS: 0.05 * math.sin(s) + 0.001,
                M.KL: 0.001 * s,
                M.ENTROPY: 1.0 - 0.5 * learnt,
                M.CLIP_FRAC: 0.01,
                M.GRAD_NORM: 2.0 + math.cos(s),
                M.TIME_ROLLOUT_S: 1.0,
                M.TIME_UPDATE_S: 5.0,
                M.TIME_REFERENCE_S: 0.2,
                M.TIME_REWARD_S: 0.01,
                M.TIME_STEP_S: 6.5,
                M.GEN_TOKENS_PER_S: 600.0,
                M.PEAK_RSS_MIB: 5900.0 + s,
            }
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [
        {"step": 0, M.EVAL_ACCURACY: 0.0, M.EVAL_ACCURACY_LENIENT: 0.74, M.EVAL_FORMAT_RATE: 0.0},
        {"step": STEPS, M.EVAL_ACCURACY: 1.0, M.EVAL_ACCURACY_LENIENT: 1.0, M.EVAL_FORMAT_RATE: 1.0},
    ]
    (run / "eval" / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    return run


@pytest.fixture
def saved_figures(monkeypatch):
    """Every Figure that is saved, in order (the plots build a bare Figure and drop it)."""
    from matplotlib.figure import Figure

    saved, original = [], Figure.savefig

    def savefig(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def assert_fits(fig, png: Path) -> None:
    """Legends inside the figure, clear of every axis and of each other; the PNG's edges blank; at
    most 0.2 inch blank under the last thing drawn (the fixed margins left 0.4-0.6 inch)."""
    import numpy as np
    from matplotlib.image import imread

    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    legends = [(ax, ax.get_legend()) for ax in fig.axes if ax.get_legend() is not None and ax.get_visible()]
    assert legends, "no legend drawn"
    extents = []
    for ax, legend in legends:
        e = legend.get_window_extent(renderer)
        what = f"{png.name}: legend of {ax.get_title()!r}"
        assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, f"{what} leaves the figure"
        assert not overlaps(e, ax.xaxis.get_tightbbox(renderer)), f"{what} covers its x axis"
        for other in fig.axes:  # a legend under the top row must not run into the row below
            if other is not ax and other.get_visible() and other.bbox.bounds != ax.bbox.bounds:
                assert not overlaps(e, other.get_tightbbox(renderer)), f"{what} covers {other.get_title()!r}"
        extents.append(e)
    for i, a in enumerate(extents):
        assert not any(overlaps(a, b) for b in extents[i + 1 :]), f"{png.name}: two legends overlap"

    pixels = imread(png)[..., :3]  # [H, W, 3] floats in 0..1
    drawn = (pixels < 0.97).any(axis=2)  # [H, W]: not background white
    assert not drawn[[0, -1], :].any() and not drawn[:, [0, -1]].any(), f"{png.name}: something is cut at an edge"
    rows = drawn.any(axis=1)  # [H]
    blank_bottom = len(rows) - 1 - int(np.nonzero(rows)[0][-1])
    assert blank_bottom <= 0.2 * DPI, f"{png.name}: the bottom {blank_bottom} of {len(rows)} rows are empty"


def test_overview_legends_fit_and_no_empty_band(tmp_path, saved_figures):
    run = load_run(write_run(tmp_path))
    png = save_overview(run, tmp_path / "overview.png", "quickstart-AVX512-2026-11-26: training overview")
    assert png is not None and len(saved_figures) == 1
    assert_fits(saved_figures[0], png)


def test_every_panel_and_the_aha_curve_fit(tmp_path, saved_figures):
    run = load_run(write_run(tmp_path))
    panels = panels_for([run])
    assert {"accuracy", "step_time", "throughput", "reward_by_rule", "eval"} <= {p.name for p in panels}
    pngs = [save_panel(p, [(run.name, run)], tmp_path / f"{p.name}.png") for p in panels]
    curve = [{"step": s, "reflect_frac": 0.01 * s, "length_mean": 30.0 - s / 2} for s in range(1, STEPS + 1)]
    pngs.append(save_aha_curve([(run.name, curve)], tmp_path / "aha_curve.png"))
    assert None not in pngs and len(saved_figures) == len(pngs)
    for fig, png in zip(saved_figures, pngs):
        assert_fits(fig, png)


def _panel(runs, name):
    return next(p for p in panels_for([r for _, r in runs]) if p.name == name)


def _draw(runs, name):
    from rlvr.analysis.plots import _figure, draw_panel

    ax = _figure().add_subplot()
    assert draw_panel(ax, _panel(runs, name), runs)
    return ax


def test_eval_series_that_coincide_stay_visible(tmp_path):
    """Accuracy and format rate both 0 -> 1: each its own marker, size and line style, so one does not
    hide the other."""
    run = load_run(write_run(tmp_path))
    lines = [line for line in _draw([("run", run)], "eval").get_lines() if line.get_label() != "_nolegend_"]
    looks = {(line.get_marker(), line.get_markersize(), line.get_linestyle()) for line in lines}
    assert len(lines) >= 2 and len(looks) == len(lines)


def test_a_flat_clip_fraction_says_why(tmp_path):
    run = load_run(write_run(tmp_path))
    assert not _draw([("run", run)], "clip_fraction").texts  # 0.01 a step: nothing to explain
    for m in run.metrics:
        m[M.CLIP_FRAC] = 0.0
    (note,) = _draw([("run", run)], "clip_fraction").texts
    assert "algo.num_iterations=1" in note.get_text() and "ratio is exactly 1" in note.get_text()


def test_compare_legends_name_each_run_and_each_series_once(tmp_path):
    runs = [(f"run{i}", load_run(write_run(tmp_path / str(i)))) for i in range(3)]
    panel = _panel(runs, "step_time")
    labels = [t.get_text() for t in _draw(runs, "step_time").get_legend().get_texts()]
    assert len(panel.series) == 5 and len(labels) == 3 + 5 + 1  # not 3 x 5; the last says what is smoothed
    assert labels[:3] == ["run0", "run1", "run2"] and set(labels[3:8]) == {name for _, name in panel.series}
    assert labels[8].startswith("faint: per step")
