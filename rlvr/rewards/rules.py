"""Reward rules. A rule is a named function ``(completions, labels, **fields) -> list[float]``.

``completions`` are the decoded responses only (no prompt, special tokens stripped; the trainer
prepends ``data.assistant_prefix`` such as ``<think>``); ``labels`` are the gold answers from the
dataset (GSM8K ``#### N`` solutions and boxed MATH solutions are reduced by :func:`gold_answer`);
``fields`` are the rows' other columns, one list each. A rule may return NaN for an item it
could not score (e.g. a verifier time-out): that item counts as an error (see ``registry.Scorer``).

Accuracy-type rules share one path: extract a prediction per completion, then compare all of
them at once with :func:`~rlvr.rewards.verify.match_many` (numbers here, math-verify in the
worker pool). Format-type rules are pure ``(completion) -> float`` functions applied per item.

Reward-hacking guards: only the *last* answer counts (several boxes: the last wins, so a model
cannot list candidates); ``strict_format`` needs the ``\\boxed{}`` inside ``<answer>`` (a box
only in ``<think>`` fails it); rlvr's own format rules (``format``, ``strict_format``,
``format_partial``, ``tag_count``) pay nothing for the R1 template's example text copied back
(``<think> reasoning process here </think><answer> answer here </answer>``) or for an empty think
(:func:`hollow`); truncated completions can be scored ``reward.truncated_score``. The MindSpeed-RL
and MindRLHF replicas (``ms_*`` and the rest of their names) keep their originals' behaviour,
placeholders included.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from rlvr.rewards.countdown import countdown_expression_ok, countdown_numbers
from rlvr.rewards.extract import (
    answer_tag,
    extract_answer,
    gold_answer,
    last_boxed,
    minerva_answer,
)
from rlvr.rewards.verify import match_many

Rule = Callable[..., list[float]]

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_R1 = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)
_MS_FORMAT = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.DOTALL | re.MULTILINE)
_MS_BASE_FORMAT = re.compile(r"<think>.*</think>.*<answer>.*\\boxed\{.*\}.*</answer>", re.DOTALL)
_MS_STEPS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")
_STEPS = re.compile(_MS_STEPS.pattern, re.MULTILINE)


# -- per-item format helpers: (completion) -> float ----------------------------------------------

PLACEHOLDERS = ("reasoning process here", "answer here")
"""The R1 instruction's example contents (``rlvr.data.templates.R1_INSTRUCTION``): a model copies
them back within a few steps where a format rule pays for them (2 -> 16 of 32 completions in 3 steps
on GSM8K-style data, accuracy 0 throughout)."""
_BLOCK = {
    "think": re.compile(r"<think>(.*?)</think>", re.DOTALL),
    "answer": re.compile(r"<answer>(.*?)</answer>", re.DOTALL),
}


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def hollow(completion: str, block: str) -> bool:
    """Whether the completion's first ``<block>..</block>`` (``think`` or ``answer``) holds nothing of its
    own: only whitespace and punctuation, or the R1 template's example text for it (:data:`PLACEHOLDERS`,
    compared word for word, case and punctuation aside). False where the block is missing."""
    m = _BLOCK[block].search(completion)
    if m is None:
        return False
    said = _words(m.group(1))
    return not said or said in PLACEHOLDERS


def format_r1(completion: str, answer: str = "") -> float:
    """1 if the text is <think>..</think> then <answer>..</answer>, each tag once, whitespace allowed; else 0.

    Whitespace is allowed around and between the two blocks; nothing else is. Neither block may be
    hollow (:func:`hollow`: empty, or the template's example text)."""
    once = all(completion.count(t) == 1 for t in _TAGS)
    shaped = once and _R1.fullmatch(completion) is not None
    return float(shaped and not hollow(completion, "think") and not hollow(completion, "answer"))


def strict_format(completion: str, answer: str = "") -> float:
    """1 if format holds and a non-empty \\boxed{} is inside <answer> (a box only in <think> fails); else 0.

    As :func:`format_r1`: exactly one of each tag, in order, nothing after ``</answer>``."""
    return float(format_r1(completion) == 1.0 and bool(last_boxed(answer_tag(completion) or "")))


def format_partial(completion: str, answer: str = "") -> float:
    """0.25 per step reached, in order: <think>, </think>, <answer>..</answer>, \\boxed{} inside it.

    Steps: ``<think>`` present; ``</think>`` after it; ``<answer>..</answer>`` after that;
    a non-empty ``\\boxed{}`` inside the answer. A 135M base model never emits the full
    format by itself, so a 0/1 format reward is 0 for every sample, has zero variance in
    every group and gives no gradient; the ladder rewards getting closer.

    A hollow think (:func:`hollow`: empty, or the template's example text) stops the ladder at 0.25,
    a hollow answer at 0.5.
    """
    think = completion.find("<think>")
    if think < 0:
        return 0.0
    think_end = completion.find("</think>", think)
    if think_end < 0 or hollow(completion[think:], "think"):
        return 0.25
    tag = answer_tag(completion[think_end:])
    if tag is None or hollow(completion[think_end:], "answer"):
        return 0.5
    return 1.0 if last_boxed(tag) else 0.75


def tag_count(completion: str, answer: str = "") -> float:
    """0.25 for each of <think>, </think>, <answer>, </answer> that occurs exactly once; a hollow block's
    two tags (:func:`hollow`: empty, or the template's example text) count nothing.

    open-r1's ``tag_count_reward``, without its newline requirements around the tags."""
    void = {t for b, tags in (("think", _TAGS[:2]), ("answer", _TAGS[2:])) if hollow(completion, b) for t in tags}
    return float(sum(0.25 for t in _TAGS if completion.count(t) == 1 and t not in void))


def reasoning_steps(completion: str, answer: str = "") -> float:
    """min(1, steps/3), counting "Step N:", numbered-list lines, bullets and First,/Second,/Next,/Finally,."""
    return min(1.0, len(_STEPS.findall(completion)) / 3)


_TOOL_CALL = re.compile(r"<tool>\s*[A-Za-z_][\w.-]*\s*:.*?</tool>\s*<result>(.*?)(?:</result>|\Z)", re.DOTALL)


def tool_format(completion: str, answer: str = "") -> float:
    """1 if the text makes a tool call in the default syntax (``<tool>NAME: ARGS</tool>``, answered by
    ``<result>…</result>``) and no result is an error; 0.5 if it calls but a result is an error; 0.25
    for a ``<tool>`` that never became a call; else 0.

    Pays for using a tool well, not for the answer: pair it with an accuracy rule. For another call
    syntax (``rollout.tool_call``) write a plugin rule on the same pattern."""
    results = _TOOL_CALL.findall(completion)
    if not results:
        return 0.25 if "<tool>" in completion else 0.0
    return 0.5 if any(r.strip().startswith("error:") for r in results) else 1.0


def tool_wellformed(completion: str, answer: str = "") -> float:
    """1 if every tool call is well formed and answered without an error, or if the text calls no tool
    at all; 0.5 if a result is an error; 0 for a ``<tool>`` that never became a call.

    Pays for calling *well*, never for calling: a text without a call scores what a good call does,
    so the choice to call is left to the accuracy rule (the ``arithmetic_tool_choice`` preset)."""
    if "<tool>" not in completion:
        return 1.0
    results = _TOOL_CALL.findall(completion)
    if not results or completion.count("<tool>") > len(results):
        return 0.0
    return 0.5 if any(r.strip().startswith("error:") for r in results) else 1.0


def ms_step(completion: str, answer: str = "") -> float:
    """MindSpeed-RL step: min(1, steps/3) with its exact regex (numbered items count only at the very start).

    Same as :func:`reasoning_steps` except that ``^`` is not multi-line."""
    return min(1.0, len(_MS_STEPS.findall(completion)) / 3)


def ms_format(completion: str, answer: str = "") -> float:
    """MindRLHF format_reward (= MindSpeed-RL format): 1 if ^<think>..</think>\\s*<answer>..</answer>$ matches, else 0.

    ``re.match(r"^<think>.*?</think>\\s*<answer>.*?</answer>$", DOTALL | MULTILINE)``: ``$`` also
    matches at a line end, so text after a newline passes, as in the originals."""
    return float(_MS_FORMAT.match(completion) is not None)


def ms_strict_format(completion: str, answer: str = "") -> float:
    """MindSpeed-RL strict_format: 1 if each tag and one \\boxed{} occur once, in order, <think> first, \
</answer> last; else -0.5.

    Its ``_validate_response_structure``; whitespace around the whole text is ignored."""
    text = completion.strip()
    marks = [text.find(t) for t in ("<think>", "</think>", "<answer>")]
    box = re.search(r"\\boxed\{.*?\}", text)
    ok = (
        all(text.count(t) == 1 for t in _TAGS)
        and len(re.findall(r"\\boxed\{.*?\}", text)) == 1
        and box is not None
        and marks[0] < marks[1] < marks[2] < box.start() < text.find("</answer>")
        and text.startswith("<think>")
        and text.endswith("</answer>")
    )
    return 1.0 if ok else -0.5


def has_boxed(completion: str, answer: str = "") -> float:
    """1 if the text contains a closed, non-empty \\boxed{...}, else 0."""
    return float(bool(last_boxed(completion)))


def each(fn: Callable[[str, str], float]) -> Rule:
    """A batch rule that applies the per-item ``fn(completion, label)`` to every item."""

    def rule(completions: list[str], labels: list, **fields) -> list[float]:
        return [fn(c, str(a)) for c, a in zip(completions, labels)]

    rule.__name__, rule.__doc__ = fn.__name__, fn.__doc__
    return rule


# -- accuracy-type rules: extract, then compare as a batch --------------------------------------


def graded(
    extract: Callable[[str], str | None], *, right: float = 1.0, wrong: float = 0.0, missing: float = 0.0, doc: str
) -> Rule:
    """A batch rule: ``right`` if ``extract(completion)`` is equivalent to the gold answer, ``wrong`` if
    it is not, ``missing`` if nothing was extracted; NaN where the verifier timed out.

    An item of the countdown task (its row carries ``numbers``) is right only if the extracted
    answer is an expression that uses each number once and equals the target
    (:func:`~rlvr.rewards.countdown.countdown_expression_ok`): the bare target is not an answer.
    """

    def rule(completions: list[str], labels: list, **fields) -> list[float]:
        preds = [extract(c) for c in completions]
        numbers = countdown_numbers(len(completions), fields)
        found = [i for i, p in enumerate(preds) if p and numbers[i] is None]
        matched = match_many([(preds[i], gold_answer(labels[i])) for i in found])
        out = [missing] * len(completions)
        for i, m in zip(found, matched):
            out[i] = m if math.isnan(m) else (right if m else wrong)
        for i, nums in enumerate(numbers):
            if nums is not None and preds[i]:
                out[i] = right if countdown_expression_ok(preds[i], gold_answer(labels[i]), nums) else wrong
        return out

    rule.__doc__ = doc
    return rule


def _ms_extract(completion: str) -> str | None:
    """MindSpeed-RL ``acc``: cut at ``<|im_start|>assistant`` and the first end token, then the last
    ``\\boxed{}`` (Qwen-Math's parser takes the box whenever "boxed" occurs, and never falls back)."""
    text = completion.split("<|im_start|>assistant")[-1]
    for stop in ("</s>", "<|im_end|>", "<|endoftext|>"):
        text = text.split(stop)[0]
    return last_boxed(text) if "boxed" in text else None


def _base_acc_extract(completion: str) -> str | None:
    return last_boxed(completion) if _MS_BASE_FORMAT.fullmatch(completion) else None


accuracy = graded(
    extract_answer,
    doc="1 if the last \\boxed{} (else the <answer> content) equals the gold answer, else 0. A number gold is "
    "matched by the number the answer denotes (rlvr.rewards.extract.denoted_number: "
    "any notation, never an expression).",
)
accuracy_lenient = graded(
    lambda c: extract_answer(c, fallback_last_number=True),
    doc="As accuracy, but falls back to the last number in the text when there is no box or answer tag.",
)
math_17k_acc = graded(
    last_boxed, doc="MindSpeed-RL math_17k_acc: 1 if the last \\boxed{} equals the gold, else 0; no format needed."
)
base_acc = graded(
    _base_acc_extract,
    doc="MindSpeed-RL base_acc: 1 only if the text is <think>..</think>..<answer>..\\boxed{}..</answer> "
    "and the box is correct, else 0.",
)
acc = graded(
    _ms_extract,
    right=1.0,
    wrong=-0.5,
    missing=-1.0,
    doc="MindSpeed-RL acc: 1 correct, -0.5 wrong, -1 if no answer or no 'boxed' in the text.",
)


# -- exact-string rules carried over from MindSpeed-RL (DAPO) and MindRLHF ---------------------

# Minerva answer normalisation (Lewkowycz et al. 2022, appendix D), as in verl's math_dapo.py
_SUBSTITUTIONS = [
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
]  # fmt: skip
_REMOVED = [
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
    "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2",
    "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"',
    "\\dots",
]  # fmt: skip


def minerva_normalize(answer: str) -> str:
    """Minerva / DAPO ``normalize_final_answer``: text after the last ``=``, unit words and ``$``
    removed, ``\\text{}``/``\\boxed{}`` unwrapped, ``\\fracab`` -> ``\\frac{a}{b}``, digit commas dropped."""
    s = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in _REMOVED:
        s = s.replace(expr, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s)
    s = re.sub(r"(\\text\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", s)
    s = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s)
    s = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def acc_for_dapo(completions: list[str], labels: list, **fields) -> list[float]:
    """MindSpeed-RL acc_for_dapo: +1 if the last "Answer: X" (final 300 chars) equals the gold after Minerva \
normalisation, else -1.

    verl's ``math_dapo.compute_score``: exact string comparison after :func:`minerva_normalize`."""
    out = []
    for c, label in zip(completions, labels):
        pred = minerva_answer(c[-300:])
        ok = pred is not None and minerva_normalize(pred) == minerva_normalize(gold_answer(label))
        out.append(1.0 if ok else -1.0)
    return out


_DIGIT_COMMA = re.compile(r"(\d),(\d)")
_QWEN_BOXED = re.compile(r"boxed{([-+]?\d*\.?\d+)}")
_FIRST_NUMBER = re.compile(r"([-+]?\d+\.?\d*)")


def qwen_accuracy_reward(completions: list[str], labels: list, **fields) -> list[float]:
    """MindRLHF qwen_accuracy_reward: 1 if the last boxed{<number>} equals the gold's first number as a string, else 0.

    String equality: ``18.00`` != ``18`` and ``\\boxed{\\frac12}`` never matches; thousands commas are dropped.
    Without a boxed number the whole response is compared, as in MindRLHF."""
    out = []
    for c, label in zip(completions, labels):
        response = _DIGIT_COMMA.sub(r"\1\2", c)
        nums = _QWEN_BOXED.findall(response)
        gold = _FIRST_NUMBER.findall(_DIGIT_COMMA.sub(r"\1\2", gold_answer(label)))
        if not gold:
            out.append(math.nan)  # MindRLHF raises IndexError here: a label without a number is a data bug
            continue
        pred = nums[-1] if nums else response  # as MindRLHF: no boxed number -> the whole response
        out.append(float(pred.lower() == gold[0].lower()))
    return out
