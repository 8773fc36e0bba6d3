"""Reading records from data files and folders: local ones, and the files of Hugging Face Hub data sets.

``data.path`` is a file, a folder, a glob, a Hub data set name (``org/name[:config][@revision]``,
fetched into the Hugging Face cache by :mod:`rlvr.data.hub`), or several of these separated by commas.
A name that is also a local path is the local path.

- ``.jsonl`` / ``.ndjson``: one JSON object per line (blank lines skipped);
- ``.json``: a list of objects (or of ORZ-style turn lists), an object of equal-length
  columns, or an object with one key holding such a list (``{"data": [...]}``);
- ``.parquet``, ``.csv``, ``.arrow``: through Hugging Face ``datasets`` (CSV cells are read as text);
- a ``save_to_disk`` folder (``Dataset`` or ``DatasetDict``; the split is chosen by name);
- any other folder: its data files; files whose name contains the split name (``train``,
  ``test``, e.g. ``train-00000-of-00001.parquet``) belong to that split, and when no file names a
  split all of them are train;
- a Hub data set: the files of the split asked for, as ``datasets.load_dataset`` would pick them
  (the README's ``configs:`` or the Hub's file-name patterns), read as the local files above.

JSON and JSONL are parsed with the standard library rather than pyarrow: values stay exactly
as written (an answer ``42`` never becomes ``42.0`` because another row has ``4.5``), rows
may differ in type, and a broken line is reported by its line number. With
``data.on_bad_row=skip`` a JSONL line that is not valid JSON or not an object (and a ``.json``
record that is not an object) is left out instead, and :attr:`Source.skipped` names it.
"""

from __future__ import annotations

import codecs
import csv
import glob
import hashlib
import itertools
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, NoReturn

from rlvr.data import hub
from rlvr.errors import UserError
from rlvr.jsonl import parse_lines

# `datasets` reads local files only (Hub data sets come through huggingface_hub): set before it is imported
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# appended to the error for a bad line or record of a data file: the setting that skips it instead
SKIP_HINT = "; fix it or set data.on_bad_row=skip"

# reasons a record is left out by data.on_bad_row=skip before any preset sees it
NOT_JSON = "not valid JSON"
NOT_OBJECT = "not a JSON object"

MAX_LINE_MIB = 256
"""The default of ``data.max_line_mib`` (and the limit of `rlvr generate --input` and `rlvr reward score
--input`): the longest line of a JSONL file, one row, in MiB. The largest rows rlvr reads are code
problems that carry their hidden tests; a line of hundreds of MiB is more likely a whole JSON document
on one line, or a hostile file. A longer line stops the read before it is held in memory."""

MAX_COLUMNS = 1000
"""Most keys (columns) a data row may have. A row is one problem: its question, its answer and a few
fields for rewards; the widest schemas rlvr reads (the code sets) have a few dozen. Wider is a mistake or
a hostile file, and costs out of proportion to its bytes: pandas and Arrow keep state per column, each
row carries every key into the cache, and a bad row's error lists its keys. So the count is checked
before rows are built, from the schema or header where the format has one."""

_CHUNK = 1 << 20
"""Bytes read at a time while a long line's end is looked for: what refusing a line of any length costs."""

FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}


@dataclass
class Source:
    """The records of one file (or one split of a ``save_to_disk`` folder).

    Attributes:
        name: the file, as given; used in every error message.
        records: rows as Python objects (dicts; lists for ORZ turn lists).
        lines: for JSONL, the 1-based line of each record (blank lines skipped), else None.
        skipped: reason (:data:`NOT_JSON`, :data:`NOT_OBJECT`) -> the 1-based lines (JSONL) or
            rows (JSON) that ``data.on_bad_row=skip`` left out of ``records``.
        dataset: the Hub data set the file belongs to (``openai/gsm8k``), '' for a local file;
            presets are detected by it (:func:`rlvr.data.presets.detect`).
    """

    name: str
    records: list
    lines: list[int] | None = None
    skipped: dict[str, list[int]] = field(default_factory=dict)
    dataset: str = ""

    def where(self, index: int) -> str:
        """``FILE:LINE`` for JSONL, ``FILE row N`` otherwise (1-based)."""
        if self.lines is not None:
            return f"{self.name}:{self.lines[index]}"
        return f"{self.name} row {index + 1}"


def _is_saved_dataset(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def hub_name(part: str) -> hub.HubName | None:
    """The Hub data set that one part of ``data.path`` names, or None for a local path: an existing path
    always wins, and a glob or a name ending in a data file extension (``data/train.jsonl``) is local."""
    part = part.strip()
    if any(c in part for c in "*?[") or Path(part).exists():
        return None
    name = hub.parse(part)
    return None if name is None or Path(name.repo).suffix.lower() in FORMATS else name


def _entries(spec: str, key: str) -> list[Path | hub.Snapshot]:
    """The local files and folders, and the Hub snapshots, that ``spec`` names, in order."""
    out: list[Path | hub.Snapshot] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if any(c in part for c in "*?["):
            matches = sorted(Path(m) for m in glob.glob(part, recursive=True))
            matches = [m for m in matches if m.suffix in FORMATS or (m.is_dir() and _is_saved_dataset(m))]
            if not matches:
                raise UserError(f"{key}={part}: the pattern matches no data file ({', '.join(FORMATS)})")
            out += matches
            continue
        name = hub_name(part)
        if name is not None:
            out.append(hub.resolve(name, label=f"{key}={part}"))
            continue
        path = Path(part)
        if not path.exists():
            raise UserError(
                f"data file {part} not found; set {key} to an existing file, folder or glob, "
                "or a Hugging Face data set name (org/name[:config])"
            )
        out.append(path)
    if not out:
        raise UserError(f"{key} is empty; give a data file, folder or glob")
    return out


def expand(spec: str, *, key: str = "data.path") -> list[Path]:
    """The files and folders named by ``spec`` (comma-separated files, folders, globs, Hub data sets:
    a data set's snapshot folder in the Hugging Face cache, whose name is its commit)."""
    return [e.folder if isinstance(e, hub.Snapshot) else e for e in _entries(spec, key)]


def pin(spec: str | None, *, key: str = "data.path") -> str | None:
    """``spec`` with each Hub data set in it named at the commit it resolves to now
    (``openai/gsm8k:main`` -> ``openai/gsm8k:main@<commit>``); local parts unchanged.

    Raises:
        UserError: a data set that cannot be resolved (see :func:`rlvr.data.hub.resolve`).
    """
    if not spec:
        return spec
    parts = [p.strip() for p in spec.split(",")]
    names = [hub_name(p) if p else None for p in parts]
    if not any(names):
        return spec
    return ",".join(hub.resolve(n, label=f"{key}={p}").pinned if n is not None else p for p, n in zip(parts, names))


def fingerprint(paths: list[Path]) -> list:
    """(path, size, mtime) of every file under ``paths``: what a cache key needs to notice edits."""
    out = []
    for p in paths:
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        out += [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    return out


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None


def _text_lines(path: Path, max_bytes: int, too_long: Callable[[int], NoReturn]) -> Iterator[str]:
    """The lines of a UTF-8 text file (a leading BOM dropped), one at a time, without their newline.

    A line of more than ``max_bytes`` bytes calls ``too_long(line number)``, which raises, before the line
    is read: its end is looked for a chunk at a time (:data:`_CHUNK`), so refusing a 1 GiB line holds
    1 MiB, and the lines before it are never all in memory at once either.

    Raises:
        UserError: bytes that are not UTF-8 (naming the file and the byte).
    """
    with open(path, "rb") as f:
        for lineno in itertools.count(1):
            start = f.tell()
            raw = f.readline(_CHUNK)
            if not raw:
                return
            if len(raw) == _CHUNK and not raw.endswith(b"\n"):  # a long line: find its end, keeping nothing
                size = len(raw)
                while size <= max_bytes and (piece := f.readline(_CHUNK)):
                    size += len(piece)
                    if piece.endswith(b"\n"):
                        break
                if size - 1 > max_bytes:  # (one byte may be the newline)
                    too_long(lineno)
                f.seek(start)
                raw = f.read(size)
            raw = raw.removesuffix(b"\n")
            if len(raw) > max_bytes:
                too_long(lineno)
            bom = lineno == 1 and raw.startswith(codecs.BOM_UTF8)
            try:
                yield raw[3:].decode("utf-8") if bom else raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(
                    f"{path} is not UTF-8 text (byte {start + e.start + 3 * bom}); save it as UTF-8"
                ) from None


def read_jsonl_values(
    path: Path,
    *,
    skipped: list[int] | None = None,
    hint: str = "",
    max_line_mib: int = MAX_LINE_MIB,
    limit_key: str = "",
) -> list[tuple[int, object]]:
    """(line number, parsed JSON value) for every non-blank line of a UTF-8 JSONL data file.

    For data files, `rlvr generate --input` and `rlvr reward score --input` (a run's own files
    are read tolerantly by :func:`rlvr.jsonl.read_jsonl`); callers check the shape of each value.
    The file is read one line at a time (:func:`_text_lines`).

    Args:
        path: the file.
        skipped: when given, a line that is not JSON is left out and its number appended here;
            when None, it raises.
        hint: appended to the error for a line that is not JSON (e.g. :data:`SKIP_HINT`).
        max_line_mib: the longest line, in MiB (:data:`MAX_LINE_MIB`).
        limit_key: the setting that raises ``max_line_mib``, named in its error ('' = none).

    Raises:
        UserError: non-UTF-8 bytes, a line over ``max_line_mib`` (whatever ``skipped``), or
            (``skipped`` None) a line that is not JSON; it names the file and line.
    """

    def bad_line(lineno: int, e: Exception) -> None:
        if skipped is not None:
            skipped.append(lineno)
            return
        if isinstance(e, json.JSONDecodeError):
            raise UserError(
                f"{path}:{lineno}: not valid JSON ({e.msg}); each line must be one JSON object{hint}"
            ) from None
        if isinstance(e, RecursionError):
            raise UserError(
                f"{path}:{lineno}: JSON nested too deeply to read; each line must be one flat JSON object{hint}"
            ) from None
        # NaN/Infinity, or an integer past Python's 4300-digit limit
        why = "a number of more than 4300 digits; write it as a string" if "digits" in str(e) else f"{e}; drop the row"
        raise UserError(f"{path}:{lineno}: not valid JSON ({why}){hint}") from None

    def too_long(lineno: int) -> NoReturn:
        setting = f" ({limit_key}={max_line_mib})" if limit_key else ""
        raise UserError(
            f"{path}:{lineno}: a line of more than {max_line_mib} MiB{setting}, too long for one row; "
            "write one JSON object per line" + (f", or raise {limit_key}" if limit_key else "")
        )

    lines = _text_lines(path, max_line_mib << 20, too_long)
    return parse_lines(lines, on_error=bad_line, parse_constant=_no_constant)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _check_columns(where: str, count: int) -> None:
    """A one-line error when a row (or a file's schema) has more than :data:`MAX_COLUMNS` columns."""
    if count > MAX_COLUMNS:
        raise UserError(
            f"{where}: {count:,} columns (keys), more than the {MAX_COLUMNS:,} a data row may have; "
            "keep the ones the task reads (question, answer, fields for rewards) in a new file"
        )


def _read_jsonl(path: Path, skip: bool, max_line_mib: int) -> Source:
    records, lines, not_json, not_object = [], [], [], []
    kw = dict(hint=SKIP_HINT, max_line_mib=max_line_mib, limit_key="data.max_line_mib")
    for lineno, obj in read_jsonl_values(path, skipped=not_json if skip else None, **kw):
        if isinstance(obj, dict):
            _check_columns(f"{path}:{lineno}", len(obj))
        elif not isinstance(obj, list):
            if skip:
                not_object.append(lineno)
                continue
            raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}{SKIP_HINT}")
        records.append(obj)
        lines.append(lineno)
    skipped = {reason: numbers for reason, numbers in ((NOT_JSON, not_json), (NOT_OBJECT, not_object)) if numbers}
    return Source(str(path), records, lines, skipped)


def _read_json(path: Path, skip: bool) -> Source:
    text = _read_text(path)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        hint = "; for one object per line name the file .jsonl" if e.msg == "Extra data" else ""
        raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg}){hint}") from None
    if isinstance(obj, dict) and len(obj) == 1 and isinstance(next(iter(obj.values())), list):
        obj = next(iter(obj.values()))  # {"data": [...]}
    elif isinstance(obj, dict) and obj and all(isinstance(v, list) for v in obj.values()):
        _check_columns(str(path), len(obj))
        lengths = {len(v) for v in obj.values()}
        if len(lengths) != 1:
            raise UserError(f"{path}: an object of columns needs equal-length lists (lengths {sorted(lengths)})")
        cols = list(obj)
        obj = [dict(zip(cols, vals)) for vals in zip(*obj.values())]
    if not isinstance(obj, list):
        raise UserError(f"{path}: expected a JSON list of records (or an object of columns), got {type(obj).__name__}")
    for i, rec in enumerate(obj):
        if isinstance(rec, dict):
            _check_columns(f"{path} row {i + 1}", len(rec))
    bad = [i + 1 for i, rec in enumerate(obj) if not isinstance(rec, (dict, list))]
    if bad and not skip:
        rec = obj[bad[0] - 1]
        raise UserError(f"{path} row {bad[0]}: expected a JSON object, got {type(rec).__name__}{SKIP_HINT}")
    if bad:
        return Source(str(path), [rec for rec in obj if isinstance(rec, (dict, list))], skipped={NOT_OBJECT: bad})
    return Source(str(path), obj)


def _hf_error(path: Path, fmt: str, e: Exception) -> UserError:
    if isinstance(e, UnicodeDecodeError):
        return UserError(f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8")
    while type(e).__name__ == "DatasetGenerationError" and (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__  # the reader's own error (e.g. pandas' ParserError) says what is wrong
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return UserError(f"{path} could not be read as {fmt} ({type(e).__name__}: {first[:200]})")


def _read_hf_file(path: Path, fmt: str) -> Source:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its "Failed to read file" line would precede ours
    cache = str(_datasets_cache())
    try:
        if fmt == "parquet":
            _check_columns(str(path), _schema_width(path, fmt))
            ds = datasets.Dataset.from_parquet(str(path), cache_dir=cache)
        elif fmt == "csv":
            with open(path, encoding="utf-8-sig", newline="") as f:  # every column as text: '007' stays '007'
                header = next(csv.reader(f), [])
            _check_columns(str(path), len(header))
            features = datasets.Features({name: datasets.Value("string") for name in header})
            ds = datasets.Dataset.from_csv(str(path), cache_dir=cache, features=features, keep_default_na=False)
        else:  # arrow: an Arrow stream file such as save_to_disk writes
            _check_columns(str(path), _schema_width(path, fmt))
            ds = datasets.Dataset.from_file(str(path), in_memory=True)
    except UserError:
        raise
    except Exception as e:  # pyarrow/pandas raise many types for a malformed file
        raise _hf_error(path, fmt, e) from None
    return Source(str(path), ds.to_list())


def _schema_width(path: Path, fmt: str) -> int:
    """The columns of a parquet file or an Arrow stream, from its schema alone (no rows are read)."""
    import pyarrow as pa

    if fmt == "parquet":
        import pyarrow.parquet as pq

        return len(pq.read_schema(str(path)).names)
    with pa.memory_map(str(path)) as source:
        return len(pa.ipc.open_stream(source).schema.names)


def _datasets_cache() -> Path:
    from rlvr.models.loading import cache_dir

    return cache_dir() / "datasets"


def _read_saved(folder: Path, split: str, *, required: bool) -> list[Source]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(folder))
    except Exception as e:
        raise _hf_error(folder, "a save_to_disk dataset", e) from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            if not required:
                return []
            raise UserError(
                f"{folder} has no split '{split}' (it has: {', '.join(ds)}); set data.train_split / data.test_split"
            )
        _check_columns(f"{folder}[{split}]", len(ds[split].column_names))
        return [Source(f"{folder}[{split}]", ds[split].to_list())]
    if not required:
        return []
    _check_columns(str(folder), len(ds.column_names))
    return [Source(str(folder), ds.to_list())]


def read_file(path: Path, fmt: str = "auto", *, on_bad_row: str = "error", max_line_mib: int = MAX_LINE_MIB) -> Source:
    """All records of one file; with ``on_bad_row='skip'`` less the JSON(L) ones that are not objects.

    Raises:
        UserError: as :func:`read_sources`; a JSONL line over ``max_line_mib``; a row or schema of
            more than :data:`MAX_COLUMNS` columns.
    """
    if fmt == "auto":
        fmt = FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise UserError(
                f"{path}: unknown data format '{path.suffix or '(no extension)'}'; use one of "
                f"{', '.join(FORMATS)} or set data.format"
            )
    if fmt == "jsonl":
        return _read_jsonl(path, on_bad_row == "skip", max_line_mib)
    if fmt == "json":
        return _read_json(path, on_bad_row == "skip")
    return _read_hf_file(path, fmt)


def read_sources(
    spec: str,
    *,
    fmt: str = "auto",
    split: str = "train",
    required: bool = True,
    key: str = "data.path",
    on_bad_row: str = "error",
    max_line_mib: int = MAX_LINE_MIB,
) -> list[Source]:
    """Records of every file named by ``spec`` that belongs to ``split``.

    Args:
        spec: ``data.path`` / ``data.test_path``.
        fmt: ``data.format`` (auto = by file extension).
        split: the split wanted from ``save_to_disk`` dataset dicts and split-named files in folders.
        required: False when asking a train path for its test split: nothing found is not an error.
        on_bad_row: ``data.on_bad_row``; 'skip' leaves out JSONL lines that are not valid JSON and
            JSON(L) records that are not objects (see :attr:`Source.skipped`) instead of raising.
        max_line_mib: ``data.max_line_mib``, the longest JSONL line (:data:`MAX_LINE_MIB`).

    Raises:
        UserError: missing file, unknown format, unreadable or non-UTF-8 file, malformed JSON; a Hub
            data set that is neither cached nor downloadable, or lacks the config or split asked for;
            a JSONL line over ``max_line_mib``, a row of more than :data:`MAX_COLUMNS` columns.
    """
    how = dict(fmt=fmt, on_bad_row=on_bad_row, max_line_mib=max_line_mib)
    sources: list[Source] = []
    for path in _entries(spec, key):
        if isinstance(path, hub.Snapshot):
            sources += _read_snapshot(path, split, required=required, **how)
        elif path.is_dir():
            if _is_saved_dataset(path):
                sources += _read_saved(path, split, required=required)
                continue
            files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in FORMATS)
            if not files:
                raise UserError(f"{path} holds no data files ({', '.join(FORMATS)}) and is not a save_to_disk folder")
            named = [f for f in files if any(s in f.name.lower() for s in ("train", "test", "valid", "eval"))]
            if named:
                files = [f for f in files if split.lower() in f.name.lower()]
            elif not required:
                files = []
            sources += [read_file(f, **how) for f in files]
        elif required:  # a plain file holds only the split it was given for
            sources.append(read_file(path, **how))
    return sources


def _read_snapshot(
    snap: hub.Snapshot, split: str, *, required: bool, fmt: str, on_bad_row: str, max_line_mib: int
) -> list[Source]:
    """The records of ``split``'s files in a Hub data set's snapshot, as local files are read."""
    files = snap.splits.get(split)
    if files is None:
        if not required:
            return []
        only_test = "; a test set such as this one goes in data.test_path or eval.data" if split == "train" else ""
        raise UserError(
            f"the data set {snap.name} has no split '{split}' (it has: {', '.join(snap.splits) or 'none'}); "
            f"set data.train_split / data.test_split{only_test}"
        )
    how = dict(on_bad_row=on_bad_row, max_line_mib=max_line_mib)
    return [replace(read_file(f, fmt, **how), dataset=snap.name.repo) for f in files]


def stable_hash(obj) -> str:
    """sha256 of the JSON form of ``obj`` (keys sorted)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
