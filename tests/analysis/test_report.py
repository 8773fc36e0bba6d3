"""Reports, aha finder, compare and sweep on synthetic run directories written by the test."""

from __future__ import annotations

import json
import sys
import types
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from rlvr.analysis import aha
from rlvr.analysis.compare import compare_runs, run_labels
from rlvr.analysis.plots import smooth, smoothing_window
from rlvr.analysis.report import build_report
from rlvr.analysis.run import load_run
from rlvr.cli import main
from rlvr.commands.sweep import Sweep, load_spec, parse_grid, run_sweep, split_values
from rlvr.config import load_config, to_yaml
from rlvr.errors import UserError
from rlvr.tracking import MetricsLogger
from rlvr.tracking import sinks as sinks_mod

PLANTED = "<think>3 + 5 = 9. Wait, let me check: 3 + 5 = 8.</think><answer>\\boxed{8}</answer>"


def sample(step, completion, acc, reward, answer="8"):
    return {
        "step": step,
        "question": "What is 3 + 5?",
        "answer": answer,
        "completion": completion,
        "reward": reward,
        "rewards": {"accuracy": acc, "format": 1.0},
        "advantage": 0.0,
        "length": len(completion) // 4,
        "truncated": False,
    }


def make_run(root: Path, name="run", *, steps=6, logged=None, overrides=(), complete=True, samples=True, evals=True):
    """A run directory as train() leaves it: config, metrics, samples, eval history, checkpoints."""
    run = root / name
    run.mkdir(parents=True)
    cfg = load_config(None, [f"run_dir={run}", f"train.steps={steps}", *overrides])
    (run / "config.yaml").write_text(to_yaml(cfg))
    logged = steps if logged is None else logged
    with (run / "metrics.jsonl").open("w") as f:
        for s in range(1, logged + 1):
            row = {
                "step": s,
                "rollout/reward_mean": 0.2 * s,
                "rollout/accuracy": min(1.0, 0.15 * s),
                "rollout/format_rate": 0.1 * s,
                "rollout/response_len_mean": 30 - s,
                "rollout/response_len_max": 64,
                "reward/accuracy_mean": 0.1 * s,
                "reward/format_mean": 0.05 * s,
                "train/loss": 0.1,
                "train/pg_loss": 0.1,
                "train/entropy": 1.0 / s,
                "train/clip_frac": 0.0,
                "train/grad_norm": 2.0,
                "train/lr": 1e-5,
                "time/rollout_s": 1.0,
                "time/update_s": 2.0,
                "time/step_s": 3.2,
                "perf/gen_tokens_per_s": 50.0,
                "perf/peak_rss_mib": 1000.0 + s,
            }
            f.write(json.dumps(row) + "\n")
    if samples:
        rows = []
        for s in range(1, logged + 1):
            rows += [sample(s, "<think>3 + 5 = 8</think><answer>8</answer>", 1.0, 1.5)] * 3
        rows += [
            # correct, reflected, but never changed its answer: ranks below the planted one
            sample(logged, "<think>3 + 5 = 8. Let me verify: 3 + 5 = 8.</think><answer>8</answer>", 1.0, 1.5),
            # many reflections, high reward, wrong: ranks below every correct one
            sample(
                logged,
                "<think>wait, let me double-check, verify... I made a mistake</think><answer>7</answer>",
                0.0,
                1.9,
            ),
            # a reflection phrase after </think> is not a reflection
            sample(logged, "<think>3 + 5 = 8</think> wait <answer>8</answer>", 1.0, 1.5),
            sample(2, "<think>3 + 5 = 7，等等，重新算：8</think><answer>8</answer>", 1.0, 1.5),
            sample(max(1, logged // 2), PLANTED, 1.0, 1.5),
        ]
        (run / "samples.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    if evals:
        (run / "eval").mkdir()
        hist = [{"step": 0, "eval/accuracy": 0.1, "eval/format_rate": 0.0, "eval/time_s": 2.0}]
        if complete:
            hist.append({"step": steps, "eval/accuracy": 0.8, "eval/format_rate": 0.9, "eval/time_s": 2.0})
        (run / "eval" / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hist))
    if complete:
        (run / "checkpoints" / f"step_{steps:06d}").mkdir(parents=True)
        (run / "checkpoints" / f"step_{steps:06d}" / "trainer_state.pt").write_bytes(b"x")
    return run


# -- aha finder --------------------------------------------------------------------------------


def test_aha_ranks_the_planted_self_correction_first(tmp_path):
    run = load_run(make_run(tmp_path))
    hits = aha.find_aha(run.samples())
    assert hits[0].row["completion"] in (PLANTED, "<think>3 + 5 = 7，等等，重新算：8</think><answer>8</answer>")
    top = [h for h in hits if h.tier == 1]
    assert {h.row["completion"] for h in top} == {
        PLANTED,
        "<think>3 + 5 = 7，等等，重新算：8</think><answer>8</answer>",
    }
    planted = next(h for h in hits if h.row["completion"] == PLANTED)
    assert (planted.before, planted.final, planted.changed_course) == ("9", "8", True)
    assert planted.highlighted().count("**") == 4  # "Wait" and "let me check"
    tiers = [h.tier for h in hits]
    assert tiers == sorted(tiers) and tiers[-1] == 3  # the wrong answer with 4 phrases ranks last
    assert not any(h.row["completion"].startswith("<think>3 + 5 = 8</think> wait") for h in hits)


def test_an_answer_that_restates_its_sum_did_not_change_course():
    # the final answer is the expression's last number, as the reasoning's: 8 before and after "Wait"
    row = sample(1, "<think>3 + 5 = 8. Wait, let me check.</think><answer>3 + 5 = 8</answer>", 1.0, 1.5)
    (hit,) = aha.find_aha([row])
    assert (hit.before, hit.final, hit.changed_course, hit.tier) == ("8", "8", False, 2)


def test_revisions_without_a_reflection_phrase_rank_the_corrected_ones_first():
    rows = [
        sample(1, "<think>3 + 5 = 8</think><answer>8</answer>", 1.0, 1.5),  # one result, the answer: not a revision
        sample(2, "<think>3 + 5 = 9</think><answer>9</answer>", 0.0, 0.5),  # wrong, but no revision
        sample(3, "<think>3 + 5 = 8, 3 + 5 = 9</think><answer>9</answer>", 0.0, 0.5),  # revised to wrong
        sample(4, "<think>3 + 5 = 8</think><answer>7</answer>", 0.0, 0.5),  # answer other than its result
        sample(5, "<think>3 + 5 = 9, so 3 + 5 = 8</think><answer>8</answer>", 1.0, 1.5),  # corrected
        sample(6, PLANTED, 1.0, 1.5),  # reflects in words: find_aha's, not a revision
        sample(7, "<think> 3 + 5 = 8</think><answer> 3 + 5 = 8 </answer>", 1.0, 1.5),  # an answer that restates its sum
    ]
    revs = aha.find_revisions(rows)
    assert [r.step for r in revs] == [5, 3, 4]
    assert (revs[0].results, revs[0].final, revs[0].corrected) == (["9", "8"], "8", True)
    assert not revs[1].corrected and not revs[2].correct
    assert "corrected: 9 , 8 -> 8" in aha.describe_revision(revs[0])


def test_a_wrong_verdict_says_when_the_gold_answer_lacked_its_tag():
    """'3 + 5 = 9, 3 + 5 = 8' with no <answer> or box: the last number is the gold, the accuracy rule
    read none, and the verdict says so instead of a bare 'wrong'."""
    (rev,) = aha.find_revisions([sample(1, "<think>3 + 5 = 9, 3 + 5 = 8</think>", 0.0, 0.0)])
    line = aha.describe_revision(rev)
    assert "wrong (the gold answer, but outside <answer> and \\boxed{}, where the accuracy rule reads it)" in line
    (boxed,) = aha.find_revisions([sample(1, "<think>3 + 5 = 8, 3 + 5 = 9</think><answer>9</answer>", 0.0, 0.5)])
    assert "wrong: 8 , 9 -> 9" in aha.describe_revision(boxed)  # plainly wrong: no excuse


def test_aha_shows_revisions_when_too_few_samples_reflect(tmp_path, capsys):
    run = make_run(tmp_path, samples=False)
    rows = [sample(1, "<think>3 + 5 = 8</think><answer>8</answer>", 1.0, 1.5)] * 4
    rows.append(sample(2, "<think>3 + 5 = 9, 3 + 5 = 8</think><answer>8</answer>", 1.0, 1.5))
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["aha", str(run), "--top", "3", "--output", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("0 of 5 completions reflect")
    assert "1 of 5 completions state more than one result" in out and "1 end right after" in out
    assert "r1  step 2  reward 1.500  corrected: 9 , 8 -> 8" in out


def test_aha_english_only_ranks_planted_first_and_curve(tmp_path):
    rows = load_run(make_run(tmp_path)).samples()
    english = aha.compile_phrases([p for p in aha.DEFAULT_PHRASES if p.isascii()])
    assert aha.find_aha(rows, pattern=english)[0].row["completion"] == PLANTED
    curve = aha.reflection_curve(rows)
    assert [c["step"] for c in curve] == [1, 2, 3, 4, 5, 6]
    assert curve[0]["reflect_frac"] == 0 and 0 < curve[-1]["reflect_frac"] < 1
    custom = aha.compile_phrases([], ["3 + 5 = 9"])
    assert [h.row["completion"] for h in aha.find_aha(rows, pattern=custom)] == [PLANTED]


# -- report ------------------------------------------------------------------------------------


def test_report_writes_every_file(tmp_path):
    out = build_report(make_run(tmp_path))
    assert out == tmp_path / "run" / "report"
    names = {p.name for p in (out / "plots").iterdir()}
    for name in [
        "overview",
        "reward",
        "reward_by_rule",
        "accuracy",
        "format_rate",
        "response_length",
        "policy_loss",
        "entropy",
        "clip_fraction",
        "grad_norm",
        "throughput",
        "step_time",
        "memory",
        "eval",
        "aha_curve",
    ]:
        assert f"{name}.png" in names
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "complete (6 steps)" in md and "before (step 0)" in md and "+0.700" in md
    assert "![Total reward per step](plots/reward.png)" in md
    assert "**Wait**" in md and "<mark>Wait</mark>" in html
    assert html.count("data:image/png;base64,") == len(names) and 'src="plots/' not in html
    assert "1006 MiB" in md  # peak RSS


def test_a_code_run_gets_its_sandbox_section_and_panel(tmp_path):
    run = make_run(tmp_path, overrides=["reward.rules=[code_tests_frac,code_tests]", "reward.weights=[1.0,0.5]"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.update({"code/programs": 32, "code/timeouts": 1, "code/sandbox_errors": 0, "code/exec_s": 3.5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = build_report(run)
    md = (out / "report.md").read_text().replace("\\_", "_")  # Markdown escapes the rules' underscores
    assert "## Code in the sandbox" in md and "code_tests_frac, code_tests ran 192 completions' code" in md
    assert "6 tests timed out, 0 runs where the sandbox itself failed, 21.0 s" in md
    assert (out / "plots" / "code_sandbox.png").is_file()
    assert "Code in the sandbox" not in (build_report(make_run(tmp_path, "plain")) / "report.md").read_text()


def test_an_async_run_gets_its_pipeline_section(tmp_path):
    """Issue 63: staleness, queue, overlap, waits and push time, means over the steps after the first."""
    run = make_run(tmp_path, overrides=["rollout.max_staleness=1"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        r.update({"async/staleness": float(i > 0), "async/queue_depth": 2.0, "async/overlap_frac": 0.5,
                  "time/wait_rollout_s": 0.5, "time/rollout_idle_s": 0.0, "time/weight_push_s": 0.02})  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = (build_report(run) / "report.md").read_text().replace("\\_", "_")
    assert "## Asynchronous rollouts" in md and "rollout.max_staleness=1" in md
    assert "| staleness (updates between sampler and trained weights) | 1.00 |" in md
    assert "| share of the rollout time hidden behind updates | 50% |" in md
    assert "Asynchronous rollouts" not in (build_report(make_run(tmp_path, "plain")) / "report.md").read_text()


def test_report_of_a_crashed_run_with_a_cut_last_line(tmp_path):
    run = make_run(tmp_path, steps=10, logged=4, complete=False)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "rollout/reward_me')  # the line being written when the process died
    with (run / "samples.jsonl").open("a") as f:
        f.write('{"step": 5, "compl')
    md = (build_report(run, tmp_path / "out") / "report.md").read_text()
    assert "incomplete: step 4 of 10" in md
    assert "| metric | before (step 0) |" in md  # only the before column


def test_report_of_a_run_that_has_only_started(tmp_path):
    run = tmp_path / "fresh"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(load_config(None, [])))
    md = (build_report(run) / "report.md").read_text()
    assert "No training step has been logged yet" in md


# -- compare -------------------------------------------------------------------------------------


def test_compare_overlays_runs_and_lists_config_differences(tmp_path):
    a = make_run(tmp_path / "sweep", "G=4", overrides=["rollout.samples_per_prompt=4"])
    b = make_run(tmp_path / "sweep", "G=8", steps=8)
    out = compare_runs([a, b], tmp_path / "cmp")
    md = (out / "compare.md").read_text()
    assert "| G=4 | 6/6 |" in md and "| G=8 | 8/8 |" in md
    # training accuracy 0.15 * step (capped at 1): its mean over the steps, and the first step at 0.5
    assert "| 0.525 | 4 |" in md and "| 0.644 | 4 |" in md
    assert "`rollout.samples_per_prompt` | 4 | 8 |" in md and "`train.steps` | 6 | 8 |" in md
    assert (out / "plots" / "reward.png").is_file() and (out / "plots" / "aha_curve.png").is_file()
    assert "data:image/png;base64," in (out / "compare.html").read_text()
    assert run_labels([Path("x/a/run"), Path("x/b/run")]) == ["a/run", "b/run"]


# -- sweep ----------------------------------------------------------------------------------------


def test_grid_parsing():
    assert split_values("[1.0,0.5],[1.0,1]") == ["[1.0,0.5]", "[1.0,1]"]
    assert parse_grid("rollout.samples_per_prompt=4,8") == ("rollout.samples_per_prompt", [4, 8])
    with pytest.raises(UserError, match="key=v1,v2"):
        parse_grid("rollout.samples_per_prompt")


def fake_trainer(calls):
    """A runner that records its call and leaves a complete run behind, as `rlvr train` would."""

    def run(base, overrides):
        calls.append(overrides)
        cfg = load_config(base, overrides)
        d = Path(cfg.run_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.yaml").write_text(to_yaml(cfg))
        (d / "metrics.jsonl").write_text(json.dumps({"step": cfg.train.steps, "rollout/reward_mean": 1.0}) + "\n")
        (d / "checkpoints" / f"step_{cfg.train.steps:06d}").mkdir(parents=True, exist_ok=True)
        (d / "checkpoints" / f"step_{cfg.train.steps:06d}" / "trainer_state.pt").write_bytes(b"x")
        return 0

    return run


def test_sweep_runs_the_grid_then_skips_done_runs_and_resumes_stopped_ones(tmp_path):
    sweep = Sweep(
        None,
        [("rollout.samples_per_prompt", [4, 8]), ("train.steps", [2])],
        repeat=2,
        sweep_dir=tmp_path / "sw",
        overrides=["train.lr=2e-5"],
    )
    names = [r.name for r in sweep.plan()]
    assert names == [
        "samples_per_prompt=4,steps=2,seed=0",
        "samples_per_prompt=4,steps=2,seed=1",
        "samples_per_prompt=8,steps=2,seed=0",
        "samples_per_prompt=8,steps=2,seed=1",
    ]
    calls = []
    runs, failed = run_sweep(sweep, runner=fake_trainer(calls), note=lambda s: None)
    assert len(calls) == 4 and not failed
    assert load_config(None, calls[2]).rollout.samples_per_prompt == 8 and load_config(None, calls[2]).train.lr == 2e-5
    calls.clear()
    run_sweep(sweep, runner=fake_trainer(calls), note=lambda s: None)
    assert calls == []  # everything done
    # one run stopped after a checkpoint (resumed), one before any (started again, leftovers gone)
    stopped, early = runs[0].run_dir, runs[1].run_dir
    (stopped / "checkpoints" / "step_000002").rename(stopped / "checkpoints" / "step_000001")
    import shutil

    shutil.rmtree(early / "checkpoints")
    run_sweep(sweep, runner=fake_trainer(calls), note=lambda s: None)
    assert [c[-1] for c in calls] == [f"resume={stopped}", f"run_dir={early}"]


def test_sweep_refuses_a_run_dir_holding_another_config(tmp_path):
    sweep = Sweep(None, [("train.steps", [2, 3])], sweep_dir=tmp_path / "sw")
    run_sweep(sweep, runner=fake_trainer([]), note=lambda s: None)
    other = Sweep(None, [("train.steps", [2, 3])], sweep_dir=tmp_path / "sw", overrides=["train.lr=3e-5"])
    with pytest.raises(UserError, match="train.lr"):
        run_sweep(other, runner=fake_trainer([]), note=lambda s: None)


def test_sweep_resumes_a_run_saved_before_a_config_key_was_added(tmp_path):
    """A config.yaml from an older rlvr lacks the keys added since; that run used their defaults."""
    import yaml

    sweep = Sweep(None, [("train.steps", [2])], sweep_dir=tmp_path / "sw")
    (run,) = [r.run_dir for r in run_sweep(sweep, runner=fake_trainer([]), note=lambda s: None)[0]]
    old = yaml.safe_load((run / "config.yaml").read_text())
    del old["offload"], old["rollout"]["engine"]
    (run / "config.yaml").write_text(yaml.safe_dump(old))
    (run / "checkpoints" / "step_000002").rename(run / "checkpoints" / "step_000001")
    calls = []
    run_sweep(sweep, runner=fake_trainer(calls), note=lambda s: None)
    assert calls[0][-1] == f"resume={run}"
    other = Sweep(None, [("train.steps", [2])], sweep_dir=tmp_path / "sw", overrides=["rollout.top_k=5"])
    (run / "config.yaml").write_text(yaml.safe_dump(old))
    with pytest.raises(UserError, match="rollout.top_k"):  # a key the old file has still counts
        run_sweep(other, runner=fake_trainer([]), note=lambda s: None)


def test_sweep_resumes_a_run_that_pinned_its_hub_names(tmp_path):
    """A run records Hub names at the commit it read (org/name@<commit>); the sweep names them without."""
    import yaml

    hub = ["data.task=files", "data.path=org/data:main,extra.jsonl"]
    sweep = Sweep(None, [("train.steps", [2])], sweep_dir=tmp_path / "sw", overrides=hub)
    (run,) = [r.run_dir for r in run_sweep(sweep, runner=fake_trainer([]), note=lambda s: None)[0]]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["data"]["path"] = "org/data:main@0123abc,extra.jsonl"
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    (run / "checkpoints" / "step_000002").rename(run / "checkpoints" / "step_000001")
    calls = []
    run_sweep(sweep, runner=fake_trainer(calls), note=lambda s: None)
    assert calls[0][-1] == f"resume={run}"
    other = Sweep(None, [("train.steps", [2])], sweep_dir=tmp_path / "sw", overrides=[hub[0], "data.path=org/other"])
    with pytest.raises(UserError, match="holds a run with data.path="):  # another data set still counts
        run_sweep(other, runner=fake_trainer([]), note=lambda s: None)


def test_sweep_failure_goes_on_with_the_next_run(tmp_path):
    sweep = Sweep(None, [("train.steps", [2, 3])], sweep_dir=tmp_path / "sw")
    seen = []
    _, failed = run_sweep(sweep, runner=lambda b, o: seen.append(o) or 1, note=lambda s: None)
    assert len(seen) == 2 and failed == ["steps=2", "steps=3"]


def test_ablation_specs_plan(tmp_path):
    for name, n in [("format_weight", 3), ("group_size", 2), ("steps", 2)]:
        spec = load_spec(name)
        sweep = Sweep(spec["base"], spec["grid"], spec["repeat"], tmp_path / name, spec["overrides"])
        assert len(sweep.plan()) == n


# -- sinks ------------------------------------------------------------------------------------


def test_a_broken_sink_warns_once_and_is_dropped(tmp_path):
    warnings = []
    logger = MetricsLogger(tmp_path, tensorboard=False, warn=warnings.append)

    class Broken:
        name, jsonl = "Broken", False

        def write(self, step, row):
            raise OSError("disk full")

        def close(self):
            raise OSError("still full")

    logger.sinks.append(Broken())
    for step in (1, 2, 3):
        logger.log(step, {"x": float(step)})
    logger.close()
    assert len(warnings) == 1 and "Broken logging failed (OSError: disk full)" in warnings[0]
    assert [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_wandb_sink_offline_with_a_stub_module(tmp_path, monkeypatch):
    logged = []
    fake = types.ModuleType("wandb")
    fake.__spec__ = ModuleSpec("wandb", None)
    fake.util = types.SimpleNamespace(generate_id=lambda: "abc123")
    fake.init = lambda **kw: (
        logged.append(("init", kw))
        or types.SimpleNamespace(
            log=lambda row, step: logged.append((step, row)), finish=lambda: logged.append("finish")
        )
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    (tmp_path / "config.yaml").write_text("train:\n  lr: 1.0e-5\n")
    logger = MetricsLogger(tmp_path, tensorboard=False, wandb=True)
    logger.tb.add_scalar("eval/accuracy", 0.5, 0)
    logger.log(1, {"rollout/reward_mean": 1.0})
    logger.close()
    init = logged[0][1]
    assert init["mode"] == "offline" and init["id"] == "abc123" and init["config"] == {"train": {"lr": 1e-5}}
    assert logged[1:] == [(0, {"eval/accuracy": 0.5}), (1, {"rollout/reward_mean": 1.0}), "finish"]
    assert (tmp_path / "wandb" / "run_id").read_text().strip() == "abc123"


def test_wandb_missing_is_a_one_line_error_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(sinks_mod, "wandb_available", lambda: False)
    with pytest.raises(UserError, match="pip install wandb"):
        MetricsLogger(tmp_path, wandb=True)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_smoothing_is_centred():
    assert smoothing_window(5) == 1 and smoothing_window(50) == 5
    assert smooth([0, 0, 3, 0, 0], 3) == [0, 1, 1, 1, 0]


# -- command line -------------------------------------------------------------------------------


def test_commands_write_their_files(tmp_path, capsys):
    run = make_run(tmp_path)
    assert main(["report", str(run), "--output", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.html").is_file()
    assert main(["aha", str(run), "--top", "2", "--output", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "#1  step 3" in out and "**Wait**" in out and (tmp_path / "a" / "aha_curve.png").is_file()
    assert main(["compare", str(run), str(make_run(tmp_path, "b")), "-o", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "compare.md").is_file()
    assert main(["sweep", "--grid", "train.steps=2,4", "--sweep-dir", str(tmp_path / "sw"), "--dry-run"]) == 0
    assert "new" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["report", "{tmp}/nope"], "no such run directory"),
        (["report", "{tmp}"], "not a run directory"),
        (["report", "{run}", "--top", "-1"], "--top -1"),
        (["aha", "{run}", "--no-default-phrases"], "needs at least one --phrase"),
        (["aha", "{bare}"], "has no samples.jsonl"),
        (["compare", "{tmp}/nope"], "no such run directory"),
        (["sweep", "--grid", "trian.lr=1,2", "--dry-run"], "did you mean 'train.lr'"),
        (["sweep", "--grid", "train.lr", "--dry-run"], "key=v1,v2"),
        (["sweep", "--dry-run"], "nothing to sweep"),
        (["sweep", "--spec", "no_such_ablation"], "not found"),
        (["sweep", "--grid", "train.steps=1,2", "--repeat", "0", "--dry-run"], "--repeat 0"),
        (["sweep", "--grid", "train.steps=1,2", "run_dir=x", "--dry-run"], "--sweep-dir"),
        (["sweep", "--grid", "rollout.samples_per_prompt=1,8", "--dry-run"], "samples_per_prompt must be >= 2"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path, capsys, argv, message):
    run = make_run(tmp_path)
    bare = make_run(tmp_path, "bare", samples=False)
    argv = [a.format(tmp=tmp_path, run=run, bare=bare) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err, err


def test_compare_of_a_glob_skips_folders_that_are_not_runs(tmp_path, capsys):
    from rlvr.cli import main

    a = make_run(tmp_path / "runs", "a")
    b = make_run(tmp_path / "runs", "b")
    (tmp_path / "runs" / "eval" / "arithmetic-1").mkdir(parents=True)  # what `rlvr eval` writes by default
    code = main(["compare", str(a), str(b), str(tmp_path / "runs" / "eval"), "--output", str(tmp_path / "cmp")])
    assert code == 0 and "skipping" in capsys.readouterr().out and (tmp_path / "cmp" / "compare.md").is_file()
    assert main(["compare", str(tmp_path / "runs" / "missing")]) == 2  # a mistyped run stays an error
