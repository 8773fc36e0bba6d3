"""Scorer, worker pool, time limits, plugins, `rlvr reward` and the reward config."""

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.errors import UserError
from rlvr.rewards import REWARDS, RewardError, Scorer, get, match_many, score, verify
from rlvr.rewards.pool import WorkerPool

REPO = Path(__file__).resolve().parents[2]
R1 = "<think>2+3 is 5</think> <answer>\\boxed{5}</answer>"
HANG = "\\boxed{9^{9^{9^{9}}}}"  # sympy tries to evaluate the tower: minutes, not milliseconds

PLUGIN = """
import math, time

def length(completions, labels, **fields):
    return [len(c) / 10 for c in completions]

def flaky(completions, labels, **fields):
    if "bad" in completions:
        raise RuntimeError("boom")
    return [1.0] * len(completions)

def nan(completions, labels, **fields):
    return [math.nan for _ in completions]

def hang(completions, labels, **fields):
    out = []
    for c in completions:
        while c == "hang":
            pass
        out.append(1.0)
    return out

def wrong_length(completions, labels, **fields):
    return [1.0]

def uses_fields(completions, labels, question, **fields):
    return [float(q in c) for q, c in zip(question, completions)]
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture(autouse=True)
def default_pool():
    verify.configure(timeout_s=2.0, workers=2)
    yield


def test_scorer_weights_per_rule_and_errors(plugin, caplog):
    caplog.set_level(logging.WARNING, logger="rlvr.rewards.registry")
    res = score(
        ["accuracy", "format", "my_rewards:flaky", "my_rewards:nan"],
        [1.0, 0.5, 0.1, 2.0],
        [R1, "\\boxed{4}", "bad"],
        ["5", "5", "5"],
    )
    # item 0: 1*1 + 0.5*1 + 0.1*1 = 1.6; item 1: 0.1*1 = 0.1; item 2: flaky raised -> 0; nan -> 0 everywhere
    assert res.total == pytest.approx([1.6, 0.1, 0.0])
    assert res.per_rule["accuracy"] == [1.0, 0.0, 0.0]
    assert res.per_rule["format"] == [1.0, 0.0, 0.0]
    assert res.errors == {"accuracy": 0, "format": 0, "my_rewards:flaky": 1, "my_rewards:nan": 3}
    warnings = [r.getMessage() for r in caplog.records]
    assert len([w for w in warnings if "my_rewards:nan" in w]) == 1  # logged once, counted always
    assert any("boom" in w and "'bad'" in w for w in warnings)  # with the offending sample


def test_plugin_in_process_isolates_the_bad_item(plugin):
    res = Scorer(["my_rewards:flaky"], workers=0).score(["ok", "bad", "ok"], ["1", "1", "1"])
    assert res.per_rule["my_rewards:flaky"] == [1.0, 0.0, 1.0] and res.errors == {"my_rewards:flaky": 1}


def test_plugin_gets_fields_and_file_plugins_resolve_relative_paths(plugin, monkeypatch):
    monkeypatch.chdir(plugin)
    scorer = Scorer(["my_rewards.py:uses_fields", "my_rewards:length"], [1.0, 1.0], on_error="raise")
    res = scorer.score(["about cats", "dogs"], ["1", "2"], {"question": ["cats", "cows"]})
    assert res.per_rule["my_rewards.py:uses_fields"] == [1.0, 0.0]
    assert res.per_rule["my_rewards:length"] == [1.0, 0.4]


def test_on_error_raise_and_contract_violations(plugin):
    with pytest.raises(RewardError, match="boom"):
        Scorer(["my_rewards:flaky"], on_error="raise").score(["bad"], ["1"])
    with pytest.raises(UserError, match="returned 1 scores for 2 completions"):
        Scorer(["my_rewards:wrong_length"], workers=0).score(["a", "b"], ["1", "2"])


def test_hanging_plugin_costs_only_its_time_limit(plugin):
    scorer = Scorer(["my_rewards:hang"], timeout_s=0.5)
    scorer.score(["warm"], ["1"])  # pool started and plugin imported
    t0 = time.monotonic()
    res = scorer.score(["a", "hang", "b", "c"], ["1"] * 4)
    assert time.monotonic() - t0 < 0.5 + 1.0
    assert res.per_rule["my_rewards:hang"] == [1.0, 0.0, 1.0, 1.0] and res.errors == {"my_rewards:hang": 1}


def test_a_replacement_worker_runs_only_its_own_batchs_setup():
    # a shared pool: one scorer's slow plugin import must not slow another's worker replacements
    p = WorkerPool(1)
    try:
        assert p.run([("operator:add", (1, 2))], 5, setup=[("time:sleep", (2.0,))])[0].value == 3
        t0 = time.monotonic()
        out = p.run([("time:sleep", (5,)), ("operator:add", (1, 1))], timeout_s=0.3)  # the worker is replaced
        assert time.monotonic() - t0 < 1.5  # 0.3 s and a restart, not the other batch's 2 s import
        assert "timed out" in out[0].error and out[1].value == 2
    finally:
        p.close()


def test_pathological_sympy_input_costs_only_its_time_limit():
    scorer = Scorer(["accuracy"], timeout_s=1.0)
    scorer.score(["\\boxed{x^2+1}"], ["1+x^2"])  # pool started
    batch = [HANG, "\\boxed{\\frac{\\sqrt{2}}{2}}", "\\boxed{18}", "\\boxed{(1,2)}"]
    t0 = time.monotonic()
    res = scorer.score(batch, ["\\sqrt{5}", "\\frac{1}{\\sqrt{2}}", "18", "(1, 2)"])  # a symbolic gold: math-verify
    elapsed = time.monotonic() - t0
    assert 0.9 < elapsed < 1.0 + 1.0, elapsed
    assert res.per_rule["accuracy"] == [0.0, 1.0, 1.0, 1.0]
    assert res.errors == {"accuracy": 1}
    assert match_many([("x+1", "1+x")]) == [1.0]  # the pool recovered


def test_in_process_matches_pool():
    pairs = [
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
        ("\\sqrt{3}", "\\sqrt{2}"),
        ("18 dollars", "18"),
        ("", "1"),
    ]
    pooled = match_many(pairs)
    verify.configure(workers=0)
    assert match_many(pairs) == pooled == [1.0, 0.0, 1.0, 0.0]


def test_each_scorer_checks_with_its_own_settings(monkeypatch):
    def probe(completions, labels, **fields):  # an in-process rule reporting the verifier it runs under
        v = verify.active()
        return [v.timeout_s * 10 + v.workers] * len(completions)

    monkeypatch.setitem(REWARDS, "probe", probe)
    in_process = Scorer(["probe"], timeout_s=0.5, workers=0)
    pooled = Scorer(["probe"], timeout_s=3.0, workers=4)
    assert verify.active() == verify.Verifier(timeout_s=2.0, workers=2)  # creating scorers changed no default
    assert in_process.score(["a"], ["1"]).total == [5.0]  # not the later scorer's settings
    assert pooled.score(["a"], ["1"]).total == [34.0]
    assert probe(["a"], ["1"]) == [22.0]  # outside a scorer: the default


def test_truncated_score():
    scorer = Scorer(["accuracy"], truncated_score=0.0, workers=0)
    res = scorer.score(["\\boxed{5}", "\\boxed{5}"], ["5", "5"], truncated=[False, True])
    assert res.total == [1.0, 0.0] and res.per_rule["accuracy"] == [1.0, 1.0]  # raw scores stay for the logs


@pytest.mark.parametrize(
    "rules, weights, needle",
    [
        (["accuracy", "format"], [1.0], "1 reward weights for 2 rules (accuracy, format)"),
        ([], None, "no reward rules given"),
        (["format", "format"], None, "format listed twice"),
        (["acuracy"], None, "unknown reward 'acuracy'; did you mean 'accuracy'"),
        (["strict_fromat"], None, "did you mean 'strict_format'"),
    ],
)
def test_scorer_rejects_bad_rules(rules, weights, needle):
    with pytest.raises(UserError) as e:
        Scorer(rules, weights)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_unknown_rule_lists_known_ones():
    with pytest.raises(UserError, match="known: acc, acc_for_dapo, accuracy, accuracy_lenient"):
        get("nonsense")


def test_plugin_errors(tmp_path, monkeypatch):
    (tmp_path / "broken.py").write_text("import no_such_module_xyz\n")
    (tmp_path / "ok_rewards.py").write_text("def f(c, l, **k):\n    return [0.0] * len(c)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = [
        ("no_such_mod_xyz:f", "cannot import reward module 'no_such_mod_xyz'"),
        ("ok_rewards:nope", "reward plugin 'ok_rewards' has no function 'nope'"),
        (f"{tmp_path}/missing.py:f", "missing.py not found"),
        (f"{tmp_path}/broken.py:f", "broken.py failed to import: ModuleNotFoundError"),
    ]
    for name, needle in cases:
        with pytest.raises(UserError) as e:
            get(name)
        assert needle in str(e.value) and "\n" not in str(e.value)
    assert get(f"{tmp_path}/ok_rewards.py:f")(["a"], ["b"]) == [0.0]


def test_no_worker_process_outlives_its_parent():
    code = textwrap.dedent(
        """
        from rlvr.rewards import Scorer, verify
        Scorer(["accuracy"]).score(["\\\\boxed{x+1}"], ["1+x"])
        print(" ".join(map(str, verify.pool().pids)))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO, capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    time.sleep(0.2)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_import_without_torch():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        import rlvr.rewards as r
        assert r.get("accuracy")(["\\\\boxed{x^2+1}"], ["1+x^2"]) == [1.0]
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO)


# -- config -------------------------------------------------------------------------------------


def test_quickstart_reward_block_is_unchanged():
    r = load_config("quickstart").reward
    assert dict(zip(r.rules, r.weights)) == {"accuracy": 1.0, "accuracy_lenient": 0.5, "format_partial": 0.5}
    assert r.accuracy_rule == "accuracy"


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (
            ["reward.rules=[accuracy]"],
            "reward.weights has 3 entries but reward.rules has 1 (accuracy); "
            "give one weight per rule, e.g. reward.weights=[1.0]",
        ),
        (["reward.rules=[]", "reward.weights=[]"], "reward.rules is empty"),
        (["reward.rules=[format, format]", "reward.weights=[1, 1]"], "reward.rules lists format twice"),
        (["reward.on_error=ignore"], "reward.on_error=ignore: must be one of score, raise"),
        (["reward.workers=-1"], "reward.workers must be >= 0"),
        (["reward.timeout_s=0"], "reward.timeout_s must be > 0"),
    ],
)
def test_reward_config_errors(overrides, needle):
    with pytest.raises(UserError) as e:
        load_config("quickstart", overrides)
    assert needle in str(e.value)


# -- CLI ----------------------------------------------------------------------------------------


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_reward_score(tmp_path, capsys):
    src = _jsonl(
        tmp_path / "in.jsonl",
        [
            {"completion": R1, "label": "5", "id": 1},
            {"completion": "\\boxed{4}", "label": "#### 5"},
            {"completion": "<think>x</think><answer>\\boxed{\\frac{1}{2}}</answer>", "answer": "0.5"},
        ],
    )
    out = tmp_path / "out.jsonl"
    argv = [
        "reward",
        "score",
        "--rules",
        "accuracy,format",
        "--weights",
        "1,0.5",
        "--input",
        str(src),
        "--output",
        str(out),
    ]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["rewards"] for r in rows] == [
        {"accuracy": 1.0, "format": 1.0},
        {"accuracy": 0.0, "format": 0.0},
        {"accuracy": 1.0, "format": 1.0},
    ]
    assert [r["reward"] for r in rows] == [1.5, 0.0, 1.5] and rows[0]["id"] == 1
    printed = capsys.readouterr().out
    assert "3 completions" in printed and "accuracy" in printed and "0.6667" in printed and "slowest:" in printed


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "in.jsonl not found"),
        ('{"completion": "a", "label": "1"}\n{"completion": \n', "in.jsonl:2: not valid JSON"),
        (
            '{"completion": "a", "label": "1"}\n\n{"completion": "b"}\n',
            "in.jsonl:3: row has no 'label' (keys present: completion)",
        ),
        ('{"text": "b", "label": 1}\n', "in.jsonl:1: row has no 'completion'"),
        ("[1, 2]\n", "in.jsonl:1: expected a JSON object"),
        ("\n", "has no rows"),
    ],
)
def test_cli_reward_score_bad_input(tmp_path, capsys, content, needle):
    src = tmp_path / "in.jsonl"
    if content is not None:
        src.write_text(content)
    assert main(["reward", "score", "--rules", "format", "--input", str(src)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_cli_reward_score_bad_rules_and_weights(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", [{"completion": "a", "label": "1"}])
    assert main(["reward", "score", "--rules", "acuracy", "--input", str(src)]) == 2
    assert "did you mean 'accuracy'" in capsys.readouterr().err
    assert main(["reward", "score", "--rules", "accuracy,format", "--weights", "1,x", "--input", str(src)]) == 2
    assert "--weights 1,x: expected 2 comma-separated numbers" in capsys.readouterr().err


def test_cli_reward_check(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("reward:\n  rules: {accuracy: 1.0, format: 0.5}\n")  # a run from before lists
    _jsonl(
        run / "samples.jsonl",
        [
            {"step": 1, "answer": "5", "completion": R1, "reward": 1.5, "rewards": {"accuracy": 1.0, "format": 1.0}},
            {
                "step": 1,
                "answer": "18",
                "completion": "\\boxed{18 dollars}",
                "reward": 0.0,
                "rewards": {"accuracy": 0.0, "format": 0.0},
            },
        ],
    )
    assert main(["reward", "check", str(run)]) == 0
    out = capsys.readouterr().out
    assert "re-scored 2 samples" in out
    line = next(row for row in out.splitlines() if row.startswith("accuracy"))
    assert line.split()[1:] == ["0.5000", "1.0000", "1"]  # the unit-word fix changed one score
    assert "line 2: logged 0 now 1" in out
    assert main(["reward", "check", str(tmp_path)]) == 2
    assert "samples.jsonl not found" in capsys.readouterr().err


def test_cli_reward_list_and_rewards_shortcut(capsys):
    assert main(["reward", "list"]) == 0
    listed = capsys.readouterr().out
    assert main(["rewards"]) == 0
    assert capsys.readouterr().out == listed
    names = [line.split()[0] for line in listed.splitlines()]
    assert {"accuracy", "strict_format", "base_acc", "acc_for_dapo", "qwen_accuracy_reward"} <= set(names)
