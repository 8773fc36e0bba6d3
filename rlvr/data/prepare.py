"""Preparation: render every prompt, count its tokens (in parallel), apply the length limit, cache.

The prepared rows are the loaded rows (see :mod:`rlvr.data.loading`) plus ``"prompt"`` (the
exact text the model sees) and ``"prompt_tokens"``. They are cached under
``$RLVR_CACHE/data/<key>`` (a ``datasets`` ``save_to_disk`` folder) where the key covers the
files (path, size, mtime), the mapping settings, the template and the tokenizer, so the next
run with the same inputs skips rendering and tokenising.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.data.files import stable_hash
from rlvr.data.loading import Split, _counts
from rlvr.data.templates import PromptTemplate, render, template_for
from rlvr.errors import UserError

_PARALLEL_MIN_ROWS = 2000  # below this, starting processes costs more than it saves


@dataclass
class Prepared:
    """Prepared rows of one split.

    Attributes:
        rows: rows with ``prompt`` and ``prompt_tokens`` added, in their final order.
        template: the resolved template (its ``assistant_prefix`` is what rewards must prepend).
        dropped: reason -> count (the split's own plus prompts over data.max_prompt_tokens).
        notes: lines for the user.
        cached: True when the rows came from the cache.
    """

    rows: list[dict]
    template: PromptTemplate
    dropped: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    cached: bool = False


def tokenizer_fingerprint(tokenizer) -> str:
    """What identifies a tokenizer for caching: class, source, vocabulary, specials, chat template, files."""
    src = getattr(tokenizer, "name_or_path", "") or ""
    files = []
    if src and Path(src).is_dir():
        files = [
            [f.name, f.stat().st_size, f.stat().st_mtime_ns]
            for f in sorted(Path(src).iterdir())
            if f.is_file() and "token" in f.name
        ]
    return stable_hash(
        [
            type(tokenizer).__name__,
            src,
            len(tokenizer),
            str(tokenizer.special_tokens_map),
            getattr(tokenizer, "chat_template", None),
            files,
        ]
    )


def _cache_root() -> Path:
    from rlvr.models.loading import cache_dir

    return cache_dir() / "data"


# Worker state: set in the parent before forking, so the tokenizer is never pickled.
_WORK: tuple | None = None


def _render_chunk(bounds: tuple[int, int]) -> tuple[list[str], list[int | None]]:
    tokenizer, template, rows, max_chars = _WORK
    lo, hi = bounds
    prompts = [render(tokenizer, template, r["question"], system=r["system"]) for r in rows[lo:hi]]
    counted = [p for p in prompts if not max_chars or len(p) <= max_chars]  # the others are surely too long
    ids = iter(tokenizer(counted, add_special_tokens=False)["input_ids"] if counted else [])
    return prompts, [len(next(ids)) if not max_chars or len(p) <= max_chars else None for p in prompts]


def chars_bound(tokenizer, tokens: int) -> int:
    """Characters beyond which a prompt is surely more than ``tokens`` tokens, known without tokenising it;
    0 = no such bound (``tokens`` 0, or a tokenizer that can map any length of text to one token).

    A tokenizer that encodes every byte (byte-level BPE, as GPT-2, Llama 3, Qwen and SmolLM have, or
    byte fallback, as Llama 2 and Mistral have) has no unknown token that could stand for a run of
    text: none of its tokens covers more characters than its longest vocabulary entry (``K``) has,
    so a prompt of ``c`` characters is at least ``c / K`` tokens. The bound is ``2 * K * tokens``, the
    2 leaving room for a normalizer that composes characters (NFC). A word-level tokenizer, or one with
    an unknown token, has no bound: its prompts are tokenised whole. So a prompt of 10^6 tokens is refused
    without being tokenised.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not tokens or backend is None:
        return 0
    pre = backend.pre_tokenizer
    byte_level = pre is not None and b'"ByteLevel"' in pre.__getstate__()
    if not (byte_level or getattr(backend.model, "byte_fallback", False)):
        return 0
    return 2 * tokens * max(map(len, tokenizer.get_vocab()), default=1)


def _default_signals() -> None:
    """A render worker's initializer: SIGTERM and SIGINT back to their defaults (a fork inherits the
    parent's Python handlers, which would let a worker outlive ``Pool.terminate``)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def render_all(
    rows: list[dict], tokenizer, template: PromptTemplate, *, num_workers: int = 0, max_chars: int = 0
) -> tuple[list[str], list[int | None]]:
    """Rendered prompts and their token counts for ``rows``, over ``num_workers`` processes (0 = per core, <= 8).

    A prompt of more than ``max_chars`` characters (:func:`chars_bound`; 0 = no bound) is not
    tokenised: its count is None."""
    global _WORK
    if not rows:
        return [], []
    render(tokenizer, template, rows[0]["question"], system=rows[0]["system"])  # template errors, in this process
    workers = num_workers or min(os.cpu_count() or 1, 8)
    if len(rows) < _PARALLEL_MIN_ROWS or "fork" not in multiprocessing.get_all_start_methods():
        workers = 1
    _WORK = (tokenizer, template, rows, max_chars)
    try:
        if workers == 1:
            return _render_chunk((0, len(rows)))
        step = -(-len(rows) // (workers * 4))
        chunks = [(lo, min(lo + step, len(rows))) for lo in range(0, len(rows), step)]
        # close + join, not the context manager's terminate(): the workers leave on their own once
        # the work is done. terminate() signals them, and a worker forked from a process that had a
        # Python SIGTERM handler (Ray's, a trainer's) ignored the signal and hung the join forever.
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_default_signals)
        try:
            parts = pool.map(_render_chunk, chunks)
            pool.close()
        except BaseException:
            pool.terminate()
            raise
        finally:
            pool.join()
        return [p for ps, _ in parts for p in ps], [c for _, cs in parts for c in cs]
    finally:
        _WORK = None


def _save(path: Path, rows: list[dict], meta: dict) -> None:
    import datasets

    datasets.disable_progress_bars()
    columns = {
        "question": [r["question"] for r in rows],
        "answer": [r["answer"] for r in rows],
        "system": [r["system"] for r in rows],
        "fields": [json.dumps(r["fields"], ensure_ascii=False) for r in rows],
        "prompt": [r["prompt"] for r in rows],
        "prompt_tokens": [r["prompt_tokens"] for r in rows],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tmp-"))
    try:
        features = datasets.Features(
            {k: datasets.Value("int64" if k == "prompt_tokens" else "string") for k in columns}
        )
        datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(tmp / "rows"))
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        tmp.replace(path)  # whole folder appears at once: a killed run never leaves half a cache
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(path: Path) -> tuple[list[dict], dict] | None:
    if not (path / "meta.json").is_file():
        return None
    import datasets

    try:
        ds = datasets.load_from_disk(str(path / "rows"))
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    except Exception:  # a damaged cache is rebuilt, never fatal
        return None
    cols = ds.to_dict()
    rows = [
        {"question": q, "answer": a, "system": s, "fields": json.loads(f), "prompt": p, "prompt_tokens": n}
        for q, a, s, f, p, n in zip(
            cols["question"], cols["answer"], cols["system"], cols["fields"], cols["prompt"], cols["prompt_tokens"]
        )
    ]
    return rows, meta


def prepare_rows(split: Split, data, tokenizer, *, use_cache: bool | None = None, context: int = 0) -> Prepared:
    """Render and tokenise ``split``'s rows for ``tokenizer``; drop or reject long prompts; cache.

    Args:
        split: from :func:`rlvr.data.loading.load_split`.
        data: the :class:`rlvr.config.DataConfig` (template, system prompt, prefix, length policy, workers).
        use_cache: override ``data.cache``.
        context: the model's context in tokens (:func:`rlvr.models.context_tokens`; 0 = unknown): a
            prompt longer than that is an error whatever ``data.on_long_prompt`` says, unless
            ``data.max_prompt_tokens`` drops it first.

    Raises:
        UserError: the template needs a chat template the tokenizer lacks; a prompt is longer than
            ``data.max_prompt_tokens`` with ``data.on_long_prompt=error``, or than ``context``.
    """
    template = template_for(data)
    use_cache = data.cache if use_cache is None else use_cache
    limit = data.max_prompt_tokens
    key = stable_hash(
        [split.key, template.__dict__, tokenizer_fingerprint(tokenizer), limit, data.on_long_prompt, context]
    )
    path = _cache_root() / key[:24]
    dropped = Counter(split.dropped)
    if use_cache and split.key and (hit := _load(path)) is not None:
        rows, meta = hit
        dropped.update(meta.get("dropped_long", {}))
        return Prepared(rows, template, dropped, list(split.notes), cached=True)

    first = limit if limit and (not context or limit <= context) else context  # the bound a prompt meets first
    max_chars = chars_bound(tokenizer, first)
    prompts, counts = render_all(split.rows, tokenizer, template, num_workers=data.num_workers, max_chars=max_chars)
    rows, long = _short_enough(split, prompts, counts, data, context, first)
    notes = list(split.notes)
    dropped_long = {f"prompt over {limit} tokens": long} if long else {}
    dropped.update(dropped_long)
    if long:
        notes.append(f"{split.name}: dropped {long} prompts over data.max_prompt_tokens={limit}")
    if split.rows and not rows:
        raise UserError(f"every {split.name} prompt is longer than data.max_prompt_tokens={limit}; raise it")
    if use_cache and split.key:
        try:
            _save(path, rows, {"dropped_long": dropped_long, "rows": len(rows)})
        except OSError as e:  # a read-only or full cache disk only costs time
            notes.append(f"could not write the data cache {path}: {e.strerror}")
    return Prepared(rows, template, dropped, notes)


def _short_enough(split: Split, prompts: list[str], counts: list, data, context: int, first: int):
    """(the rows with their prompts, the number dropped as longer than ``data.max_prompt_tokens``); a
    prompt over the model's ``context`` raises. A count of None: longer than ``first`` tokens, not counted."""
    limit = data.max_prompt_tokens
    rows, long = [], 0
    for i, (row, prompt, n) in enumerate(zip(split.rows, prompts, counts)):
        where = f"{split.name} row {i + 1}: the prompt is"
        starts = f"question starts {row['question'][:40]!r}"
        if (n is None and first == limit) or (limit and n is not None and n > limit):
            if data.on_long_prompt == "error":
                length = _length(prompt, n, f"data.max_prompt_tokens={limit}")
                raise UserError(f"{where} {length} ({starts}); raise the limit or set data.on_long_prompt=drop")
            long += 1
            continue
        if n is None or (context and n > context):
            length = _length(prompt, n, f"the model's context of {context:,} tokens")
            raise UserError(
                f"{where} {length} ({starts}); shorten or drop the row, "
                f"or set data.max_prompt_tokens to at most {context} to drop such prompts"
            )
        rows.append({**row, "prompt": prompt, "prompt_tokens": n})
    return rows, long


def _length(prompt: str, n: int | None, bound: str) -> str:
    """'N tokens, over BOUND', or for a prompt that was not counted (:func:`chars_bound`) 'C characters,
    more than BOUND can hold'."""
    return f"{n:,} tokens, over {bound}" if n is not None else f"{len(prompt):,} characters, more than {bound} can hold"


def prepare(data, tokenizer, split: str = "train", **kw) -> Prepared:
    """:func:`load_split` + :func:`prepare_rows`: the rows a run of ``data`` trains (or evaluates) on."""
    from rlvr.data.loading import load_split

    return prepare_rows(load_split(data, split), data, tokenizer, **kw)


def summary(prepared: Prepared) -> dict:
    """Counts and prompt-length percentiles (p50/p90/p99/max) for ``rlvr data stats``."""
    counts = sorted(r["prompt_tokens"] for r in prepared.rows)

    def pct(q: float) -> int:
        return counts[min(len(counts) - 1, int(q * len(counts)))] if counts else 0

    return {
        "rows": len(counts),
        "prompt_tokens": {
            "min": counts[0] if counts else 0,
            "p50": pct(0.5),
            "p90": pct(0.9),
            "p99": pct(0.99),
            "max": counts[-1] if counts else 0,
        },
        "dropped": dict(prepared.dropped),
        "dropped_summary": _counts(prepared.dropped),
    }
