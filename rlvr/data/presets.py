"""Dataset presets: the real schemas of common math datasets, and the mapping of one record to a row.

A row is ``{"question": str, "answer": str, "system": str | None, "fields": dict}``:
``answer`` is the gold label rewards compare against; ``fields`` holds the extra values
kept for reward functions (the preset's own plus ``data.extra_keys``).

| preset | question | answer (gold) | fields kept |
| --- | --- | --- | --- |
| ``gsm8k`` | ``question`` | ``answer`` after the last ``####``, commas removed | ``solution`` (the full answer text) |
| ``math`` / ``math500`` | ``problem`` | ``answer``, else the last ``\\boxed{}`` of ``solution`` | solution, level, |
| | | | type, subject, unique_id |
| ``deepscaler`` | ``problem`` | ``answer`` | solution |
| ``orz`` | ``problem`` / turn list ``[0].value`` | ``answer`` / ``[1].ground_truth.value`` | |
| ``dapo_math`` | ``prompt.0.content`` | ``reward_model.ground_truth`` | data_source, ability, extra_info |
| ``alpaca`` | ``instruction`` + "\\n" + ``input`` (when non-empty) | ``output`` | (``system`` column is the row's |
| | | | system prompt) |
| ``custom`` | ``data.question_key`` (question) | ``data.answer_key`` (answer) | |

Dotted paths reach into nested records: ``reward_model.ground_truth``, ``prompt.0.content``.
``data.preset=auto`` detects the preset from the columns (:func:`detect`), and for the published data
sets of :data:`HUB_PRESETS` read by their Hub name, from that name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rlvr.errors import UserError
from rlvr.rewards.extract import last_boxed

MISSING = object()


class BadRow(Exception):
    """A record that cannot become a row; ``reason`` is a short, countable description."""

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.reason, self.hint = reason, hint


def get_path(record, path: str):
    """The value at dotted ``path`` (dict keys and list indices), or :data:`MISSING`."""
    node = record
    for part in path.split("."):
        if isinstance(node, dict):
            if part not in node:
                return MISSING
            node = node[part]
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def gsm8k_gold(answer: str) -> str:
    """GSM8K's final answer: the text after the last ``####``, commas removed (``#### 1,234`` -> ``1234``)."""
    if "####" in answer:
        answer = answer.rsplit("####", 1)[1]
    return answer.strip().replace(",", "")


def boxed_gold(solution: str) -> str:
    """The last ``\\boxed{...}`` of a MATH solution (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``)."""
    found = last_boxed(solution)
    if found is None or not found.strip():
        raise BadRow("no \\boxed{} answer in 'solution'", "answer")
    return found.strip()


def solution_gold(solution: str) -> str:
    """A TRL-style ``solution``: its last ``\\boxed{}`` where it has one (a worked MATH solution), else
    the text after GSM8K's ``####``, else the text itself (a bare answer)."""
    found = last_boxed(solution)
    if found is not None and found.strip():
        return found.strip()
    return gsm8k_gold(solution)


@dataclass(frozen=True)
class Preset:
    """Where one dataset keeps its question, gold answer and extra fields.

    Attributes:
        answers: (path, gold function) alternatives, tried in order; the first present one wins.
        query: optional path appended to the question on a new line (alpaca ``input``).
        system: optional path of a per-row system prompt.
        extras: field name -> path, kept when present.
        list_form: the preset used for records that are lists (ORZ turn lists).
    """

    name: str
    question: str
    answers: tuple[tuple[str, Callable[[str], str] | None], ...]
    query: str | None = None
    system: str | None = None
    extras: dict[str, str] = field(default_factory=dict)
    list_form: Preset | None = None
    note: str = ""
    code: bool = False
    """A code data set: :data:`rlvr.data.code_sets.READERS` makes the question and the tests (``fields["tests"]``)."""


_MATH = Preset(
    "math",
    "problem",
    (("answer", None), ("solution", boxed_gold)),
    extras={k: k for k in ("solution", "level", "type", "subject", "unique_id")},
)
PRESETS: dict[str, Preset] = {
    "gsm8k": Preset("gsm8k", "question", (("answer", gsm8k_gold),), extras={"solution": "answer"}),
    "math": _MATH,
    "math500": Preset("math500", _MATH.question, _MATH.answers, extras=_MATH.extras),
    "deepscaler": Preset("deepscaler", "problem", (("answer", None),), extras={"solution": "solution"}),
    "orz": Preset(
        "orz",
        "problem",
        (("answer", None),),
        list_form=Preset("orz", "0.value", (("1.ground_truth.value", None),)),
    ),
    "dapo_math": Preset(
        "dapo_math",
        "prompt.0.content",
        (("reward_model.ground_truth", None),),
        extras={k: k for k in ("data_source", "ability", "extra_info")},
        note="its prompts carry their own instructions; data.template=plain avoids repeating them",
    ),
    "alpaca": Preset("alpaca", "instruction", (("output", None),), query="input", system="system"),
    # TRL's conversational rows: the question is the last message, a first "system" message the system
    # code data sets (rlvr.data.code_sets): tests for the code_tests reward, no gold answer
    "humaneval": Preset("humaneval", "prompt", (), extras={"task_id": "task_id"}, code=True),
    "mbpp": Preset("mbpp", "test_list", (), extras={"task_id": "task_id"}, code=True),
    "apps": Preset("apps", "input_output", (), extras={"difficulty": "difficulty"}, code=True),
    "lcb": Preset("lcb", "question_content", (), extras={"contest_date": "contest_date"}, code=True),
    "deepcoder": Preset("deepcoder", "problem", (), code=True),
    "kodcode": Preset("kodcode", "test_code", (), extras={"question_id": "question_id"}, code=True),
    "trl": Preset(
        "trl", "prompt.-1.content", (("solution", solution_gold), ("answer", None)), system="prompt.0.content"
    ),
}


def custom_preset(question_key: str | None, answer_key: str | None, base: Preset | None = None) -> Preset:
    """``base`` (or the plain question/answer schema) with the user's keys in place of its own."""
    if base is None:
        base = Preset("custom", "question", (("answer", None),))
    return Preset(
        base.name,
        question_key or base.question,
        ((answer_key, None),) if answer_key else base.answers,
        query=base.query if not question_key else None,
        system=base.system,
        extras=base.extras,
        list_form=None if (question_key or answer_key) else base.list_form,
        note=base.note,
    )


HUB_PRESETS = {
    "openai/gsm8k": "gsm8k",
    "hendrycks/competition_math": "math",
    "EleutherAI/hendrycks_math": "math",
    "HuggingFaceH4/MATH-500": "math500",
    "agentica-org/DeepScaleR-Preview-Dataset": "deepscaler",
    "pe-nlp/orz_math_57k": "orz",
    "BytedTsinghua-SIA/DAPO-Math-17k": "dapo_math",
    "openai/openai_humaneval": "humaneval",
    "google-research-datasets/mbpp": "mbpp",
    "codeparrot/apps": "apps",
    "BAAI/TACO": "apps",
    "livecodebench/code_generation_lite": "lcb",
    "agentica-org/DeepCoder-Preview-Dataset": "deepcoder",
    "KodCode/KodCode-V1": "kodcode",
    "KodCode/KodCode-Light-RL-10K": "kodcode",
}
"""The published data sets each preset was written for, by Hub name: the name decides where the
columns cannot (MATH-500 has MATH's columns; DeepScaleR and ORZ share problem/answer)."""


def _fits(preset: Preset, record) -> bool:
    """Whether ``record`` has the problem where ``preset`` looks for it."""
    if isinstance(record, list) and preset.list_form is not None:
        preset = preset.list_form
    return get_path(record, preset.question) is not MISSING


def detect(records: list, dataset: str = "") -> tuple[Preset, str]:
    """The preset whose schema the first records match, and why (for the user).

    Args:
        records: the data's records (the first 20 are looked at).
        dataset: the Hub data set they come from (``openai/gsm8k``), '' for local files; a data set
            of :data:`HUB_PRESETS` gets its preset when its first record has that preset's problem key.

    Raises:
        UserError: no preset fits (the message lists the keys seen).
    """
    sample = records[:20]
    known = {name.lower(): preset for name, preset in HUB_PRESETS.items()}.get(dataset.lower())
    if known and sample and _fits(PRESETS[known], sample[0]):
        return PRESETS[known], f"the Hub data set {dataset}"
    if sample and all(isinstance(r, list) for r in sample):
        return PRESETS["orz"], "records are ORZ turn lists"
    keys: set[str] = set()
    for r in sample:
        if isinstance(r, dict):
            keys |= set(r)
    first = next((r for r in sample if isinstance(r, dict)), {})
    if {"prompt", "test", "entry_point"} <= keys:
        return PRESETS["humaneval"], "columns prompt/test/entry_point (HumanEval)"
    if "test_list" in keys and keys & {"text", "prompt"}:
        return PRESETS["mbpp"], "columns text/test_list (MBPP)"
    if {"question_content", "public_test_cases"} <= keys:
        return PRESETS["lcb"], "columns question_content/public_test_cases (LiveCodeBench)"
    if {"question", "test_code"} <= keys:
        return PRESETS["kodcode"], "columns question/test_code (KodCode)"
    if {"problem", "tests"} <= keys:
        return PRESETS["deepcoder"], "columns problem/tests (DeepCoder)"
    if "input_output" in keys and keys & {"question", "problem"}:
        return PRESETS["apps"], "columns question/input_output (APPS, TACO)"
    if isinstance(first.get("prompt"), list) and "reward_model" in keys:
        return PRESETS["dapo_math"], "columns prompt (chat list) + reward_model"
    if isinstance(first.get("prompt"), list) and keys & {"solution", "answer"}:
        return PRESETS["trl"], "columns prompt (chat list) + solution, TRL's conversational format"
    if isinstance(first.get("prompt"), str) and "solution" in keys:
        trl = PRESETS["trl"]
        return Preset("trl", "prompt", trl.answers), "columns prompt + solution, TRL's standard format"
    if {"instruction", "output"} <= keys:
        return PRESETS["alpaca"], "columns instruction/output"
    if {"question", "answer"} <= keys and any(
        isinstance(r, dict) and "####" in str(r.get("answer", "")) for r in sample
    ):
        return PRESETS["gsm8k"], "columns question/answer with '#### ' final answers"
    if "problem" in keys and keys & {"level", "type", "subject"} and keys & {"solution", "answer"}:
        return PRESETS["math"], "columns problem/solution with level/type/subject"
    if {"problem", "answer"} <= keys:
        return PRESETS["deepscaler"], "columns problem/answer (DeepScaleR / ORZ schema)"
    if {"problem", "solution"} <= keys:
        return PRESETS["math"], "columns problem/solution"
    if {"question", "answer"} <= keys:
        return custom_preset(None, None), "columns question/answer"
    shown = ", ".join(sorted(keys)) or "none"
    raise UserError(
        f"cannot tell the dataset schema from its keys ({shown}); set data.preset to one of "
        f"{', '.join(PRESETS)}, or data.question_key and data.answer_key"
    )


def _keys_of(record) -> str:
    if isinstance(record, dict):
        return "keys present: " + (", ".join(sorted(map(str, record))) or "none")
    return f"the record is a list of {len(record)} items"


def _unicode_ok(text: str) -> bool:
    """False for text no tokenizer can encode: lone UTF-16 surrogates (``"\\ud800"`` in JSON)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(value, what: str, path: str) -> str:
    if value is MISSING or value is None or (isinstance(value, str) and not value.strip()):
        raise BadRow(f"no '{path}'" if value is MISSING else f"empty '{path}'", what)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadRow(f"a {type(value).__name__} in '{path}' (not a string or number)", what)
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRow(f"a non-finite number ({value}) in '{path}'", "content")
    if isinstance(value, str) and not _unicode_ok(value):
        raise BadRow(f"text in '{path}' that is not valid Unicode (a lone surrogate)", "content")
    return value if isinstance(value, str) else str(value)


def _code_row(preset: Preset, record, extra_keys: dict[str, str]) -> dict:
    """A code data set's record -> a row whose ``fields["tests"]`` the code_tests reward runs; its
    ``answer`` only names how many tests there are (there is no gold text to compare)."""
    from rlvr.data import code_sets

    if not isinstance(record, dict):
        raise BadRow(f"a record that is not a mapping ({_keys_of(record)})", "question")
    try:
        question, tests = code_sets.READERS[preset.name](record)
    except code_sets.BadRow as e:
        raise BadRow(str(e), "tests") from None
    fields = {name: record[path] for name, path in preset.extras.items() if path in record}
    for name, path in extra_keys.items():
        value = get_path(record, path)
        if value is not MISSING:
            fields[name] = value
    fields["tests"] = tests
    return {"question": question, "answer": f"{len(tests['cases'])} tests", "system": None, "fields": fields}


def map_record(preset: Preset, record, extra_keys: dict[str, str]) -> dict:
    """One record -> a row ``{"question", "answer", "system", "fields"}``.

    Raises:
        BadRow: a missing or empty question/answer, a label that is not a string or number,
            a missing extra key.
    """
    if isinstance(record, list) and preset.list_form is not None:
        preset = preset.list_form
    if preset.code:
        return _code_row(preset, record, extra_keys)
    question = _text(get_path(record, preset.question), "question", preset.question)
    if preset.query:
        query = get_path(record, preset.query)
        if isinstance(query, str) and query.strip():
            question = question + "\n" + query
    answer, empty = None, None
    for path, gold in preset.answers:
        value = get_path(record, path)
        if value is MISSING or value is None or (isinstance(value, str) and not value.strip()):
            empty = empty or (path if value is not MISSING else None)
            continue
        answer = _text(value, "answer", path)
        answer = gold(answer) if gold else answer.strip()
        if not answer:
            raise BadRow(f"an empty answer in '{path}'", "answer")
        break
    if answer is None and empty:
        raise BadRow(f"empty '{empty}'", "answer")
    if answer is None:
        paths = " or ".join(f"'{p}'" for p, _ in preset.answers)
        raise BadRow(f"no {paths}", "answer")
    system = get_path(record, preset.system) if preset.system else None
    if preset.system and preset.system.endswith(".content"):  # a chat message: the system's only if its role says so
        role = get_path(record, preset.system.removesuffix("content") + "role")
        system = system if role in (MISSING, "system") else None
    system = system if isinstance(system, str) and system else None
    if system is not None and not _unicode_ok(system):
        raise BadRow(f"text in '{preset.system}' that is not valid Unicode (a lone surrogate)", "content")
    fields = {}
    for name, path in preset.extras.items():
        value = get_path(record, path)
        if value is not MISSING:
            fields[name] = value
    for name, path in extra_keys.items():
        value = get_path(record, path)
        if value is MISSING:
            raise BadRow(f"no '{path}'", "extra")
        fields[name] = value
    return {"question": question, "answer": answer, "system": system, "fields": fields}


def bad_row_message(where: str, record, err: BadRow, preset: Preset) -> str:
    """The one-line error for a bad record: where, what, the keys it has, and what to set."""
    fix = {
        "question": "set data.question_key (or data.preset)",
        "answer": "set data.answer_key (or data.preset)",
        "extra": "fix data.extra_keys",
    }.get(err.hint, "fix the row")
    return f"{where}: row has {err.reason} ({preset.name} preset; {_keys_of(record)}); {fix}, or data.on_bad_row=skip"
