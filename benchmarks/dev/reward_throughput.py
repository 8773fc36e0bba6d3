"""Throughput of reward scoring: 10,000 GSM8K-style completions with rules accuracy,format.

The completions are synthetic but shaped like real R1-style GSM8K rollouts (1,250 questions x
G=8 samples; reasoning of a few hundred characters; the answer boxed as an integer, a decimal,
with ``$``/units/commas, as a fraction, as an expression, wrong, missing, or truncated).
Reports the cold time (worker pool start-up included), the warm time (pool reused, as in
training after step 1), and the math-verify-only rate on symbolic answers.
Run by hand: `python benchmarks/dev/reward_throughput.py` (writes benchmarks/results/reward_throughput.json).
"""

from __future__ import annotations

import json
import os
import platform
import random
import time
from pathlib import Path

from rlvr.rewards import Scorer, verify

STEPS = [
    "{name} buys {a} packs of pencils at ${b} each, so that costs {a} * {b} = {ab} dollars.",
    "Then {name} spends another {c} dollars, for a total of {ab} + {c} = {total}.",
    "Let me double-check: {a} times {b} is {ab}, and adding {c} gives {total}.",
    "So the total amount spent is {total} dollars.",
]


def answer_text(rng: random.Random, total: int) -> str:
    """How the final answer is written: mostly clean, sometimes in forms that need math-verify."""
    r = rng.random()
    wrong = total + rng.choice([-10, -2, -1, 1, 3, 12])
    forms = [
        (0.40, f"\\boxed{{{total}}}"),
        (0.08, f"\\boxed{{{total}.00}}"),
        (0.06, f"\\boxed{{\\${total}}}"),
        (0.05, f"\\boxed{{{total:,}}}"),
        (0.05, f"\\boxed{{{total} \\text{{ dollars}}}}"),
        (0.04, f"\\boxed{{\\frac{{{2 * total}}}{{2}}}}"),
        (0.03, f"\\boxed{{x = {total}}}"),
        (0.03, f"\\boxed{{{total} dollars}}"),  # needs math-verify
        (0.02, f"\\boxed{{{total // 2} + {total - total // 2}}}"),  # needs math-verify
        (0.02, f"\\boxed{{{total}\\%}}"),  # needs math-verify
        (0.12, f"\\boxed{{{wrong}}}"),
        (0.05, f"The answer is {total}."),  # no box
        (0.05, ""),  # truncated before answering
    ]
    acc = 0.0
    for p, text in forms:
        acc += p
        if r < acc:
            return text
    return forms[0][1]


def make_batch(n_questions: int = 1250, group: int = 8, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    completions, labels = [], []
    for q in range(n_questions):
        a, b, c = rng.randint(2, 30), rng.randint(2, 60), rng.randint(1, 500)
        vals = dict(name=rng.choice(["Janet", "Tom", "Maria", "Ken"]), a=a, b=b, ab=a * b, c=c, total=a * b + c)
        gold = f"{a} packs cost {a * b}; plus {c} is {a * b + c}.\n#### {a * b + c:,}"
        for _ in range(group):
            steps = " ".join(s.format(**vals) for s in rng.sample(STEPS, k=rng.randint(2, 4)))
            ans = answer_text(rng, vals["total"])
            shape = rng.random()
            if shape < 0.7:
                text = f"<think>{steps}</think>\n<answer>{ans}</answer>"
            elif shape < 0.85:
                text = f"<think>{steps}\n{ans}</think>"  # answer only inside <think>
            else:
                text = f"{steps} {ans}"
            completions.append(text)
            labels.append(gold)
    return completions, labels


def timed(scorer: Scorer, completions, labels) -> tuple[float, dict]:
    t0 = time.perf_counter()
    res = scorer.score(completions, labels)
    return time.perf_counter() - t0, res


def main() -> None:
    completions, labels = make_batch()
    n = len(completions)
    scorer = Scorer(["accuracy", "format"], [1.0, 0.5], timeout_s=2.0, workers=2)
    cold_s, res = timed(scorer, completions, labels)
    warm_s, res = timed(scorer, completions, labels)
    in_proc = Scorer(["accuracy", "format"], [1.0, 0.5], workers=0)
    in_proc_s, res0 = timed(in_proc, completions, labels)
    assert res0.per_rule == res.per_rule, "pool and in-process scoring disagree"
    verify.configure(workers=2)

    # the slow path alone: distinct symbolic pairs, all through math-verify in the pool
    symbolic = [(f"\\frac{{{k}\\sqrt{{2}}}}{{2}}", f"\\frac{{{k}}}{{\\sqrt{{2}}}}") for k in range(1, 501)]
    t0 = time.perf_counter()
    matched = verify.match_many(symbolic)
    mv_s = time.perf_counter() - t0
    verify.shutdown()

    needs_mv = sum(verify.numeric_match(p, g) is None for p, g in _pairs(completions, labels))
    results = {
        "completions": n,
        "rules": {"accuracy": 1.0, "format": 0.5},
        "cold_s": round(cold_s, 3),
        "warm_s": round(warm_s, 3),
        "in_process_s": round(in_proc_s, 3),
        "warm_per_s": round(n / warm_s),
        "needing_math_verify": needs_mv,
        "accuracy_mean": round(sum(res.per_rule["accuracy"]) / n, 4),
        "format_mean": round(sum(res.per_rule["format"]) / n, 4),
        "errors": res.errors,
        "math_verify_only": {
            "pairs": len(symbolic),
            "seconds": round(mv_s, 3),
            "per_s": round(len(symbolic) / mv_s),
            "all_equal": all(m == 1.0 for m in matched),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
        },
    }
    out = Path(__file__).resolve().parents[1] / "results" / "reward_throughput.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def _pairs(completions, labels):
    from rlvr.rewards import extract_answer, gold_answer

    for c, g in zip(completions, labels):
        p = extract_answer(c)
        if p:
            yield p, gold_answer(g)


if __name__ == "__main__":
    main()
