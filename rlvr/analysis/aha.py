"""Aha-moment finder: completions that check and correct themselves inside ``<think>``.

DeepSeek-R1 (§2.2.4) reports an "aha moment": mid-training, the model starts to stop, re-check
and change its answer. Here a completion *reflects* when its reasoning part (inside
``<think>…</think>``, else the text before ``<answer>``) contains a reflection phrase, and it
*changed course* when the last number it wrote right before the first reflection differs from
its final answer. Ranking, best first:

1. correct (accuracy reward > 0.5) and changed course after a reflection;
2. correct with a reflection;
3. reflection only;

ties broken by the number of distinct reflection phrases, then reward, then later step.
Stdlib only (plus :mod:`rlvr.rewards.extract`), no torch.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from rlvr.rewards.extract import extract_answer, last_number, number_key

# English phrases are regexes matched case-insensitively at word starts; Chinese ones literally
DEFAULT_PHRASES: list[str] = [
    r"wait\b",
    r"let me (?:double[- ]?)?check",
    r"let me re-?\w+",  # re-check, recheck, reconsider, re-evaluate, redo, ...
    r"verify(?:ing)?\b",
    r"verification\b",
    r"i made a mistake",
    r"(?:that|this) (?:is|was) (?:wrong|incorrect)",
    r"double[- ]check",
    r"on second thought",
    r"check again",
    r"re-?examine",
    "等等",
    "检查",
    "重新",
    "验证",
]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_EQUALS_NUMBER = re.compile(r"=\s*(-?\d[\d,]*(?:\.\d+)?)")


def compile_phrases(
    phrases: list[str] | None = None, extra: list[str] = (), *, literal_extra: bool = True
) -> re.Pattern:
    """One case-insensitive pattern for the reflection phrases.

    Args:
        phrases: regex phrases (default :data:`DEFAULT_PHRASES`).
        extra: user phrases, matched literally (``literal_extra``) at a word start.
    """
    parts = []
    for p in list(DEFAULT_PHRASES if phrases is None else phrases):
        parts.append(p if not p[:1].isascii() else r"(?<![\w])" + p)
    for p in extra:
        body = re.escape(p) if literal_extra else p
        parts.append(body if not p[:1].isascii() else r"(?<![\w])" + body)
    if not parts:
        return re.compile(r"(?!x)x")  # matches nothing
    return re.compile("|".join(f"(?:{p})" for p in parts), re.IGNORECASE)


def reasoning_span(completion: str) -> tuple[int, int]:
    """``(start, end)`` of the reasoning: inside ``<think>…</think>`` (or to ``<answer>``/end if unclosed);
    without ``<think>``, everything before ``<answer>``."""
    open_at = completion.find(_THINK_OPEN)
    start = open_at + len(_THINK_OPEN) if open_at >= 0 else 0
    ends = [i for i in (completion.find(_THINK_CLOSE, start), completion.find("<answer>", start)) if i >= 0]
    return start, min(ends) if ends else len(completion)


class _SampleRow:
    """The step and reward of a ``samples.jsonl`` row held as ``self.row``."""

    row: dict

    @property
    def step(self) -> int:
        return int(self.row.get("step", 0))

    @property
    def reward(self) -> float:
        r = self.row.get("reward")
        return float(r) if isinstance(r, (int, float)) else 0.0


@dataclass
class AhaHit(_SampleRow):
    """One sample with at least one reflection phrase in its reasoning."""

    row: dict
    spans: list[tuple[int, int]]  # character spans of the phrases in row["completion"]
    correct: bool
    changed_course: bool
    before: str | None  # the number written right before the first reflection
    final: str | None  # the final answer
    phrases: list[str] = field(default_factory=list)

    @property
    def tier(self) -> int:
        """1 = correct and changed course, 2 = correct, 3 = reflection only."""
        return 1 if self.correct and self.changed_course else 2 if self.correct else 3

    def sort_key(self) -> tuple:
        return (self.tier, -len(set(self.phrases)), -self.reward, -self.step)

    def highlighted(self, left: str = "**", right: str = "**") -> str:
        """The completion with each reflection phrase wrapped in ``left``/``right``."""
        text, out, at = self.row.get("completion", ""), [], 0
        for s, e in self.spans:
            out += [text[at:s], left, text[s:e], right]
            at = e
        return "".join(out + [text[at:]])


def _norm(ans: str | None) -> str | None:
    if ans is None:
        return None
    return number_key(ans) or ans.strip()


def _final_number(text: str) -> str | None:
    """The final answer as the number it denotes (``20 + 20 = 40``: 40;
    :func:`~rlvr.rewards.extract.denoted_number`), else its text."""
    answer = extract_answer(text, fallback_last_number=True)
    if answer is None:
        return None
    return _norm(answer)


def is_correct(row: dict, accuracy_rule: str = "accuracy") -> bool:
    """The row's accuracy reward (> 0.5), else its final answer equal to the gold answer."""
    rewards = row.get("rewards")
    if isinstance(rewards, dict) and isinstance(rewards.get(accuracy_rule), (int, float)):
        return rewards[accuracy_rule] > 0.5
    final = _norm(extract_answer(str(row.get("completion", ""))))
    return final is not None and final == _norm(str(row.get("answer", "")))


def analyse(row: dict, pattern: re.Pattern, accuracy_rule: str = "accuracy") -> AhaHit | None:
    """An :class:`AhaHit` if ``row``'s reasoning reflects, else None."""
    text = row.get("completion")
    if not isinstance(text, str):
        return None
    start, end = reasoning_span(text)
    spans, phrases = [], []
    for m in pattern.finditer(text, start, end):
        if m.end() > m.start():
            spans.append(m.span())
            phrases.append(m.group(0).lower())
    if not spans:
        return None
    head = text[start : spans[0][0]]
    eq = _EQUALS_NUMBER.findall(head)
    before = _norm(eq[-1].replace(",", "")) if eq else _norm(last_number(head))
    final = _final_number(text)
    correct = is_correct(row, accuracy_rule)
    changed = before is not None and final is not None and before != final
    return AhaHit(row, spans, correct, changed, before, final, phrases)


def find_aha(rows: list[dict], *, pattern: re.Pattern | None = None, accuracy_rule: str = "accuracy") -> list[AhaHit]:
    """Every reflecting sample, best first (see the module docstring for the order)."""
    pattern = pattern or compile_phrases()
    hits = [h for h in (analyse(r, pattern, accuracy_rule) for r in rows) if h is not None]
    return sorted(hits, key=AhaHit.sort_key)


def reflection_curve(rows: list[dict], *, pattern: re.Pattern | None = None) -> list[dict]:
    """Per step: ``{"step", "n", "reflect_frac", "correct_reflect_frac", "length_mean"}``.

    ``reflect_frac`` is the share of the step's completions with a reflection phrase in their
    reasoning (the DeepSeek-R1 "aha" curve); ``length_mean`` is the mean response length in tokens
    (``length`` of samples.jsonl rows; characters / 4 when a row has none).
    """
    pattern = pattern or compile_phrases()
    by_step: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        if isinstance(r.get("step"), int) and isinstance(r.get("completion"), str):
            by_step[r["step"]].append(r)
    out = []
    for step in sorted(by_step):
        group = by_step[step]
        flags = []
        for r in group:
            start, end = reasoning_span(r["completion"])
            flags.append(pattern.search(r["completion"], start, end) is not None)
        lengths = [
            r["length"] if isinstance(r.get("length"), (int, float)) else len(r["completion"]) / 4 for r in group
        ]
        correct_reflect = sum(f and is_correct(r) for f, r in zip(flags, group))
        out.append(
            {
                "step": step,
                "n": len(group),
                "reflect_frac": sum(flags) / len(group),
                "correct_reflect_frac": correct_reflect / len(group),
                "length_mean": sum(lengths) / len(lengths),
            }
        )
    return out


@dataclass
class Revision(_SampleRow):
    """A sample that revised its result without a reflection phrase: its reasoning states more than
    one distinct result (``= N``), or a result other than its final answer.

    The weaker signal a small model gives before it learns to say "wait" (or in its place): the
    one-line answers of a 135M model never reflect in words, but some of them write
    ``14 - 6 = 5, 14 - 6 = 8`` and answer 8. A multi-step solution (``3 + 4 = 7, 7 + 2 = 9``) also
    states several results, so these are candidates to read, not counted aha moments."""

    row: dict
    results: list[str]  # the distinct results stated in the reasoning, in order
    final: str | None
    correct: bool

    @property
    def corrected(self) -> bool:
        """Right in the end after first stating another result."""
        return self.correct and bool(self.results) and self.results[0] != self.final

    def sort_key(self) -> tuple:
        return (not self.corrected, not self.correct, -len(self.results), -self.reward, -self.step)


def find_revisions(
    rows: list[dict], *, pattern: re.Pattern | None = None, accuracy_rule: str = "accuracy"
) -> list[Revision]:
    """Every sample that revised its result (see :class:`Revision`) and has no reflection phrase
    (those are :func:`find_aha`'s), best first: corrected to the right answer, then right, then by
    how many results it stated."""
    pattern = pattern or compile_phrases()
    out = []
    for row in rows:
        text = row.get("completion")
        if not isinstance(text, str):
            continue
        start, end = reasoning_span(text)
        if pattern.search(text, start, end):
            continue
        results = list(dict.fromkeys(_norm(n.replace(",", "")) for n in _EQUALS_NUMBER.findall(text, start, end)))
        final = _final_number(text)
        if len(results) > 1 or (results and final is not None and results[-1] != final):
            out.append(Revision(row, results, final, is_correct(row, accuracy_rule)))
    return sorted(out, key=Revision.sort_key)


def unscored_gold(row: dict, final: str | None) -> bool:
    """The sample's last number is the gold answer, but not where the accuracy rule reads one: no
    ``<answer>`` tag or ``\\boxed{}`` holds it (``2 + 2 = 4`` as plain text)."""
    stated = _norm(extract_answer(str(row.get("completion", ""))))
    return final is not None and final == _norm(str(row.get("answer", ""))) and stated != final


def describe_revision(rev: Revision) -> str:
    """One header line: step, reward, the results stated -> the final answer; a "wrong" whose last
    number is the gold answer says why it still counts as wrong."""
    verdict = "corrected" if rev.corrected else "right" if rev.correct else "wrong"
    if not rev.correct and unscored_gold(rev.row, rev.final):
        verdict = "wrong (the gold answer, but outside <answer> and \\boxed{}, where the accuracy rule reads it)"
    return f"step {rev.step}  reward {rev.reward:.3f}  {verdict}: {' , '.join(rev.results)} -> {rev.final}"


TIER_LABEL = {1: "correct, changed course after reflecting", 2: "correct, reflected", 3: "reflected"}


def describe(hit: AhaHit) -> str:
    """One header line: step, reward, verdict, phrases, before -> after."""
    course = f"; {hit.before} -> {hit.final}" if hit.changed_course else ""
    phrases = ", ".join(dict.fromkeys(hit.phrases))
    return f"step {hit.step}  reward {hit.reward:.3f}  {TIER_LABEL[hit.tier]}{course}  [{phrases}]"
