"""``rlvr report RUN``: plots, ``report.md`` and a self-contained ``report.html`` for one run.

Works on a finished run, one that is still writing, and one that crashed: it reads whatever
complete lines are on disk (see :mod:`rlvr.analysis.run`).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import yaml

from rlvr import metric_names as M
from rlvr.analysis import aha
from rlvr.analysis.document import Doc, Sample
from rlvr.analysis.plots import panels_for, save_aha_curve, save_overview, save_panel
from rlvr.analysis.run import Run, load_run
from rlvr.errors import UserError
from rlvr.run_dir import RunDir, step_of

# (dotted config key, label) shown in the config summary
CONFIG_ROWS = [
    ("model.path", "model"),
    ("data.task", "data"),
    ("data.path", "data file"),
    ("data.difficulty", "difficulty (built-in task)"),
    ("data.template", "prompt template"),
    ("data.assistant_prefix", "assistant prefix"),
    ("train.steps", "steps"),
    ("train.prompts_per_step", "P: prompts per step"),
    ("rollout.samples_per_prompt", "G: samples per prompt"),
    ("rollout.max_new_tokens", "max new tokens"),
    ("rollout.temperature", "temperature"),
    ("rollout.tools", "tools the model may call"),
    ("train.lr", "learning rate"),
    ("train.lr_schedule", "lr schedule"),
    ("algo.kl_coef", "KL coefficient"),
    ("algo.kl_estimator", "KL estimator"),
    ("algo.loss_agg", "loss aggregation"),
    ("algo.num_iterations", "updates per rollout batch"),
    ("algo.clip_low", "clip low"),
    ("algo.clip_high", "clip high"),
    ("model.device", "device"),
    ("seed", "seed"),
]

# (metric key, label, format) of the first-vs-last table
TREND_ROWS = [
    (M.REWARD_MEAN, "total reward", "{:.3f}"),
    (M.ACCURACY, "accuracy", "{:.3f}"),
    (M.FORMAT_RATE, "format rate", "{:.3f}"),
    (M.RESPONSE_LEN_MEAN, "response length (tokens)", "{:.1f}"),
    (M.TRUNCATED_FRAC, "truncated fraction", "{:.3f}"),
    (M.ENTROPY, "entropy (nats/token)", "{:.3f}"),
    (M.KL, "KL to reference", "{:.4f}"),
    (M.TOOL_CALLS_MEAN, "tool calls per completion", "{:.2f}"),
    (M.TOOL_ERROR_RATE, "tool error rate", "{:.3f}"),
    (M.ACCURACY_WITH_TOOL, "accuracy with a tool call", "{:.3f}"),
    (M.ACCURACY_WITHOUT_TOOL, "accuracy without a tool call", "{:.3f}"),
]


def _fmt(v, spec: str = "{:.3f}") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return spec.format(v)
    return str(v)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def window(n: int) -> int:
    """Steps averaged at each end of a first-vs-last comparison: 10, or fewer on short runs."""
    return max(1, min(10, n // 2))


def first_last(run: Run, key: str) -> tuple[float | None, float | None, int]:
    """(mean of the first k steps, mean of the last k steps, k)."""
    _, ys = run.series(key)
    k = window(len(ys))
    if not ys:
        return None, None, k
    return _mean(ys[:k]), _mean(ys[-k:]), k


def timings(run: Run) -> list[tuple[str, str]]:
    """(label, value) rows: steps done, training time, per-phase means, eval time, throughput, peak memory."""
    rows = []
    _, step_s = run.series(M.TIME_STEP_S)
    rows.append(("steps logged", f"{run.last_step}" + (f" of {run.total_steps}" if run.total_steps else "")))
    if step_s:
        total = sum(step_s)
        rows.append(("training time (sum of step times)", f"{total / 60:.1f} min"))
        rows.append(("time per step (mean)", f"{total / len(step_s):.1f} s"))
    for key, label in [
        (M.TIME_ROLLOUT_S, "rollout"),
        (M.TIME_REWARD_S, "rewards"),
        (M.TIME_REFERENCE_S, "ref/old log-probs"),
        (M.TIME_UPDATE_S, "update"),
    ]:
        _, ys = run.series(key)
        if ys:
            rows.append((f"{label} phase (mean per step)", f"{_mean(ys):.2f} s"))
    _, ev = run.eval_series(M.EVAL_TIME_S)
    if ev:
        rows.append(("evaluation time (all evaluations)", f"{sum(ev):.1f} s"))
    for key, label in [
        (M.GEN_TOKENS_PER_S, "generation throughput (mean)"),
        (M.STEP_TOKENS_PER_S, "end-to-end throughput (mean)"),
    ]:
        _, ys = run.series(key)
        if ys:
            rows.append((label, f"{_mean(ys):.1f} tokens/s"))
    for key, label in [
        (M.PEAK_RSS_MIB, "peak memory, process RSS"),
        (M.CUDA_MAX_ALLOCATED_MIB, "peak memory, CUDA allocated"),
    ]:
        _, ys = run.series(key)
        rows.append((label, f"{max(ys):.0f} MiB" if ys else "n/a (not logged by this run)"))
    return rows


def eval_table(run: Run) -> tuple[list[str], list[list]] | None:
    """Before/after rows: metric, first eval, last eval, change."""
    if not run.evals:
        return None
    first, last = run.evals[0], run.evals[-1]
    keys = [k for k in first if k.startswith(M.EVAL) and k != M.EVAL_TIME_S]
    keys += [k for k in last if k.startswith(M.EVAL) and k != M.EVAL_TIME_S and k not in keys]
    headers = ["metric", f"before (step {first['step']})", f"after (step {last['step']})", "change"]
    rows = []
    for k in keys:
        a, b = first.get(k), last.get(k)
        spec = "{:.1f}" if k.endswith("_len_mean") else "{:.3f}"
        change = spec.format(b - a) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else ""
        if change and not change.startswith("-"):
            change = "+" + change
        rows.append([k.removeprefix(M.EVAL), _fmt(a, spec), _fmt(b, spec), change])
    if len(run.evals) == 1:
        headers, rows = headers[:2], [r[:2] for r in rows]
    return headers, rows


def config_rows(run: Run) -> list[list[str]]:
    """(label, `key`, value) rows of the settings a reader of the report wants first."""
    rows = []
    for key, label in CONFIG_ROWS:
        v = run.cfg(key)
        if v is None or v == "" or v == []:
            continue
        rows.append([label, f"`{key}`", str(v)])
        if key == "rollout.samples_per_prompt" and run.reward_rules():
            text = " + ".join(f"{w} × {r}" if w is not None else r for r, w in run.reward_rules())
            rows.append(["total reward", "`reward.rules`, `reward.weights`", text])
    return rows


def accuracy_rule(run: Run) -> str:
    """The reward rule that says whether a sample is right (``reward.accuracy_rule``)."""
    return run.cfg("reward.accuracy_rule", "accuracy") or "accuracy"


def aha_hits(run: Run, *, pattern=None, rows: list[dict] | None = None) -> tuple[list[aha.AhaHit], list[dict], int]:
    """(ranked hits, per-step reflection curve, number of samples scanned) of ``rows`` (default: the run's samples)."""
    rows = run.samples() if rows is None else rows
    pattern = pattern or aha.compile_phrases()
    return (
        aha.find_aha(rows, pattern=pattern, accuracy_rule=accuracy_rule(run)),
        aha.reflection_curve(rows, pattern=pattern),
        len(rows),
    )


def tool_samples(run: Run, result_syntax: str, top: int = 2) -> list[Sample]:
    """Up to ``top`` logged completions with a tool call from the last step that has one, best reward
    first, each tool result highlighted (``result_syntax``: the run's ``rollout.tool_result``)."""
    rows = [r for r in run.samples() if r.get("tool_calls")]
    if not rows:
        return []
    last = max(r.get("step", 0) for r in rows)
    ranked = sorted((r for r in rows if r.get("step", 0) == last), key=lambda r: -float(r.get("reward") or 0))
    best, seen = [], set()
    for r in ranked:  # distinct completions (a group's samples often agree)
        if str(r.get("completion")) not in seen and len(best) < top:
            seen.add(str(r.get("completion")))
            best.append(r)
    opening, _, closing = result_syntax.partition("{output}")
    out = []
    for r in best:
        text, spans, at = str(r.get("completion", "")), [], 0
        while (start := text.find(opening, at)) >= 0:
            end = text.find(closing, start + len(opening)) if closing else -1
            at = len(text) if end < 0 else end + len(closing)
            spans.append((start, at))
        header = f"step {last}, reward {_fmt(r.get('reward'))}, {r['tool_calls']} tool call(s)"
        out.append(Sample(header, str(r.get("question", "")), text, spans))
    return out


FEEDBACK_OPENINGS = ("Your code failed a test:", "I found no code")
"""How code feedback turns open (:func:`rlvr.environments.feedback_text`): highlighted in episode samples."""


def episode_samples(run: Run, top: int = 2) -> list[Sample]:
    """Up to ``top`` logged episodes of more than one turn from the last step that has one, best reward
    first, each code feedback turn highlighted (to the end of its sentence asking for the program again)."""
    rows = [r for r in run.samples() if (r.get("turns") or 1) > 1]
    if not rows:
        return []
    last = max(r.get("step", 0) for r in rows)
    ranked = sorted((r for r in rows if r.get("step", 0) == last), key=lambda r: -float(r.get("reward") or 0))
    out, seen = [], set()
    for r in ranked:
        text = str(r.get("completion", ""))
        if text in seen or len(out) >= top:
            continue
        seen.add(text)
        spans = []
        for opening in FEEDBACK_OPENINGS:
            at = 0
            while (start := text.find(opening, at)) >= 0:
                end = text.find("fenced block.", start)
                at = len(text) if end < 0 else end + len("fenced block.")
                spans.append((start, at))
        header = f"step {last}, reward {_fmt(r.get('reward'))}, {r['turns']} turns"
        out.append(Sample(header, str(r.get("question", "")), text, sorted(spans)))
    return out


def aha_sample(hit: aha.AhaHit) -> Sample:
    return Sample(aha.describe(hit), str(hit.row.get("question", "")), str(hit.row.get("completion", "")), hit.spans)


def build_report(run_dir: str | Path, output: str | Path | None = None, *, top: int = 3) -> Path:
    """Write ``OUTPUT/report.md``, ``OUTPUT/report.html`` and ``OUTPUT/plots/*.png``; returns OUTPUT.

    Args:
        run_dir: the run directory.
        output: where to write (default ``RUN/report``).
        top: how many aha-moment samples to include.
    """
    run = load_run(run_dir)
    out = Path(output) if output is not None else run.path / "report"
    try:
        (out / "plots").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot write the report to {out}: {e.strerror}") from None
    plots = out / "plots"

    doc = Doc(f"Run report: {run.name}")
    doc.p(
        f"Run directory: {run.path.resolve()}. Status: {run.status()}. "
        f"Generated {_dt.datetime.now().isoformat(timespec='seconds')} by `rlvr report`."
    )
    if not run.metrics:
        doc.p("No training step has been logged yet (metrics.jsonl is missing or empty).")

    # -- results ------------------------------------------------------------------------------
    trend = []
    for key, label, spec in TREND_ROWS:
        a, b, k = first_last(run, key)
        if a is not None:
            trend.append([label, _fmt(a, spec), _fmt(b, spec)])
    if trend:
        k = window(len(run.metrics))
        n = run.last_step
        doc.h2("Training curves: start vs end")
        doc.table(["metric", f"mean of the first {k} steps", f"mean of the last {k} steps (to step {n})"], trend)

    doc.h2("Evaluation before / after")
    table = eval_table(run)
    if table:
        doc.table(*table)
        if len(run.evals) > 2:
            doc.p("Evaluated at steps " + ", ".join(str(r["step"]) for r in run.evals) + " (curve below).")
    else:
        doc.p("No evaluation in this run (RUN/eval/ is missing); run `rlvr eval --model RUN` to evaluate it.")

    doc.h2("Config")
    doc.table(["setting", "config key", "value"], config_rows(run))
    doc.p(f"The full resolved config is {run.path / 'config.yaml'}.")
    for line in resume_lines(run.path):
        doc.p(line)

    doc.h2("Time and memory")
    doc.table(["", "value"], [list(r) for r in timings(run)])

    # -- plots ----------------------------------------------------------------------------------
    doc.h2("Plots")
    overview = save_overview(run, plots / "overview.png", f"{run.name}: training overview")
    if overview:
        doc.image(overview, "training overview: reward, accuracy, response length, loss")
    for panel in panels_for([run]):
        path = save_panel(panel, [(run.name, run)], plots / f"{panel.name}.png")
        if path:
            doc.image(path, panel.title)

    # -- tool use -------------------------------------------------------------------------------
    if run.cfg("rollout.tools"):
        doc.h2("Tool use")
        doc.p(
            f"Tools: {', '.join(map(str, run.cfg('rollout.tools')))}; the results are appended to the response "
            "(not trained on). Tool calls per completion, their error rate and the accuracy with and without a "
            "call are in the tables above (rollout/tool_* and eval/tool_*). The best-rewarded completions with a "
            "call from the last logged step, results highlighted:"
        )
        for sample in tool_samples(run, str(run.cfg("rollout.tool_result") or "<result>{output}</result>")):
            doc.sample(sample)

    # -- code -----------------------------------------------------------------------------------
    steps, programs = run.series("code/programs")
    if programs:
        timeouts, errors, seconds = (sum(run.series(f"code/{k}")[1]) for k in ("timeouts", "sandbox_errors", "exec_s"))
        rules = ", ".join(r for r, _ in run.reward_rules() if r.startswith("code_tests")) or "the code rules"
        doc.h2("Code in the sandbox")
        doc.p(
            f"{rules} ran {int(sum(programs))} completions' code in "
            f"the sandbox ({run.cfg('reward.sandbox', 'bwrap')}) over {len(steps)} steps: {int(timeouts)} tests timed "
            f"out, {int(errors)} runs where the sandbox itself failed, {seconds:.1f} s in the sandbox in all "
            "(summed over completions, which run side by side). The pass rate is reward/code_tests_mean above; "
            "docs/code-and-environments.md says what the sandbox isolates."
        )

    # -- multi-turn episodes --------------------------------------------------------------------
    steps, turns = run.series(M.TURNS_MEAN)
    if turns:
        doc.h2("Episodes")
        doc.p(
            f"Each completion was an episode of up to {run.cfg('rollout.max_turns', 1)} model turns "
            f"({run.cfg('rollout.environment') or 'code with execution feedback'}): turns per episode went from "
            f"{turns[0]:.2f} (step {steps[0]}) to {turns[-1]:.2f} (step {steps[-1]}). The environment's turns are "
            "attended to, not trained on. The best-rewarded episodes of several turns from the last logged step, "
            "feedback highlighted:"
        )
        for sample in episode_samples(run):
            doc.sample(sample)

    # -- asynchronous rollouts ------------------------------------------------------------------
    async_rows = async_table(run)
    if async_rows:
        doc.h2("Asynchronous rollouts")
        doc.p(
            f"{run.cfg('distributed.rollout_workers', 1)} rollout worker(s) apart from the trainers, "
            f"rollout.max_staleness={run.cfg('rollout.max_staleness', 0)}: each step trained on a rollout sampled "
            "with weights that many updates older (staleness), made while the trainers updated; the trainers "
            "waited only for what was not ready. Means over the steps after the first (which fills the pipeline):"
        )
        doc.table(["", "value"], async_rows)

    # -- aha moments ----------------------------------------------------------------------------
    doc.h2("Aha moments")
    hits, curve, scanned = aha_hits(run)
    curve_png = save_aha_curve([(run.name, curve)], plots / "aha_curve.png")
    if not scanned:
        doc.p("No samples.jsonl in this run (log.samples_every=0), so there is nothing to scan.")
    else:
        correct_turns = sum(h.tier == 1 for h in hits)
        doc.p(
            f"{len(hits)} of {scanned} logged completions reflect (a phrase such as 'wait', 'let me check', "
            f"'verify' inside <think>); {correct_turns} of them are correct and changed their answer after "
            f"reflecting. `rlvr aha RUN --top N` lists them."
        )
        if curve_png:
            doc.image(curve_png, "share of completions with reflection per step, and mean response length")
        for hit in hits[:top]:
            doc.sample(aha_sample(hit))

    (out / "report.md").write_text(doc.markdown(out), encoding="utf-8")
    (out / "report.html").write_text(doc.html(), encoding="utf-8")
    return out


ASYNC_ROWS = (
    (M.ASYNC_STALENESS, "staleness (updates between sampler and trained weights)", "{:.2f}"),
    (M.ASYNC_QUEUE_DEPTH, "rollouts made or under way, not yet trained", "{:.2f}"),
    (M.ASYNC_OVERLAP_FRAC, "share of the rollout time hidden behind updates", "{:.0%}"),
    (M.TIME_WAIT_ROLLOUT_S, "trainers' wait for the rollout, s/step", "{:.2f}"),
    (M.TIME_ROLLOUT_IDLE_S, "rollout worker idle, s/step", "{:.2f}"),
    (M.TIME_WEIGHT_PUSH_S, "weight push (put + load), s", "{:.3f}"),
    (M.TIME_ROLLOUT_S, "rollout (on the rollout worker), s/step", "{:.2f}"),
    (M.TIME_UPDATE_S, "update (on the trainers), s/step", "{:.2f}"),
    (M.TIME_STEP_S, "step (the pipeline's), s", "{:.2f}"),
)


def async_table(run) -> list[list[str]]:
    """The asynchronous-rollout metrics' means over the steps after the first; empty for a run without them."""
    rows = []
    for key, label, spec in ASYNC_ROWS:
        _, values = run.series(key)
        if key == M.ASYNC_STALENESS and not values:
            return []
        if values:
            later = values[1:] or values
            rows.append([label, spec.format(sum(later) / len(later))])
    return rows


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_lines(path: Path) -> list[str]:
    """One line per resumed segment: the step it continued from, its config file, and the keys it
    changed from the segment before (the config table above is the last segment's)."""
    run = RunDir(path)
    before = yaml.safe_load(run.config_file.read_text(encoding="utf-8")) if run.config_file.is_file() else None
    lines = []
    for seg in run.resume_config_files():
        try:
            now = yaml.safe_load(seg.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            now = None
        changed = "unreadable"
        if isinstance(now, dict) and isinstance(before, dict):
            old, new = _flat(before), _flat(now)
            diffs = [
                f"{k} {old.get(k)!r} -> {new[k]!r}"
                for k in new
                if k not in ("resume", "run_dir") and old.get(k) != new[k]
            ]
            changed = ", ".join(diffs) or "no settings changed"
        lines.append(f"Resumed after step {step_of(seg.with_suffix(''))} with {seg}: {changed}.")
        before = now
    return lines
