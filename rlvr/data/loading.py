"""From a DataConfig to rows: built-in tasks or files, mapped through a preset, checked, deduped.

The row contract (what training, evaluation and rewards read)::

    {"question": str,          # the problem text, before any template
     "answer": str,            # the gold label (GSM8K '#### 1,234' -> '1234', MATH last \\boxed{} ...)
     "system": str | None,     # the row's own system prompt (alpaca 'system', data.system_key), else None
     "fields": dict}           # extra values for reward functions: the preset's (e.g. 'solution')
                               # plus data.extra_keys; countdown: {'numbers', 'target', 'solution'}

Reward functions receive ``fields`` as keyword arguments (``rule(completions, labels, **fields)``,
one value per completion). :func:`rlvr.data.prepare.prepare_rows` adds ``"prompt"`` (the exact
rendered text) and ``"prompt_tokens"``.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections import Counter
from dataclasses import dataclass, field

from rlvr.data import hub
from rlvr.data.files import expand, fingerprint, hub_name, pin, read_sources, stable_hash
from rlvr.data.presets import PRESETS, BadRow, Preset, bad_row_message, custom_preset, detect, map_record
from rlvr.data.tasks import arithmetic, arithmetic_tool, code, countdown
from rlvr.errors import UserError


@dataclass
class Split:
    """The rows of one split and how they were obtained.

    Attributes:
        rows: rows in their final order (see the module docstring for their keys).
        name: 'train' or 'test'.
        dropped: reason -> how many records were left out (bad rows skipped, duplicates).
        notes: lines for the user (which preset was detected, what was skipped).
        key: cache key of the rows: files (path, size, mtime) and every mapping setting.
        preset: the preset used ('' for built-in tasks).
    """

    rows: list[dict]
    name: str = "train"
    dropped: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    key: str = ""
    preset: str = ""


def _extra_keys(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, _, path = item.partition("=") if "=" in item else (item.replace(".", "_"), "", item)
        if not name or not path:
            raise UserError(f"data.extra_keys item '{item}': use 'path' or 'name=path'")
        out[name.strip()] = path.strip()
    return out


def _preset(data, records: list, dataset: str = "") -> tuple[Preset, str]:
    why = ""
    if data.preset == "auto" and not (data.question_key or data.answer_key):
        preset, how = detect(records, dataset)
        why = f"preset auto -> {preset.name} ({how})"
    else:
        base = None if data.preset in ("auto", "custom") else PRESETS[data.preset]
        preset = custom_preset(data.question_key, data.answer_key, base)
    if data.system_key:  # detected presets too (it was ignored when the preset was detected)
        preset = Preset(
            preset.name,
            preset.question,
            preset.answers,
            preset.query,
            data.system_key,
            preset.extras,
            None,
            preset.note,
            preset.code,
        )
    return preset, why


def _builtin(data, split: str) -> list[dict]:
    size, seed = (data.train_size, data.train_seed) if split == "train" else (data.test_size, data.test_seed)
    if data.task == "countdown":
        rows = countdown(size, seed=seed, difficulty=data.difficulty)
    elif data.task == "arithmetic_tool":
        rows = arithmetic_tool(size, seed=seed, difficulty=data.difficulty)
    elif data.task == "code":
        rows = code(size, seed=seed, difficulty=data.difficulty)
    else:
        rows = arithmetic(size, seed=seed, difficulty=data.difficulty)
    return [
        {"question": r["question"], "answer": r["answer"], "system": None, "fields": r.get("fields", {})} for r in rows
    ]


def split_key(data, split: str) -> str:
    """Cache key of a split's rows: the files' (path, size, mtime) and every setting that shapes rows."""
    settings = {
        k: getattr(data, k)
        for k in (
            "task",
            "format",
            "preset",
            "question_key",
            "answer_key",
            "system_key",
            "extra_keys",
            "on_bad_row",
            "dedupe",
            "difficulty",
            "date_from",
            "date_to",
        )
    }
    if data.task == "files":
        spec = data.path if split == "train" or not data.test_path else data.test_path
        settings.update(
            files=fingerprint(expand(spec)), split=data.train_split if split == "train" else data.test_split
        )
        settings.update(limit=data.limit if split == "train" else data.test_limit, shuffle=data.shuffle)
    else:
        settings.update(size=data.train_size if split == "train" else data.test_size)
    settings.update(seed=data.train_seed if split == "train" else data.test_seed, which=split, version=1)
    return stable_hash(settings)


def load_split(data, split: str = "train") -> Split:
    """The rows of ``split`` ('train' or 'test') for ``data`` (a :class:`rlvr.config.DataConfig`).

    Files: every record is mapped through the preset (``auto`` detects it from the first file);
    bad records (and JSONL lines that are not valid JSON or not objects) stop with a one-line
    :class:`UserError` naming file, row and the keys the row has, or are skipped and counted
    (``data.on_bad_row=skip``; one note per file and reason lists the lines); repeated questions are dropped
    (``data.dedupe``); then ``data.shuffle`` and ``data.limit``. Built-in tasks are generated
    from their seeds. A test split without test data has no rows.

    Raises:
        UserError: a missing or unreadable file, an unknown format, a bad row, no rows at all.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    if data.task != "files":
        return Split(_builtin(data, split), split, key=split_key(data, split))

    kw = dict(fmt=data.format, on_bad_row=data.on_bad_row, max_line_mib=data.max_line_mib)
    if split == "train":
        sources = read_sources(data.path, split=data.train_split, **kw)
    elif data.test_path:
        sources = read_sources(data.test_path, split=data.test_split, key="data.test_path", **kw)
    else:
        sources = read_sources(data.path, split=data.test_split, required=False, **kw)
        if not sources:
            return Split([], split, notes=["no test split in data.path and no data.test_path: no test rows"])
    dropped, notes = Counter(), []
    for source in sources:
        for reason, numbers in source.skipped.items():
            dropped[reason] += len(numbers)
            notes.append(f"{split}: {_skipped_note(source, reason, numbers)}")
    records = [r for s in sources for r in s.records]
    if not records:
        names = ", ".join(s.name for s in sources)
        raise UserError(
            f"no usable rows in {names} ({_counts(dropped)} left out)" if dropped else f"{names} holds no rows"
        )
    preset, note = _preset(data, records, next((s.dataset for s in sources if s.dataset), ""))
    notes += [f"{split}: {note}"] if note else []
    if preset.note:
        notes.append(f"{split}: {preset.name}: {preset.note}")
    extras = _extra_keys(data.extra_keys)
    rows, seen = [], set()
    for source in sources:
        for i, record in enumerate(source.records):
            try:
                row = map_record(preset, record, extras)
            except BadRow as e:
                if data.on_bad_row == "error":
                    raise UserError(bad_row_message(source.where(i), record, e, preset)) from None
                dropped[e.reason] += 1
                continue
            if data.date_from or data.date_to:
                when = row_date(row)
                if when is None:
                    dropped["without a date (data.date_from/date_to)"] += 1
                    continue
                if when < str(data.date_from or "0000") or when > str(data.date_to or "9999"):
                    dropped["outside data.date_from..date_to"] += 1
                    continue
            if data.dedupe:
                ident = (row["question"], row["system"])
                if ident in seen:
                    dropped["duplicate question"] += 1
                    continue
                seen.add(ident)
            rows.append(row)
    if not rows:
        raise UserError(f"no usable rows in {', '.join(s.name for s in sources)} ({_counts(dropped)} left out)")
    if data.shuffle:
        random.Random(data.train_seed if split == "train" else data.test_seed).shuffle(rows)
    limit = data.limit if split == "train" else data.test_limit
    if limit and len(rows) > limit:
        dropped["over data.limit" if split == "train" else "over data.test_limit"] += len(rows) - limit
        rows = rows[:limit]
    if dropped:
        notes.append(f"{split}: {len(rows)} rows, left out {_counts(dropped)}")
    return Split(rows, split, dropped, notes, split_key(data, split), preset.name)


DATE_FIELDS = ("contest_date", "date", "release_date")
"""Row fields a problem's date is read from (``data.date_from`` / ``data.date_to``)."""


def row_date(row: dict) -> str | None:
    """The row's problem date as ``YYYY-MM-DD`` (from an ISO date or date-time text, or a date object), or None."""
    fields = row.get("fields") or {}
    for key in DATE_FIELDS:
        value = fields.get(key)
        if hasattr(value, "isoformat"):
            value = value.isoformat()
        if isinstance(value, str) and re.match(r"\d{4}-\d{2}-\d{2}", value):
            return value[:10]
    return None


def _skipped_note(source, reason: str, numbers: list[int], *, shown: int = 20) -> str:
    """One line: 'skipped 2 lines of d.jsonl that are not valid JSON: 2, 7' (the first ``shown`` numbers)."""
    unit = "line" if source.lines is not None else "row"
    n = len(numbers)
    listed = ", ".join(map(str, numbers[:shown])) + (f", … ({n - shown} more)" if n > shown else "")
    verb = "is" if n == 1 else "are"
    return f"skipped {n} {unit}{'s' if n != 1 else ''} of {source.name} that {verb} {reason}: {listed}"


def _counts(counter: Counter) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in counter.most_common()) or "none"


def pin_hub_data(cfg, *, earlier: dict | None = None):
    """``cfg`` (a :class:`rlvr.config.Config`) with every Hugging Face data set named in ``data.path``,
    ``data.test_path`` and ``eval.data`` pinned to the commit it resolves to now
    (``openai/gsm8k:main`` -> ``openai/gsm8k:main@<commit>``): the config a run saves then names
    the exact data, and a resume or a repeat reads the same commit (from the cache, offline).

    Args:
        cfg: the run's config.
        earlier: the config a resumed run recorded (a plain dict), or None; a data set it pinned
            is read at that commit when ``cfg`` names it without a revision (``--config PRESET
            resume=RUN``). An explicit ``@revision`` is taken as given.

    Raises:
        UserError: a data set that is neither cached nor downloadable, with how to fetch it.
    """
    was_data, was_eval = ((earlier or {}).get(k) or {} for k in ("data", "eval"))
    data = dataclasses.replace(
        cfg.data,
        path=pin(_pinned_before(cfg.data.path, was_data.get("path"))),
        test_path=pin(_pinned_before(cfg.data.test_path, was_data.get("test_path")), key="data.test_path"),
    )
    spec = pin(_pinned_before(cfg.eval.data, was_eval.get("data")), key="eval.data")
    return dataclasses.replace(cfg, data=data, eval=dataclasses.replace(cfg.eval, data=spec))


def _pinned_before(spec: str | None, saved) -> str | None:
    """``saved`` when it is ``spec`` with commits added to the Hub data sets ``spec`` names without a
    revision; else ``spec``."""
    if not spec or not isinstance(saved, str):
        return spec
    now, was = [p.strip() for p in spec.split(",")], [p.strip() for p in saved.split(",")]
    if len(now) != len(was):
        return spec
    for a, b in zip(now, was):
        name, before = hub_name(a), hub.parse(b)
        if a != b and not (
            name is not None
            and name.revision is None
            and before is not None
            and (before.repo, before.config) == (name.repo, name.config)
        ):
            return spec
    return saved


def load_rows(data) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows) for ``data`` (a :class:`rlvr.config.DataConfig`).

    Each row is ``{"question", "answer", "system", "fields"}`` (see the module docstring); the
    test list is empty when there is no test data. Use :func:`load_split` for the counts and
    notes, and :func:`rlvr.data.prepare.prepare_rows` for the rendered prompts.
    """
    return load_split(data, "train").rows, load_split(data, "test").rows
