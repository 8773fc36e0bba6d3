"""Benchmark evaluation = rollout + answer checking: greedy accuracy, pass@k, maj@k.

No training imports: :func:`evaluate` takes any object with the rollout engine's
``generate(prompts, samples_per_prompt, *, greedy, temperature, max_new_tokens)``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.choices import BUILTIN_TASKS
from rlvr.config import DataConfig
from rlvr.data import load_split, render_prompt
from rlvr.data.files import hub_name, pin
from rlvr.data.templates import get_template
from rlvr.environments import CodeFeedback
from rlvr.errors import UserError
from rlvr.evaluation.metrics import ks_up_to, majority_vote, pass_at_k
from rlvr.rewards import Scorer, extract_answer, number_key
from rlvr.tools import tool_stats


@dataclass(frozen=True)
class PromptStyle:
    """How a question becomes a prompt: a template name or file (``rlvr.data.templates``) and the
    overrides of its system text and assistant prefix (None keeps the template's)."""

    template: str = "r1"
    system_prompt: str | None = None
    assistant_prefix: str | None = None

    def resolve(self):
        """The :class:`rlvr.data.templates.PromptTemplate` with the overrides applied."""
        return get_template(self.template, system_prompt=self.system_prompt, assistant_prefix=self.assistant_prefix)


@dataclass
class EvalResult:
    summary: dict
    """Aggregate numbers (accuracy, format_rate, pass@k, ...), JSON-ready."""
    predictions: list[dict]
    """One row per problem: prompt, completion, extracted answer, gold, correct, ..."""
    tallies: list[dict] = field(default_factory=list)
    """Per problem, what the summary counts beyond its prediction row (scoring errors, sampled
    completions in format); not written. :func:`merge_results` rebuilds a summary from them."""


EVAL_RULES = ("accuracy", "accuracy_lenient", "format")
"""The reward rules behind ``accuracy``, ``accuracy_lenient`` and ``format_rate``: training's own."""


def _judge(scorer, completions: list[str], golds: list[str], fields: dict) -> list[dict]:
    """Per completion: extracted answer, correct, correct_lenient, format and error, scored by
    ``scorer`` through :data:`EVAL_RULES` (the worker pool and its hard time limit, as in training).

    An item whose rule failed (verifier time-out or crash) is not correct and says why in ``error``.
    """
    rows = fields.get("fields") or []
    coded = any(isinstance(f, dict) and f.get("tests") for f in rows)  # a code task: its tests say correct
    rules = ("code_tests", *EVAL_RULES[1:]) if coded else EVAL_RULES
    (acc, acc_err), (len_, len_err), (fmt, fmt_err) = (
        scorer.rule_items(name, completions, golds, fields) for name in rules
    )
    out = []
    for i, c in enumerate(completions):
        correct = acc_err[i] is None and acc[i] == 1.0
        errors = [f"{name}: {e}" for name, e in zip(EVAL_RULES, (acc_err[i], len_err[i], fmt_err[i])) if e]
        out.append({
            "extracted": extract_answer(c),
            "correct": correct,
            "correct_lenient": correct or (len_err[i] is None and len_[i] == 1.0),
            "format": fmt_err[i] is None and fmt[i] == 1.0,
            "error": "; ".join(errors) or None,
        })  # fmt: skip
    return out


def _fields(rows: list[dict], repeat: int = 1) -> dict:
    """The rows' other values (question, fields, ...) as rule keywords, each row ``repeat`` times
    (as training passes them)."""
    keys = dict.fromkeys(k for r in rows for k in r if k != "answer")
    return {k: [r.get(k) for r in rows for _ in range(repeat)] for k in keys}


def _vote_key(answer: str) -> str:
    return number_key(answer) or answer.strip()


def load_eval_rows(
    data: str, *, preset: str | None = None, limit: int | None = None, difficulty: int = 1
) -> list[dict]:
    """Problems ``{"question", "answer", ...}`` to evaluate on, through :func:`rlvr.data.load_split`.

    Args:
        data: a built-in task name (its test split), or a data file/folder/glob or Hugging Face data
            set name (``HuggingFaceH4/MATH-500``, ``openai/gsm8k:main``): its test split when it has
            one, else all of it.
        preset: dataset preset of the files (default: detected).
        limit: keep the first ``limit`` problems.
        difficulty: for the built-in task.

    Raises:
        UserError: unknown task/file, unknown preset, or rows without gold answers.
    """
    if data in BUILTIN_TASKS:
        size = max(limit or 0, DataConfig().test_size)  # the generator is prefix-stable: any size agrees on the first N
        rows = load_split(DataConfig(task=data, difficulty=difficulty, test_size=size), "test").rows
    else:
        parts = [part.strip() for part in data.split(",")]
        if not any(Path(p).exists() or any(c in p for c in "*?[") or hub_name(p) for p in parts):
            raise UserError(
                f"--data {data}: no such file or folder, not a built-in task ({', '.join(BUILTIN_TASKS)}) "
                "and not a Hugging Face data set name (org/name[:config])"
            )
        cfg = DataConfig(task="files", path=pin(data, key="--data"), preset=preset or "auto")
        try:
            rows = load_split(cfg, "test").rows or load_split(cfg, "train").rows
        except UserError as e:
            if "answer" in str(e):
                raise UserError(f"{e} (eval needs gold answers; `rlvr generate` works without them)") from None
            raise
    if not rows:
        raise UserError(f"--data {data}: no problems to evaluate")
    return rows[:limit] if limit else rows


def evaluate(
    engine,
    tokenizer,
    rows: list[dict],
    *,
    style: PromptStyle = PromptStyle(),
    samples: int = 1,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    batch_prompts: int = 64,
    on_batch: Callable[[int, int, float], None] | None = None,
    scorer=None,
    seeds: list[int] | None = None,
) -> EvalResult:
    """Greedy accuracy on ``rows``; with ``samples`` = K > 1 also pass@k (k = 1, 2, 4, ... <= K) and maj@K
    from K sampled completions per problem at ``temperature``.

    Args:
        engine: a rollout engine (``HFRolloutEngine``) holding the model.
        rows: problems ``{"question", "answer"}``.
        batch_prompts: problems generated together (the sampled pass holds K times as many sequences).
        on_batch: called as ``on_batch(done, total, running_accuracy)`` after each batch.
        scorer: the :class:`rlvr.rewards.Scorer` whose settings (worker pool, ``timeout_s``,
            ``on_error``) score the answers; training passes its own. None = a default Scorer.
            It is warmed before the first batch.
        seeds: with ``samples`` > 1, one sampling seed per sampled sequence (``len(rows) * samples``,
            grouped by row, as the engine's ``generate`` takes them): a row's samples then do not
            depend on the rows beside it, so a share of the rows samples what the whole would
            (:func:`merge_results`). None = the torch RNG.

    Returns:
        EvalResult; ``summary`` keys: n, accuracy (boxed / <answer> answer, the ``accuracy`` reward),
        accuracy_lenient (the ``accuracy_lenient`` reward), format_rate (the ``format`` reward), response_len_mean,
        truncated_frac, scoring_errors (items a rule failed on: scored as not correct), and with K > 1: pass@k,
        maj@K, sample_accuracy (mean over all K samples), sample_format_rate. With tools: :data:`TOOL_KEYS`.
        With code feedback episodes (``rollout.max_turns`` > 1): accuracy is the final attempt's,
        accuracy_first_turn the first attempt's, turns_mean the turns taken.
    """
    if samples < 1:
        raise UserError(f"--samples {samples}: must be >= 1")
    if seeds is not None and len(seeds) != len(rows) * samples:
        raise ValueError(f"{len(seeds)} seeds for {len(rows)} rows x {samples} samples")
    t0 = time.perf_counter()
    if scorer is None:
        scorer = Scorer(list(EVAL_RULES))
    scorer.warm()  # pool start-up and imports happen here, not inside the first batch's time limits
    preds: list[dict] = []
    tallies: list[dict] = []
    step = max(1, batch_prompts)
    template = style.resolve()
    prefix = template.assistant_prefix  # part of the assistant's turn: the rewards read it too
    make = getattr(engine, "environment", None)
    retries = make is not None and isinstance(make(), CodeFeedback)  # a later turn only after a failed one
    for start in range(0, len(rows), step):
        chunk = rows[start : start + step]
        prompts = [
            render_prompt(tokenizer, r["question"], template=template, system_prompt=r.get("system")) for r in chunk
        ]
        episodes = {"rows": chunk} if make is not None else {}  # each episode's reset reads its row
        greedy = engine.generate(prompts, 1, greedy=True, max_new_tokens=max_new_tokens, **episodes)
        lengths = greedy.response_lengths.tolist()
        sampled = None
        if samples > 1:
            kw = {} if seeds is None else {"seeds": seeds[start * samples : (start + len(chunk)) * samples]}
            sampled = engine.generate(
                prompts, samples, temperature=temperature, max_new_tokens=max_new_tokens, **episodes, **kw
            )
        golds = [r["answer"] for r in chunk]
        said = [prefix + t for t in greedy.texts]
        judged = _judge(scorer, said, golds, {**_fields(chunk), "prompt": prompts})
        sample_judged = []
        if sampled is not None:
            s_said = [prefix + t for t in sampled.texts]
            s_fields = {**_fields(chunk, samples), "prompt": [p for p in prompts for _ in range(samples)]}
            sample_judged = list(
                zip(s_said, _judge(scorer, s_said, [g for g in golds for _ in range(samples)], s_fields))
            )
        for i, (row, prompt) in enumerate(zip(chunk, prompts)):
            j = judged[i]
            out = {
                "question": row["question"],
                "prompt": prompt,
                "completion": said[i],
                "extracted": j["extracted"],
                "gold": row["answer"],
                "correct": j["correct"],
                "correct_lenient": j["correct_lenient"],
                "format": j["format"],
                "length": int(lengths[i]),
                "truncated": bool(greedy.truncated[i]),
            }
            if getattr(greedy, "tool_calls", None) is not None:  # an engine with tools
                out.update(tool_calls=greedy.tool_calls[i], tool_errors=greedy.tool_errors[i])
            elif getattr(greedy, "turns", None) is not None and retries:  # code with execution feedback
                out.update(turns=greedy.turns[i])
            tally = {"errors": 0, "sample_format": 0}
            if j["error"]:
                out["error"] = j["error"]
                tally["errors"] += 1
            if sampled is not None:
                checks = [
                    (c, s["extracted"], s["correct"], s["format"])
                    for c, s in sample_judged[i * samples : (i + 1) * samples]
                ]
                tally["errors"] += sum(bool(s["error"]) for _, s in sample_judged[i * samples : (i + 1) * samples])
                tally["sample_format"] = sum(f for *_, f in checks)
                c = sum(ok for _, _, ok, _ in checks)
                voted = majority_vote([p for _, p, _, _ in checks], key=_vote_key)
                maj_ok = any(p == voted and ok for _, p, ok, _ in checks)  # voted is one of the p
                out.update(
                    num_correct=c,
                    majority=voted,
                    majority_correct=maj_ok,
                    samples=[{"completion": s, "extracted": p, "correct": ok} for s, p, ok, _ in checks],
                )
            preds.append(out)
            tallies.append(tally)
        if on_batch is not None:
            on_batch(len(preds), len(rows), sum(p["correct"] for p in preds) / len(preds))
    summary = _summary(preds, tallies, samples, temperature, max_new_tokens, time.perf_counter() - t0)
    return EvalResult(summary=summary, predictions=preds, tallies=tallies)


def merge_results(parts: list[EvalResult], *, elapsed: float) -> EvalResult:
    """One evaluation from the results of strided shares of its rows (share r: rows ``r::len(parts)``,
    each evaluated with its rows' own seeds): the predictions back in row order and the summary
    counted over them in that order, so equal to evaluating every row in one process (up to the
    float rounding of batching rows differently); ``time_s`` = ``elapsed``."""
    world = len(parts)
    n = sum(len(p.predictions) for p in parts)
    preds = [parts[i % world].predictions[i // world] for i in range(n)]
    tallies = [parts[i % world].tallies[i // world] for i in range(n)]
    s = parts[0].summary
    summary = _summary(preds, tallies, s["samples"], s["temperature"], s["max_new_tokens"], elapsed)
    return EvalResult(summary=summary, predictions=preds, tallies=tallies)


def _summary(
    preds: list[dict], tallies: list[dict], samples: int, temperature: float, max_new_tokens: int, elapsed: float
) -> dict:
    """The summary of :func:`evaluate` from its prediction rows and tallies, counted in row order."""
    ks = ks_up_to(samples) if samples > 1 else []
    per_k: dict[int, float] = {k: 0.0 for k in ks}
    for p in preds:
        for k in ks:
            per_k[k] += pass_at_k(samples, p["num_correct"], k)
    n = len(preds)
    summary = {
        "n": n,
        "accuracy": sum(p["correct"] for p in preds) / n,
        "accuracy_lenient": sum(p["correct_lenient"] for p in preds) / n,
        "format_rate": sum(p["format"] for p in preds) / n,
        "response_len_mean": sum(p["length"] for p in preds) / n,
        "truncated_frac": sum(p["truncated"] for p in preds) / n,
        "scoring_errors": sum(t["errors"] for t in tallies),
    }
    if preds and "tool_calls" in preds[0]:  # with tools: calls, errors, accuracy with and without a call
        calls, errors = [p["tool_calls"] for p in preds], [p["tool_errors"] for p in preds]
        summary.update(tool_stats(calls, errors, [p["correct"] for p in preds]))
    elif preds and "turns" in preds[0]:  # code feedback: a later turn follows a failed attempt, so a pass
        summary["turns_mean"] = sum(p["turns"] for p in preds) / n  # in one turn is a first-attempt pass
        summary["accuracy_first_turn"] = sum(p["correct"] and p["turns"] == 1 for p in preds) / n
    if samples > 1:
        summary.update({f"pass@{k}": v / n for k, v in per_k.items()})
        summary[f"maj@{samples}"] = sum(p["majority_correct"] for p in preds) / n
        summary["sample_accuracy"] = sum(p["num_correct"] for p in preds) / (n * samples)
        summary["sample_format_rate"] = sum(t["sample_format"] for t in tallies) / (n * samples)
    summary.update(
        samples=samples,
        temperature=temperature if samples > 1 else 0.0,
        max_new_tokens=max_new_tokens,
        time_s=round(elapsed, 3),
    )
    return summary


def write_result(result: EvalResult, out_dir: Path, **extra) -> Path:
    """``out_dir/summary.json`` (summary + ``extra``, e.g. model and data) and ``out_dir/predictions.jsonl``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps({**extra, **result.summary}, indent=2) + "\n", encoding="utf-8")
    with (out_dir / "predictions.jsonl").open("w", encoding="utf-8") as f:
        for row in result.predictions:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return out_dir


# metrics shown in tables and logged as eval/<key> during training
SUMMARY_KEYS = ("accuracy", "accuracy_lenient", "format_rate", "response_len_mean", "truncated_frac")
TOOL_KEYS = ("tool_calls_mean", "tool_use_rate", "tool_error_rate", "accuracy_with_tool", "accuracy_without_tool")
"""With tools (:func:`rlvr.tools.tool_stats` of the greedy answers)."""
TURN_KEYS = ("accuracy_first_turn", "turns_mean")
"""With episodes of the model's turns (code with execution feedback): ``accuracy`` is the final attempt's."""


def metric_keys(summary: dict) -> list[str]:
    """Summary keys worth a table row / a logged metric, in display order."""
    extra = [k for k in summary if k.startswith(("pass@", "maj@"))]
    tail = [k for k in ("sample_accuracy", "sample_format_rate") if k in summary]
    tools = [k for k in (*TOOL_KEYS, *TURN_KEYS) if k in summary]
    return [k for k in SUMMARY_KEYS if k in summary] + tools + extra + tail
