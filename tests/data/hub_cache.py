"""A Hugging Face Hub cache built by hand, as ``snapshot_download`` leaves it, for tests without a network:
``HUB/datasets--ORG--NAME/{blobs/SHA256, snapshots/COMMIT/PATH -> ../../blobs/SHA256, refs/main}``."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path


def put_dataset(hub: Path, repo: str, files: dict[str, str | bytes], *, revision: str = "main") -> str:
    """Writes data set ``repo`` with ``files`` (path in the repo -> content) into the cache folder ``hub``
    as commit ``revision`` points to; returns the commit (40 hex digits, from the contents)."""
    root = Path(hub) / f"datasets--{repo.replace('/', '--')}"
    data = {path: content.encode() if isinstance(content, str) else content for path, content in files.items()}
    commit = hashlib.sha1(repr(sorted(data.items())).encode()).hexdigest()
    for path, content in data.items():
        blob = root / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = root / "snapshots" / commit / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    return commit


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def parquet(rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def gsm8k_rows(split: str, n: int = 3) -> list[dict]:
    return [
        {"question": f"{split} {i}: what is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
        for i in range(n)
    ]


GSM8K_CARD = """---
license: mit
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
  - split: test
    path: socratic/test-*
---
# GSM8K, as openai/gsm8k lays it out
"""


def gsm8k(hub: Path, repo: str = "openai/gsm8k") -> str:
    """openai/gsm8k's layout: a README whose ``configs:`` map main and socratic to parquet shards."""
    files: dict[str, str | bytes] = {"README.md": GSM8K_CARD}
    for config in ("main", "socratic"):
        for split in ("train", "test"):
            rows = [dict(r, question=f"{config} {r['question']}") for r in gsm8k_rows(split)]
            files[f"{config}/{split}-00000-of-00001.parquet"] = parquet(rows)
    return put_dataset(hub, repo, files)
