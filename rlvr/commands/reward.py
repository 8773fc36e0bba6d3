"""`rlvr reward list | score | check`: inspect the reward rules and score completions offline."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rlvr.errors import UserError
from rlvr.run_dir import RunDir

EXAMPLES = """examples:
  rlvr reward list
  rlvr reward score --rules accuracy,format --input examples/completions.jsonl --output scored.jsonl
  rlvr reward score --rules accuracy,format --weights 1,0.5 --input examples/completions.jsonl
  rlvr reward score --rules accuracy,accuracy_lenient --input tests/rewards/numeric_answers.jsonl
                                                    # rows with "expected": a verdict each, exit 1 on any miss
  rlvr reward score --rules my_rewards.py:length_penalty,accuracy --input examples/completions.jsonl
  rlvr reward check runs/quickstart                 # re-score samples.jsonl with today's rules
  rlvr reward check runs/quickstart --rules accuracy,strict_format
"""


def cmd_list(args) -> int:
    from rlvr.rewards import REWARDS

    for name, fn in REWARDS.items():
        doc = (fn.__doc__ or "").strip().splitlines()
        print(f"{name:22s} {doc[0] if doc else ''}")
    return 0


def _csv(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def _weights(text: str | None, n: int) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(w) for w in _csv(text)]
    except ValueError:
        raise UserError(
            f"--weights {text}: expected {n} comma-separated numbers, e.g. --weights {','.join(['1'] * n)}"
        ) from None


def read_rows(path: Path, label_keys: tuple[str, ...] = ("label", "answer")) -> list[dict]:
    """JSONL rows, each with 'completion' and a label (first of ``label_keys`` present, stored as
    'label'), plus '_line', the line number."""
    if not path.is_file():
        raise UserError(
            f'input file {path} not found; give a JSONL file with one {{"completion": ..., "label": ...}} per line'
        )
    from rlvr.data.files import read_jsonl_values

    rows = []
    for n, row in read_jsonl_values(path):
        if not isinstance(row, dict):
            raise UserError(
                f"{path}:{n}: expected a JSON object with 'completion' and 'label', got {type(row).__name__}"
            )
        label_key = next((k for k in label_keys if k in row), None)
        if "completion" not in row or label_key is None:
            missing = "completion" if "completion" not in row else "label"
            raise UserError(
                f"{path}:{n}: row has no '{missing}' (keys present: {', '.join(row) or 'none'}); "
                "each line needs 'completion' and 'label'"
            )
        if not isinstance(row["completion"], str):
            raise UserError(f"{path}:{n}: 'completion' must be a string, got {type(row['completion']).__name__}")
        row["label"] = row.pop(label_key)
        row["_line"] = n
        rows.append(row)
    if not rows:
        raise UserError(f'{path} has no rows; give a JSONL file with one {{"completion": ..., "label": ...}} per line')
    return rows


def _scorer(rules: list[str], weights: list[float] | None, args):
    from rlvr.rewards import Scorer

    return Scorer(rules, weights, timeout_s=args.timeout, workers=args.workers)


def _score_rows(scorer, rows: list[dict]) -> tuple[list, list[float]]:
    """Scores each row on its own (so the time per row is known); returns results and seconds."""
    results, seconds = [], []
    for row in rows:
        fields = {k: [v] for k, v in row.items() if k not in ("completion", "label", "rewards", "reward", "_line")}
        t0 = time.perf_counter()
        results.append(scorer.score([row["completion"]], [row["label"]], fields))
        seconds.append(time.perf_counter() - t0)
    return results, seconds


def _summary(scorer, results, seconds, rows, slowest: int) -> None:
    n = len(results)
    print(f"{n} completions, {sum(seconds):.2f} s ({n / max(sum(seconds), 1e-9):.0f} per s)")
    print(f"{'rule':24s} {'weight':>7s} {'mean':>8s} {'errors':>7s}")
    for name, w in zip(scorer.rules, scorer.weights):
        mean = sum(r.per_rule[name][0] for r in results) / n
        errs = sum(r.errors[name] for r in results)
        print(f"{name:24s} {w:7g} {mean:8.4f} {errs:7d}")
    print(f"{'total':24s} {'':7s} {sum(r.total[0] for r in results) / n:8.4f}")
    order = sorted(range(n), key=lambda i: -seconds[i])[:slowest]
    if order:
        print("slowest:")
        for i in order:
            print(f"  line {rows[i]['_line']}: {seconds[i] * 1000:.1f} ms  {rows[i]['completion'][-60:]!r}")


def cmd_score(args) -> int:
    path = Path(args.input)
    rows = read_rows(path)
    rules = _csv(args.rules)
    scorer = _scorer(rules, _weights(args.weights, len(rules)), args)
    results, seconds = _score_rows(scorer, rows)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            for row, res in zip(rows, results):
                out = {k: v for k, v in row.items() if k != "_line"}
                out["rewards"] = {name: v[0] for name, v in res.per_rule.items()}
                out["reward"] = res.total[0]
                f.write(json.dumps(out, ensure_ascii=False) + "\n")
        print(f"wrote {len(rows)} scored lines to {args.output}")
    _summary(scorer, results, seconds, rows, args.slowest)
    return _verdicts(scorer, results, rows) if any("expected" in r for r in rows) else 0


def _expected(row: dict, rule: str) -> float | None:
    want = row.get("expected")
    if isinstance(want, dict):
        want = want.get(rule)
    if want is None:
        return None
    if isinstance(want, bool) or not isinstance(want, (int, float)):
        raise UserError(f"line {row['_line']}: 'expected' must be a number or {{rule: number}}, got {want!r}")
    return float(want)


def _verdicts(scorer, results, rows: list[dict]) -> int:
    """One line per row that carries ``expected`` (a score, or one per rule): its scores beside what
    was expected; exit 1 when any differs, so a grading table can be checked from the shell."""
    from rlvr.rewards import extract_answer

    bad = checked = 0
    print("verdicts (rows with 'expected'):")
    for row, res in zip(rows, results):
        want = {name: _expected(row, name) for name in scorer.rules}
        if all(w is None for w in want.values()):
            continue
        checked += 1
        got = {name: res.per_rule[name][0] for name in scorer.rules}
        ok = all(w is None or got[n] == w for n, w in want.items())
        bad += not ok
        scores = "  ".join(
            f"{n}={got[n]:g}" + ("" if want[n] is None or got[n] == want[n] else f" (expected {want[n]:g})")
            for n in scorer.rules
        )
        what = f"[{row['class']}] " if "class" in row else ""
        answer = extract_answer(row["completion"], fallback_last_number=True)
        print(
            f"  line {row['_line']:>3}  {'ok ' if ok else 'BAD'}  {scores}  "
            f"{what}answer {answer!r} gold {str(row['label'])[-40:]!r}"
        )
    print(f"{checked - bad} of {checked} rows as expected")
    return 1 if bad else 0


def _run_rules(run: RunDir) -> tuple[list[str], list[float]]:
    config = run.read_config()
    if config is None:
        raise UserError(f"{run.config_file} could not be read as YAML; pass --rules")
    reward = config.get("reward") or {}
    rules = reward.get("rules") or ["accuracy", "format"]
    if isinstance(rules, dict):  # runs from before reward.rules became a list
        return list(rules), [float(w) for w in rules.values()]
    return list(rules), [float(w) for w in reward.get("weights") or [1.0] * len(rules)]


def cmd_check(args) -> int:
    run = RunDir(Path(args.run))
    samples = run.samples_file
    if not samples.is_file():
        raise UserError(f"{samples} not found; give a run directory written with log.samples_every > 0")
    rows = read_rows(samples)
    if args.rules:
        rules = _csv(args.rules)
        weights = _weights(args.weights, len(rules))
    else:
        if not run.config_file.is_file():
            raise UserError(f"{run.config_file} not found; pass --rules, or give a run directory")
        rules, weights = _run_rules(run)
    scorer = _scorer(rules, weights, args)
    results, seconds = _score_rows(scorer, rows)
    print(f"re-scored {len(rows)} samples of {run.path} with rules {', '.join(rules)}")
    print(f"{'rule':24s} {'logged':>8s} {'now':>8s} {'changed':>8s}")
    for name in rules:
        old = [row.get("rewards", {}).get(name) for row in rows]
        new = [r.per_rule[name][0] for r in results]
        have = [i for i, o in enumerate(old) if o is not None]
        changed = [i for i in have if abs(old[i] - new[i]) > 1e-9]
        logged = f"{sum(old[i] for i in have) / len(have):8.4f}" if have else f"{'-':>8s}"
        print(f"{name:24s} {logged} {sum(new) / len(new):8.4f} {len(changed):8d}")
        for i in changed[: args.show]:
            print(
                f"    line {rows[i]['_line']}: logged {old[i]:g} now {new[i]:g}  "
                f"label={rows[i]['label']!r}  {rows[i]['completion'][-80:]!r}"
            )
    errs = {name: sum(r.errors[name] for r in results) for name in rules}
    if any(errs.values()):
        print("errors: " + ", ".join(f"{k}={v}" for k, v in errs.items() if v))
    return 0


def _common(p) -> None:
    p.add_argument("--weights", help="comma-separated, one per rule (default: 1 each)")
    p.add_argument("--timeout", type=float, default=2.0, help="time limit per item for math-verify and plugins (s)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (0 = in this process)")


def register(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "reward", help="list reward rules, score completions, re-check a run", epilog=EXAMPLES, formatter_class=fmt
    )
    rsub = p.add_subparsers(dest="reward_command", metavar="SUBCOMMAND", required=True)
    q = rsub.add_parser("list", help="the built-in rules and what they score")
    q.set_defaults(func=cmd_list)
    sub.add_parser("rewards", help="list the built-in reward rules (same as `rlvr reward list`)").set_defaults(
        func=cmd_list
    )
    q = rsub.add_parser("score", help="score a JSONL file of completions", epilog=EXAMPLES, formatter_class=fmt)
    q.add_argument("--rules", required=True, help="comma-separated rule names or plugins, e.g. accuracy,format")
    q.add_argument(
        "--input",
        required=True,
        help="JSONL: one {completion, label, ...extra fields} per line; rows with "
        "'expected' (a score, or {rule: score}) are checked: a verdict each, exit 1 if any differs",
    )
    q.add_argument("--output", help="write each line with its per-rule 'rewards' and total 'reward' here")
    q.add_argument("--slowest", type=int, default=5, help="how many of the slowest items to show")
    _common(q)
    q.set_defaults(func=cmd_score)
    q = rsub.add_parser(
        "check", help="re-score a run's samples.jsonl with the current rules", epilog=EXAMPLES, formatter_class=fmt
    )
    q.add_argument("run", help="run directory (holds samples.jsonl and config.yaml)")
    q.add_argument("--rules", help="rules to use instead of the run's reward.rules")
    q.add_argument("--show", type=int, default=3, help="changed samples to print per rule")
    _common(q)
    q.set_defaults(func=cmd_check)
